package zoop

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"slices"
	"strings"
	"time"
	"unicode"

	"github.com/paystream/paystream/internal/money"
	"github.com/paystream/paystream/internal/payment"
	"github.com/paystream/paystream/internal/provider"
)

// DefaultAPIBaseURL is Zoop's API, used by RefetchRequest when the source
// configures no api_base_url.
const DefaultAPIBaseURL = "https://api.zoop.ws"

var (
	_ provider.Refetcher      = (*Driver)(nil)
	_ provider.RefetchChecker = (*Driver)(nil)
)

// AlwaysRefetch reports that every Zoop event must be refetched (Zoop signs
// nothing), whatever the source's `refetch` setting. The sources loader
// looks for this method.
func (*Driver) AlwaysRefetch() bool { return true }

// RefetchRequest builds GET {baseURL}/v1/marketplaces/{marketplace_id}/
// transactions/{paymentID} with HTTP basic auth: the API key as user, an
// empty password, as Zoop's API expects. An empty baseURL means
// DefaultAPIBaseURL. Ids must be 1 to 64 letters, digits, '-' or '_'
// (Zoop's are 32 hexadecimal digits), so an id taken from an unsigned body
// can never steer the request to another path. Errors never include the
// key.
func (d *Driver) RefetchRequest(ctx context.Context, baseURL, token, paymentID string) (*http.Request, error) {
	if !validID(paymentID) {
		return nil, errors.New("zoop: refetch: transaction id must be 1 to 64 letters, digits, '-' or '_'")
	}
	switch {
	case token == "":
		return nil, errors.New("zoop: refetch: API key is empty")
	case strings.IndexFunc(token, func(r rune) bool { return unicode.IsControl(r) || r == ' ' || r == ':' }) >= 0:
		return nil, errors.New("zoop: refetch: API key contains spaces, colons or control characters (give the key alone: it is sent as the basic-auth user)")
	}
	req, err := provider.NewRefetchRequest(ctx, "zoop", cmp.Or(baseURL, DefaultAPIBaseURL), TransactionPath(d.marketplace, paymentID), "the API key is sent as basic auth")
	if err != nil {
		return nil, err
	}
	req.SetBasicAuth(token, "")
	return req, nil
}

// TransactionPath is the API path (and the resource's uri) of a transaction
// of a marketplace: /v1/marketplaces/{marketplaceID}/transactions/{id}.
func TransactionPath(marketplaceID, id string) string {
	return "/v1/marketplaces/" + marketplaceID + "/transactions/" + id
}

// Transaction statuses of Zoop's transaction resource.
const (
	apiNew           = "new"
	apiPending       = "pending"
	apiPreAuthorized = "pre_authorized"
	apiSucceeded     = "succeeded"
	apiFailed        = "failed"
	apiCanceled      = "canceled"
	apiReversed      = "reversed"
	apiRefunded      = "refunded"
	apiDispute       = "dispute"
	apiDisputed      = "disputed"
	apiChargedBack   = "charged_back"
)

// History operation types ParseRefetch reads; others (created, …) assert
// nothing about money.
const (
	opPreAuthorization = "pre_authorization"
	opAuthorization    = "authorization"
	opCapture          = "capture"
	opVoid             = "void"
	opRefund           = "refund"
)

// apiTransaction is the part of Zoop's transaction resource
// (GET /v1/marketplaces/{marketplace_id}/transactions/{id}) ParseRefetch
// reads. Amounts are decimal strings in reais ("1484.34").
type apiTransaction struct {
	ID        string          `json:"id"`
	Resource  string          `json:"resource"`
	Status    string          `json:"status"`
	Amount    provider.Amount `json:"amount"`
	Currency  string          `json:"currency"`
	Captured  *bool           `json:"captured"`
	URI       string          `json:"uri"`
	CreatedAt string          `json:"created_at"`
	UpdatedAt string          `json:"updated_at"`
	VoidedAt  string          `json:"voided_at"`
	History   []apiHistory    `json:"history"`
}

// apiHistory is one entry of the transaction's history: an operation
// (created, pre_authorization, authorization, capture, void, …) and its
// outcome.
type apiHistory struct {
	ID            string          `json:"id"`
	Transaction   string          `json:"transaction"`
	Amount        provider.Amount `json:"amount"`
	OperationType string          `json:"operation_type"`
	Status        string          `json:"status"`
	CreatedAt     string          `json:"created_at"`
}

// op is a succeeded history entry, read.
type op struct {
	id     string
	amount int64
	at     time.Time
}

// ParseRefetch normalizes Zoop's transaction resource into the facts it
// asserts, in the order they happened. It checks what the answer alone can
// tell — its uri names the driver's marketplace and the transaction's own
// id, and every history entry belongs to the transaction — but not that it
// is the transaction that was asked for: ParseRefetchFor does.
//
//	status                 facts
//	new, pending           pending (created_at)
//	pre_authorized         authorized: the pre_authorization's amount and time
//	failed                 failed (updated_at)
//	succeeded              paid, then one fact per refund
//	refunded               paid, the refunds, "refunded in full" (voided_at)
//	                       when they do not add up to the capture
//	canceled, reversed     captured: as refunded; not captured (a voided
//	                       authorization, a boleto never paid): canceled
//	dispute (disputed)     paid, the refunds, disputed (updated_at)
//	charged_back           paid, the refunds, disputed, dispute_lost
//
// The captured amount and time are the last succeeded capture (or, for
// one-step card payments, authorization) history entry's; without one
// (boleto, Pix, wallet), the transaction's amount at updated_at. A
// transaction is captured when its status says so, else per its captured
// flag, else when its history has such an entry. Each succeeded void or
// refund history entry of a captured transaction is a refund fact with
// RefundID = the entry's id and its amount (refunded for the one that
// completes the capture, partially_refunded otherwise); voids of a
// transaction never captured released an authorization and moved no money.
//
// Unusable answers are errors wrapping provider.ErrUnprocessable: an
// unknown status, a missing or non-positive amount, an amount that is a
// JSON number (Zoop sends decimal strings; a number's unit would be a
// guess), an unknown currency (default BRL), a missing created_at, a
// duplicate refund id, refunds adding up to more than the capture.
func (d *Driver) ParseRefetch(body []byte) ([]payment.Fact, error) {
	return d.parseTransaction(body, "")
}

// ParseRefetchFor is ParseRefetch for an answer to the request for
// transaction id: an answer about any other transaction (a misrouting
// proxy, a cache keyed wrongly, an API bug) is unprocessable rather than
// applied to the wrong payment.
func (d *Driver) ParseRefetchFor(id string, body []byte) ([]payment.Fact, error) {
	if id == "" {
		return nil, provider.Unprocessable("no transaction id to check the answer against")
	}
	return d.parseTransaction(body, id)
}

func (d *Driver) parseTransaction(body []byte, want string) ([]payment.Fact, error) {
	var tx apiTransaction
	if err := provider.DecodeJSON(body, &tx); err != nil {
		return nil, err
	}
	if err := provider.CheckID("id", tx.ID); err != nil {
		return nil, err
	}
	switch {
	case !validID(tx.ID):
		return nil, provider.Unprocessable("id is not a Zoop id")
	case want != "" && tx.ID != want:
		return nil, provider.Unprocessable("answer is about another transaction than the one asked for")
	case tx.Resource != "" && tx.Resource != "transaction":
		return nil, provider.Unprocessable("resource is not a transaction")
	case tx.URI != "" && tx.URI != TransactionPath(d.marketplace, tx.ID):
		return nil, provider.Unprocessable("uri names another marketplace or transaction")
	}
	switch tx.Status {
	case apiNew, apiPending, apiPreAuthorized, apiSucceeded, apiFailed, apiCanceled, apiReversed,
		apiRefunded, apiDispute, apiDisputed, apiChargedBack:
	case "":
		return nil, provider.Unprocessable("missing status")
	default:
		return nil, provider.Unprocessable("unknown status " + clip(tx.Status))
	}
	cur := "BRL"
	if tx.Currency != "" {
		c, err := provider.Currency(tx.Currency)
		if err != nil {
			return nil, err
		}
		cur = c
	}
	amount, err := decimal("amount", tx.Amount, cur)
	if err != nil {
		return nil, err
	}
	if amount == 0 {
		return nil, provider.Unprocessable("amount is zero")
	}
	if tx.CreatedAt == "" {
		return nil, provider.Unprocessable("missing created_at")
	}
	created, err := parseTime("created_at", tx.CreatedAt)
	if err != nil {
		return nil, err
	}
	updated, err := optionalTime("updated_at", tx.UpdatedAt)
	if err != nil {
		return nil, err
	}
	updated = cmp.Or(updated, created)
	voided, err := optionalTime("voided_at", tx.VoidedAt)
	if err != nil {
		return nil, err
	}
	voided = cmp.Or(voided, updated)

	var preAuth, capture *op
	var voids []op
	for i := range tx.History {
		h := &tx.History[i]
		if h.Transaction != "" && h.Transaction != tx.ID {
			return nil, provider.Unprocessable("history entry of another transaction")
		}
		if h.Status != "succeeded" {
			continue
		}
		switch h.OperationType {
		case opPreAuthorization, opAuthorization, opCapture, opVoid, opRefund:
		default:
			continue
		}
		v, err := decimal("history[].amount", h.Amount, cur)
		if err != nil {
			return nil, err
		}
		at, err := optionalTime("history[].created_at", h.CreatedAt)
		if err != nil {
			return nil, err
		}
		o := op{id: h.ID, amount: v, at: cmp.Or(at, updated)}
		switch h.OperationType {
		case opPreAuthorization:
			preAuth = &o
		case opAuthorization, opCapture:
			capture = &o
		default:
			if err := provider.CheckID("history[].id", o.id); err != nil {
				return nil, err
			}
			if o.amount == 0 {
				return nil, provider.Unprocessable("void of zero")
			}
			voids = append(voids, o)
		}
	}

	fact := func(s payment.Status, v int64, at time.Time) payment.Fact {
		return payment.Fact{Status: s, AmountMinor: v, Currency: cur, OccurredAt: at}
	}
	switch tx.Status {
	case apiNew, apiPending:
		return []payment.Fact{fact(payment.StatusPending, amount, created)}, nil
	case apiPreAuthorized:
		if preAuth != nil {
			return []payment.Fact{fact(payment.StatusAuthorized, cmp.Or(preAuth.amount, amount), preAuth.at)}, nil
		}
		return []payment.Fact{fact(payment.StatusAuthorized, amount, updated)}, nil
	case apiFailed:
		return []payment.Fact{fact(payment.StatusFailed, amount, updated)}, nil
	case apiCanceled, apiReversed:
		wasCaptured := capture != nil
		if tx.Captured != nil {
			wasCaptured = *tx.Captured
		}
		if !wasCaptured {
			return []payment.Fact{fact(payment.StatusCanceled, amount, voided)}, nil
		}
	}

	// Captured: paid, then what happened after it, in time order (ties keep
	// the order below: refunds, the full refund, the dispute, its outcome).
	paid := fact(payment.StatusPaid, amount, updated)
	if capture != nil {
		if capture.amount == 0 {
			return nil, provider.Unprocessable("capture of zero")
		}
		paid = fact(payment.StatusPaid, capture.amount, capture.at)
	}
	tail, refunded, err := refundFacts(voids, cur, paid.AmountMinor)
	if err != nil {
		return nil, err
	}
	switch tx.Status {
	case apiRefunded, apiCanceled, apiReversed:
		if refunded < paid.AmountMinor {
			tail = append(tail, payment.Fact{Status: payment.StatusRefunded, Currency: cur, OccurredAt: voided})
		}
	case apiDispute, apiDisputed:
		tail = append(tail, fact(payment.StatusDisputed, paid.AmountMinor, updated))
	case apiChargedBack:
		tail = append(tail, fact(payment.StatusDisputed, paid.AmountMinor, updated),
			fact(payment.StatusDisputeLost, paid.AmountMinor, updated))
	}
	slices.SortStableFunc(tail, func(a, b payment.Fact) int { return a.OccurredAt.Compare(b.OccurredAt) })
	return append([]payment.Fact{paid}, tail...), nil
}

// refundFacts turns the succeeded voids of a captured transaction into
// refund facts sorted by time (ties in history order), and returns their
// total.
func refundFacts(voids []op, cur string, captured int64) ([]payment.Fact, int64, error) {
	refunds := make([]provider.Refund, 0, len(voids))
	for _, v := range voids {
		refunds = append(refunds, provider.Refund{ID: v.id, AmountMinor: v.amount, At: v.at})
	}
	return provider.RefundFacts(refunds, cur, captured, "void", "voids add up to more than the capture")
}

// decimal reads one of Zoop's amounts: a JSON string holding a decimal in
// major units of cur ("1484.34"), exactly. A JSON number is refused: Zoop
// sends strings, and a number's unit (reais? centavos?) would be a guess.
func decimal(what string, a provider.Amount, cur string) (int64, error) {
	text := a.String()
	switch {
	case text == "":
		return 0, provider.Unprocessable("missing " + what)
	case !strings.HasPrefix(text, `"`):
		return 0, provider.Unprocessable(what + ": a JSON number, not Zoop's decimal string")
	}
	var s string
	if err := json.Unmarshal([]byte(text), &s); err != nil {
		return 0, provider.Unprocessable(what + ": bad string")
	}
	v, err := money.Parse(s, cur)
	if err != nil {
		return 0, provider.Unprocessable(what + ": " + err.Error())
	}
	if v > payment.MaxAmountMinor {
		return 0, provider.Unprocessable(what + ": above the largest amount a fact may carry")
	}
	return v, nil
}

// optionalTime is parseTime for a field that may be absent ("" or null):
// the zero time.
func optionalTime(what, s string) (time.Time, error) {
	if s == "" {
		return time.Time{}, nil
	}
	return parseTime(what, s)
}
