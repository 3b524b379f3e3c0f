package mercadopago

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/paystream/paystream/internal/payment"
	"github.com/paystream/paystream/internal/provider"
)

// DefaultAPIBaseURL is Mercado Pago's API, used by RefetchRequest when the
// source configures no api_base_url.
const DefaultAPIBaseURL = "https://api.mercadopago.com"

var (
	_ provider.Refetcher      = (*Driver)(nil)
	_ provider.RefetchChecker = (*Driver)(nil)
)

// AlwaysRefetch reports that every Mercado Pago event must be refetched (the
// body is not signed), whatever the source's `refetch` setting. The sources
// loader looks for this method to enable refetching without `refetch: true`.
func (*Driver) AlwaysRefetch() bool { return true }

// RefetchRequest builds GET {baseURL}/v1/payments/{paymentID} with
// "Authorization: Bearer {token}", token being the application's access
// token. An empty baseURL means DefaultAPIBaseURL. Mercado Pago payment ids
// are integers: any other id is rejected, so an id taken from an unsigned
// body can never steer the request to another API path.
func (d *Driver) RefetchRequest(ctx context.Context, baseURL, token, paymentID string) (*http.Request, error) {
	if paymentID == "" || len(paymentID) > 20 || strings.TrimLeft(paymentID, "0123456789") != "" {
		return nil, errors.New("mercadopago: refetch: payment id must be 1 to 20 digits")
	}
	return provider.NewBearerRefetchRequest(ctx, "mercadopago", "access token", token,
		cmp.Or(baseURL, DefaultAPIBaseURL), "/v1/payments/"+paymentID)
}

// Payment statuses of Mercado Pago's payment resource.
const (
	apiPending     = "pending"
	apiInProcess   = "in_process"
	apiAuthorized  = "authorized"
	apiApproved    = "approved"
	apiRejected    = "rejected"
	apiCancelled   = "cancelled"
	apiRefunded    = "refunded"
	apiInMediation = "in_mediation"
	apiChargedBack = "charged_back"
)

// Chargeback outcomes, in status_detail of a charged_back payment.
const (
	detailChargebackOpen = "in_process" // chargeback under review
	detailChargebackLost = "settled"    // money retained from the seller
	detailChargebackWon  = "reimbursed" // money given back to the seller
)

// apiPayment is the part of Mercado Pago's payment resource
// (GET /v1/payments/{id}) that ParseRefetch reads. Amounts are decimals in
// major units of currency_id; json.Number keeps their text exact.
type apiPayment struct {
	ID                        json.RawMessage `json:"id"`
	Status                    string          `json:"status"`
	StatusDetail              string          `json:"status_detail"`
	CurrencyID                string          `json:"currency_id"`
	TransactionAmount         provider.Amount `json:"transaction_amount"`
	TransactionAmountRefunded provider.Amount `json:"transaction_amount_refunded"`
	DateCreated               string          `json:"date_created"`
	DateApproved              string          `json:"date_approved"`
	DateLastUpdated           string          `json:"date_last_updated"`
	Refunds                   []apiRefund     `json:"refunds"`
}

// apiRefund is one entry of the payment's refunds[].
type apiRefund struct {
	ID          json.RawMessage `json:"id"`
	Amount      provider.Amount `json:"amount"`
	Status      string          `json:"status"`
	DateCreated string          `json:"date_created"`
}

// ParseRefetch normalizes Mercado Pago's payment resource into the facts it
// asserts, in the order they happened. The amount is transaction_amount
// (decimal in major units of currency_id, parsed exactly); every fact
// carries the currency.
//
//	status        facts
//	pending,      pending (date_created)
//	in_process
//	authorized    authorized (date_last_updated)
//	rejected      failed (date_last_updated)
//	cancelled     canceled (date_last_updated)
//	approved      paid (date_approved), then one fact per refund
//	refunded      paid, the refunds, and "refunded in full" when the
//	              refunds listed do not add up to transaction_amount
//	in_mediation  paid, the refunds, disputed (date_last_updated)
//	charged_back  paid, the refunds, disputed, then by status_detail:
//	              settled (or none) dispute_lost, reimbursed dispute_won,
//	              in_process (or any other) nothing more: still open
//
// Each refund whose status is approved (or absent) is a fact with RefundID =
// its id and AmountMinor = its amount at its date_created: refunded for the
// one that completes transaction_amount, partially_refunded otherwise.
// Refunds in other states (in_process, rejected, cancelled) moved no money
// and are left out. A missing date falls back to date_last_updated, then
// date_created.
//
// The answer is checked for consistency, and unusable answers are errors
// wrapping provider.ErrUnprocessable rather than facts the machine would
// ignore: an unknown status, a missing or non-positive transaction_amount, a
// missing or unknown currency, refunds on a payment never approved, a
// duplicate refund id, refunds adding up to more than transaction_amount,
// or (for approved and refunded payments) a transaction_amount_refunded
// different from what the refunds listed add up to.
func (d *Driver) ParseRefetch(body []byte) ([]payment.Fact, error) {
	return parsePayment(body, "")
}

// ParseRefetchFor is ParseRefetch for the answer to the request for payment
// id: an answer whose id is another payment's (a misrouting proxy, a cache
// keyed wrongly, an API bug) is unprocessable rather than applied to the
// wrong payment. Ids are integers, compared as such ("0123" is 123).
func (d *Driver) ParseRefetchFor(id string, body []byte) ([]payment.Fact, error) {
	if id == "" {
		return nil, provider.Unprocessable("no payment id to check the answer against")
	}
	return parsePayment(body, id)
}

// parsePayment parses a payment resource; wantID, when not empty, is the id
// the answer must have.
func parsePayment(body []byte, wantID string) ([]payment.Fact, error) {
	var p apiPayment
	if err := provider.DecodeJSON(body, &p); err != nil {
		return nil, err
	}
	id := numericID(p.ID)
	if err := provider.CheckID("id", id); err != nil {
		return nil, err
	}
	if wantID != "" && canonicalID(id) != canonicalID(wantID) {
		return nil, provider.Unprocessable("answer is about another payment than the one asked for")
	}
	switch p.Status {
	case apiPending, apiInProcess, apiAuthorized, apiApproved, apiRejected, apiCancelled,
		apiRefunded, apiInMediation, apiChargedBack:
	case "":
		return nil, provider.Unprocessable("missing status")
	default:
		return nil, provider.Unprocessable("unknown status " + clip(p.Status))
	}
	if p.CurrencyID == "" {
		return nil, provider.Unprocessable("missing currency_id")
	}
	cur, err := provider.Currency(p.CurrencyID)
	if err != nil {
		return nil, err
	}
	if p.TransactionAmount == "" {
		return nil, provider.Unprocessable("missing transaction_amount")
	}
	amount, err := provider.AmountMajor(p.TransactionAmount, cur)
	if err != nil {
		return nil, err
	}
	if amount == 0 {
		return nil, provider.Unprocessable("transaction_amount is zero")
	}
	created, err := provider.RequiredRefetchTime("date_created", p.DateCreated)
	if err != nil {
		return nil, err
	}
	approved, err := provider.RefetchTime("date_approved", p.DateApproved)
	if err != nil {
		return nil, err
	}
	updated, err := provider.RefetchTime("date_last_updated", p.DateLastUpdated)
	if err != nil {
		return nil, err
	}
	updated = cmp.Or(updated, created)

	fact := func(s payment.Status, at time.Time) payment.Fact {
		return payment.Fact{Status: s, AmountMinor: amount, Currency: cur, OccurredAt: at}
	}
	refunds, refunded, err := parseRefunds(p.Refunds, cur, amount, updated)
	if err != nil {
		return nil, err
	}
	paid := p.Status == apiApproved || p.Status == apiRefunded || p.Status == apiInMediation || p.Status == apiChargedBack
	if !paid && len(refunds) > 0 {
		return nil, provider.Unprocessable("refunds on a payment that is not approved")
	}
	want := refunded
	fullRefund := p.Status == apiRefunded && refunded < amount
	if fullRefund {
		want = amount
	}
	// transaction_amount_refunded is cross-checked where it can only count
	// refunds (approved, refunded); a mediation or chargeback may move
	// money that is not a refund.
	if p.TransactionAmountRefunded != "" && (p.Status == apiApproved || p.Status == apiRefunded) {
		v, err := provider.AmountMajor(p.TransactionAmountRefunded, cur)
		if err != nil {
			return nil, provider.Unprocessable("transaction_amount_refunded: " + err.Error())
		}
		if v != want {
			return nil, provider.Unprocessable("transaction_amount_refunded disagrees with the refunds listed")
		}
	}

	switch p.Status {
	case apiPending, apiInProcess:
		return []payment.Fact{fact(payment.StatusPending, created)}, nil
	case apiAuthorized:
		return []payment.Fact{fact(payment.StatusAuthorized, updated)}, nil
	case apiRejected:
		return []payment.Fact{fact(payment.StatusFailed, updated)}, nil
	case apiCancelled:
		return []payment.Fact{fact(payment.StatusCanceled, updated)}, nil
	}

	// Paid, then what happened after it, in time order (ties keep the
	// order below: refunds, the full refund, the dispute, its outcome).
	tail := refunds
	if fullRefund {
		tail = append(tail, payment.Fact{Status: payment.StatusRefunded, Currency: cur, OccurredAt: updated})
	}
	switch p.Status {
	case apiInMediation:
		tail = append(tail, fact(payment.StatusDisputed, updated))
	case apiChargedBack:
		tail = append(tail, fact(payment.StatusDisputed, updated))
		switch p.StatusDetail {
		case detailChargebackLost, "":
			tail = append(tail, fact(payment.StatusDisputeLost, updated))
		case detailChargebackWon:
			tail = append(tail, fact(payment.StatusDisputeWon, updated))
		case detailChargebackOpen:
		default:
			// An outcome this driver does not know: keep the dispute
			// open (money held in reserve) rather than guess.
		}
	}
	slices.SortStableFunc(tail, func(a, b payment.Fact) int { return a.OccurredAt.Compare(b.OccurredAt) })
	return append([]payment.Fact{fact(payment.StatusPaid, cmp.Or(approved, updated))}, tail...), nil
}

// parseRefunds turns the approved refunds into refund facts sorted by
// date_created (ties in list order), and returns their total.
func parseRefunds(in []apiRefund, cur string, amount int64, fallback time.Time) ([]payment.Fact, int64, error) {
	var refunds []provider.Refund
	for _, r := range in {
		if r.Status != "" && r.Status != "approved" {
			continue
		}
		if r.Amount == "" {
			return nil, 0, provider.Unprocessable("refund without amount")
		}
		v, err := provider.AmountMajor(r.Amount, cur)
		if err != nil {
			return nil, 0, provider.Unprocessable("refunds[].amount: " + err.Error())
		}
		at, err := provider.RefetchTime("refunds[].date_created", r.DateCreated)
		if err != nil {
			return nil, 0, err
		}
		refunds = append(refunds, provider.Refund{ID: numericID(r.ID), AmountMinor: v, At: cmp.Or(at, fallback)})
	}
	return provider.RefundFacts(refunds, cur, amount, "refund", "refunds add up to more than transaction_amount")
}

// numericID reads an id Mercado Pago sends as a JSON integer (or, in some
// resources, a string). A number that is not a plain non-negative integer
// gives "".
func numericID(raw json.RawMessage) string {
	var s string
	if json.Unmarshal(raw, &s) == nil {
		return s
	}
	var n json.Number
	if json.Unmarshal(raw, &n) != nil {
		return ""
	}
	if t := n.String(); t != "" && strings.TrimLeft(t, "0123456789") == "" {
		return t
	}
	return ""
}

// canonicalID is a numeric id without leading zeros ("0" for zero), so that
// ids naming the same integer compare equal. Ids that are not numeric are
// returned as they are.
func canonicalID(id string) string {
	if id == "" || strings.TrimLeft(id, "0123456789") != "" {
		return id
	}
	return cmp.Or(strings.TrimLeft(id, "0"), "0")
}
