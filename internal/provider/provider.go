// Package provider defines the one real extension point of paystream: a
// Driver per payment gateway that verifies a webhook's authenticity on the raw
// request and normalizes its payload into an Event.
package provider

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"time"

	"github.com/paystream/paystream/internal/payment"
)

// Request is the raw webhook as received: headers, query string and the body
// byte-exact. Now is the time verification is judged against.
type Request struct {
	Header http.Header
	Query  url.Values
	Body   []byte
	Now    time.Time
}

// RequireHeader returns the header name that carries r's credential, or,
// when it is absent or empty, the *VerifyError ReasonMissingHeader naming
// it: the first check of most drivers' Verify.
func (r *Request) RequireHeader(name string) (string, error) {
	v := r.Header.Get(name)
	if v == "" {
		return "", Unauthentic(ReasonMissingHeader, name)
	}
	return v, nil
}

// Driver verifies and normalizes one gateway's webhooks.
type Driver interface {
	// Verify checks the request's authenticity on the raw bytes, in constant
	// time, before any parsing of the body. It returns a *VerifyError when the
	// request is not authentic.
	Verify(r *Request) error
	// Parse normalizes an authentic request. It returns an error wrapping
	// ErrUnprocessable (with a reason) when the payload is authentic but
	// cannot be turned into an Event: unknown type, missing payment id, bad
	// amount.
	Parse(r *Request) (Event, error)
}

// Config is what the sources file gives a driver.
type Config struct {
	// Secrets are the keys or tokens, resolved (env:/file: already read).
	// Several at once allow rotation: any one of them verifies.
	Secrets []string
	// Tolerance is the allowed clock skew for timestamped schemes. Zero means
	// the driver's default (5 minutes for the schemes that have one).
	Tolerance time.Duration
	// Account scopes payment keys and dedup keys for multi-account setups.
	Account string
	// Options holds driver-specific settings (for example the hmac driver's
	// header, algorithm, prefix, encoding, id_header).
	Options map[string]string
	// Refetch is set when the source is configured `refetch: true`: a
	// driver that implements Refetcher then marks every event it parses
	// NeedsRefetch, so the processor applies the gateway API's answer
	// rather than the webhook's body. Drivers that always refetch
	// (Mercado Pago) ignore it; the sources loader rejects `refetch: true`
	// for drivers that do not implement Refetcher.
	Refetch bool
}

// Factory builds a Driver from its Config, naming the bad field on error.
type Factory func(cfg Config) (Driver, error)

// Event is a normalized webhook: what paystream needs to route, deduplicate
// and apply it.
type Event struct {
	// EventID is the gateway's event id; empty when the gateway has none.
	EventID string `json:"event_id,omitempty"`
	// DedupKey identifies the event for deduplication within its source:
	// the event id where there is one, else a derived business key.
	DedupKey string `json:"dedup_key"`
	// PaymentID is the gateway's payment id (not yet scoped by source).
	PaymentID string `json:"payment_id"`
	// Type is the gateway's own event type, e.g. "PAYMENT_RECEIVED".
	Type string `json:"type"`
	// Fact is what the event asserts, normalized.
	Fact payment.Fact `json:"fact"`
	// NeedsRefetch marks events whose body is thin or unsigned: the payment's
	// state must be refetched from the gateway before money moves.
	NeedsRefetch bool `json:"needs_refetch,omitempty"`
}

// ErrUnprocessable marks an authentic payload that cannot be normalized.
var ErrUnprocessable = errors.New("unprocessable payload")

// Verification failure reasons, used as metric labels.
const (
	ReasonMissingHeader   = "missing_header"
	ReasonMalformedHeader = "malformed_header"
	ReasonBadSignature    = "bad_signature"
	ReasonTimestamp       = "timestamp_out_of_tolerance"
)

// VerifyError is returned by Driver.Verify for a request that is not
// authentic. Reason is one of the Reason constants.
type VerifyError struct {
	Reason string
	Detail string
}

// Error implements error.
func (e *VerifyError) Error() string {
	if e.Detail == "" {
		return "webhook not authentic: " + e.Reason
	}
	return "webhook not authentic: " + e.Reason + ": " + e.Detail
}

// ErrIrrelevant marks an authentic, well-formed payload that asserts nothing
// paystream tracks: a Stripe refund that failed, a Mercado Pago notification
// about another topic, a PagBank order with no charge yet. Errors wrapping it
// also wrap ErrUnprocessable, so a caller that does not know it dead-letters
// such events (the safe default); a caller that does should acknowledge them
// and record them as ignored instead.
var ErrIrrelevant = errors.New("event carries no payment fact")

// Irrelevant returns an error wrapping both ErrUnprocessable and
// ErrIrrelevant with a short reason.
func Irrelevant(reason string) error {
	return fmt.Errorf("%w: %w: %s", ErrUnprocessable, ErrIrrelevant, reason)
}

// Refetcher is implemented by drivers whose webhooks are thin or unsigned
// (Mercado Pago signs no body; any source configured `refetch: true`): the
// processor asks the gateway's API for the payment's current state, outside
// any database transaction, and applies what the API says instead of what
// the webhook said.
type Refetcher interface {
	// RefetchRequest builds the API request for one payment. baseURL is the
	// gateway API's base URL from the sources file (tests point it at a
	// local server playing the gateway); token is the API credential.
	RefetchRequest(ctx context.Context, baseURL, token, paymentID string) (*http.Request, error)
	// ParseRefetch turns the API's answer into the facts it asserts, in the
	// order they happened (for example paid, then each refund). Errors wrap
	// ErrUnprocessable when the answer is well-formed but unusable.
	ParseRefetch(body []byte) ([]payment.Fact, error)
}

// RefetchChecker is implemented by Refetchers whose API answers name the
// payment they describe: ParseRefetchFor is ParseRefetch that also refuses
// (as unprocessable) an answer about any payment other than paymentID, the
// id the request asked for, so a misrouting proxy, a wrongly keyed cache or
// an API bug cannot move another payment's money. The processor prefers it
// to ParseRefetch when a driver has it.
type RefetchChecker interface {
	ParseRefetchFor(paymentID string, body []byte) ([]payment.Fact, error)
}
