package standardwebhooks

import (
	"cmp"
	"context"
	"errors"
	"net/http"
	"net/url"
	"slices"
	"time"

	"github.com/paystream/paystream/internal/payment"
	"github.com/paystream/paystream/internal/provider"
)

var (
	_ provider.Refetcher      = (*Driver)(nil)
	_ provider.RefetchChecker = (*Driver)(nil)
)

// RefetchRequest builds the request of paystream's generic refetch
// convention: GET {baseURL}/payments/{paymentID} with "Authorization: Bearer
// {token}" and "Accept: application/json". baseURL is required (there is no
// default gateway); paymentID is path-escaped, and "." and ".." are
// rejected, so an id can never steer the request to another API path.
func (d *Driver) RefetchRequest(ctx context.Context, baseURL, token, paymentID string) (*http.Request, error) {
	if err := provider.CheckID("payment id", paymentID); err != nil || paymentID == "." || paymentID == ".." {
		return nil, errors.New("standardwebhooks: refetch: payment id is not usable in a URL")
	}
	return provider.NewBearerRefetchRequest(ctx, "standardwebhooks", "token", token,
		baseURL, "/payments/"+url.PathEscape(paymentID))
}

// RefetchPayment is the answer of paystream's generic refetch convention, a
// payment's current state:
//
//	{"payment_id": "pay_8Jd2kQ", "status": "partially_refunded",
//	 "amount": 25990, "currency": "BRL",
//	 "paid_at": "2024-06-12T19:45:00Z", "updated_at": "2024-06-14T10:00:00Z",
//	 "refunds": [{"id": "rf_1", "amount": 990, "created_at": "2024-06-14T10:00:00Z"}]}
//
// Amounts are JSON integers in minor units of currency.
type RefetchPayment struct {
	// PaymentID is the sender's payment id. Required.
	PaymentID string `json:"payment_id"`
	// Status is a normalized status (payment.Status): pending, authorized,
	// paid, failed, canceled, partially_refunded, refunded, disputed,
	// dispute_won, dispute_lost. Required.
	Status string `json:"status"`
	// Amount is the payment's amount (once paid, the captured amount).
	// Required, and positive, from paid on.
	Amount provider.Amount `json:"amount"`
	// Currency is an ISO 4217 code; required with an amount.
	Currency string `json:"currency"`
	// PaidAt is when the payment was paid, RFC 3339. Optional: UpdatedAt
	// when absent.
	PaidAt string `json:"paid_at"`
	// UpdatedAt is when the payment last changed, RFC 3339. Required.
	UpdatedAt string `json:"updated_at"`
	// Refunds are the refunds that moved money, each with its own id.
	Refunds []RefetchRefund `json:"refunds"`
}

// RefetchRefund is one refund of a RefetchPayment.
type RefetchRefund struct {
	// ID identifies the refund. Required, unique within the payment.
	ID string `json:"id"`
	// Amount is the refund's amount in minor units. Required, positive.
	Amount provider.Amount `json:"amount"`
	// CreatedAt is when the refund was made, RFC 3339. Required.
	CreatedAt string `json:"created_at"`
}

// ParseRefetch normalizes a RefetchPayment into the facts it asserts, in the
// order they happened:
//
//	status               facts
//	pending, authorized, that status (updated_at), with the amount and
//	failed, canceled     currency when given
//	paid                 paid (paid_at), then one fact per refund listed
//	partially_refunded   paid, then the refunds (at least one required)
//	refunded             paid, the refunds, and "refunded in full"
//	                     (updated_at) when they do not add up to amount
//	disputed             paid, the refunds, disputed (amount, updated_at)
//	dispute_won/_lost    paid, the refunds, disputed, then the outcome
//
// Each refund is a fact with RefundID = its id and AmountMinor = its amount,
// at created_at: refunded for the one that completes the amount,
// partially_refunded otherwise. Refunds are sorted by created_at; the
// dispute facts take their place among them by updated_at.
//
// Unusable answers are errors wrapping provider.ErrUnprocessable: an
// unknown status, a missing payment_id or updated_at, an amount without
// currency, a paid (or later) payment without a positive amount, refunds on
// a payment not paid, a partially_refunded payment without refunds, a
// duplicate refund id, or refunds adding up to more than the amount.
func (d *Driver) ParseRefetch(body []byte) ([]payment.Fact, error) {
	return ParseRefetchPayment(body)
}

// ParseRefetchFor is ParseRefetch for the answer to the request for
// paymentID: an answer whose payment_id is another payment's (a misrouting
// proxy, a cache keyed wrongly, an API bug) is unprocessable rather than
// applied to the wrong payment. Ids are compared exactly.
func (d *Driver) ParseRefetchFor(paymentID string, body []byte) ([]payment.Fact, error) {
	if paymentID == "" {
		return nil, provider.Unprocessable("no payment id to check the answer against")
	}
	return parseRefetchPayment(body, paymentID)
}

// ParseRefetchPayment is Driver.ParseRefetch, for senders that follow the
// convention without the Standard Webhooks transport.
func ParseRefetchPayment(body []byte) ([]payment.Fact, error) {
	return parseRefetchPayment(body, "")
}

// parseRefetchPayment parses an answer of the convention; want, when not
// empty, is the payment_id it must have.
func parseRefetchPayment(body []byte, want string) ([]payment.Fact, error) {
	var p RefetchPayment
	if err := provider.DecodeJSON(body, &p); err != nil {
		return nil, err
	}
	if err := provider.CheckID("payment_id", p.PaymentID); err != nil {
		return nil, err
	}
	if want != "" && p.PaymentID != want {
		return nil, provider.Unprocessable("answer is about another payment than the one asked for")
	}
	status := payment.Status(p.Status)
	paid := false
	switch status {
	case payment.StatusPending, payment.StatusAuthorized, payment.StatusFailed, payment.StatusCanceled:
	case payment.StatusPaid, payment.StatusPartiallyRefunded, payment.StatusRefunded,
		payment.StatusDisputed, payment.StatusDisputeWon, payment.StatusDisputeLost:
		paid = true
	case "":
		return nil, provider.Unprocessable("missing status")
	default:
		return nil, provider.Unprocessable("unknown status")
	}
	updated, err := provider.RequiredRefetchTime("updated_at", p.UpdatedAt)
	if err != nil {
		return nil, err
	}
	paidAt, err := provider.RefetchTime("paid_at", p.PaidAt)
	if err != nil {
		return nil, err
	}
	var cur string
	if p.Currency != "" {
		if cur, err = provider.Currency(p.Currency); err != nil {
			return nil, err
		}
	}
	var amount int64
	if p.Amount != "" {
		if amount, err = provider.FactAmountMinor(p.Amount, cur); err != nil {
			return nil, err
		}
	}
	fact := func(s payment.Status, at time.Time) payment.Fact {
		return payment.Fact{Status: s, AmountMinor: amount, Currency: cur, OccurredAt: at}
	}
	if !paid {
		if len(p.Refunds) > 0 {
			return nil, provider.Unprocessable("refunds on a payment that is not paid")
		}
		return []payment.Fact{fact(status, updated)}, nil
	}
	if amount == 0 {
		return nil, provider.Unprocessable("missing or zero amount on a paid payment")
	}

	refunds, total, err := parseRefetchRefunds(p.Refunds, cur, amount)
	if err != nil {
		return nil, err
	}
	if status == payment.StatusPartiallyRefunded && len(refunds) == 0 {
		return nil, provider.Unprocessable("partially_refunded without refunds")
	}
	tail := refunds
	if status == payment.StatusRefunded && total < amount {
		tail = append(tail, payment.Fact{Status: payment.StatusRefunded, Currency: cur, OccurredAt: updated})
	}
	switch status {
	case payment.StatusDisputed:
		tail = append(tail, fact(payment.StatusDisputed, updated))
	case payment.StatusDisputeWon, payment.StatusDisputeLost:
		tail = append(tail, fact(payment.StatusDisputed, updated), fact(status, updated))
	}
	slices.SortStableFunc(tail, func(a, b payment.Fact) int { return a.OccurredAt.Compare(b.OccurredAt) })
	return append([]payment.Fact{fact(payment.StatusPaid, cmp.Or(paidAt, updated))}, tail...), nil
}

// parseRefetchRefunds turns refunds into refund facts sorted by created_at
// (ties in list order), and returns their total.
func parseRefetchRefunds(in []RefetchRefund, cur string, amount int64) ([]payment.Fact, int64, error) {
	refunds := make([]provider.Refund, 0, len(in))
	for _, r := range in {
		if r.Amount == "" {
			return nil, 0, provider.Unprocessable("refund without amount")
		}
		v, err := provider.AmountMinor(r.Amount)
		if err != nil {
			return nil, 0, err
		}
		at, err := provider.RefetchTime("refunds[].created_at", r.CreatedAt)
		if err != nil {
			return nil, 0, err
		}
		if at.IsZero() {
			return nil, 0, provider.Unprocessable("refund without created_at")
		}
		refunds = append(refunds, provider.Refund{ID: r.ID, AmountMinor: v, At: at})
	}
	return provider.RefundFacts(refunds, cur, amount, "refund", "refunds add up to more than the amount")
}
