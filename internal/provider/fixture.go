package provider

import (
	"errors"
	"net/http"
	"time"
)

// FixtureKind is what one webhook of a Fixture says happened.
type FixtureKind string

// The kinds of fact a fixture webhook can tell.
const (
	FixtureCreated     FixtureKind = "created"
	FixtureAuthorized  FixtureKind = "authorized"
	FixturePaid        FixtureKind = "paid"
	FixtureFailed      FixtureKind = "failed"
	FixtureCanceled    FixtureKind = "canceled"
	FixtureRefund      FixtureKind = "refund"       // a refund with its own id and amount
	FixtureFullRefund  FixtureKind = "full_refund"  // "refunded in full", without a refund id
	FixtureDisputed    FixtureKind = "disputed"     // a dispute of the whole captured amount opens
	FixtureDisputeWon  FixtureKind = "dispute_won"  // the merchant won it
	FixtureDisputeLost FixtureKind = "dispute_lost" // the buyer won it
)

// Fixture is one webhook a gateway would send about a payment, in
// paystream's terms. Each driver package's Webhook function writes it in
// its gateway's own format and signs it, so that a gateway's format is
// written once, next to the code that parses it: tests, the load generator
// and the simulator all send what Webhook builds.
type Fixture struct {
	// Kind is the fact the webhook tells.
	Kind FixtureKind
	// Echo marks the gateway's second event for the same fact (Stripe's
	// charge.succeeded after payment_intent.succeeded, Asaas'
	// PAYMENT_RECEIVED after PAYMENT_CONFIRMED, Pagar.me's order.paid, Zoop's
	// transaction.capture.succeeded).
	Echo bool
	// EventID is the event's (or notification's) id, in the gateway's
	// style; drivers whose webhooks carry none ignore it.
	EventID string
	// PaymentID is the gateway's payment id, in its style.
	PaymentID string
	// AmountMinor is the payment's amount, in minor units of Currency.
	AmountMinor int64
	// StepMinor is the amount the fact is about: the refund's for a refund,
	// the captured amount for paid. Zero means AmountMinor.
	StepMinor int64
	// Currency is an ISO 4217 code. Defaults to BRL.
	Currency string
	// RefundID is a refund's id (FixtureRefund).
	RefundID string
	// RefundedMinor is what has been refunded so far, this refund included.
	RefundedMinor int64
	// At is when the fact happened.
	At time.Time
	// CreatedAt is when the payment was created (PagBank's created_at once
	// paid). Zero means At.
	CreatedAt time.Time
}

// Step returns StepMinor, or AmountMinor when it is zero.
func (f Fixture) Step() int64 {
	if f.StepMinor == 0 {
		return f.AmountMinor
	}
	return f.StepMinor
}

// Created returns CreatedAt, or At when it is zero.
func (f Fixture) Created() time.Time {
	if f.CreatedAt.IsZero() {
		return f.At
	}
	return f.CreatedAt
}

// Cur returns Currency, or BRL when it is empty.
func (f Fixture) Cur() string {
	if f.Currency == "" {
		return "BRL"
	}
	return f.Currency
}

// Webhook is a signed request as a gateway sends it to
// POST /webhooks/{source}.
type Webhook struct {
	// RawQuery is the encoded query string without '?': Mercado Pago's
	// data.id and type, Zoop's credential with auth: query; empty for the
	// others.
	RawQuery string
	// Header carries Content-Type and the signature headers.
	Header http.Header
	// Body is the webhook body.
	Body []byte
}

// FixtureFunc builds and signs the webhook of f as the gateway would at now,
// with the first usable secret of cfg (the one the gateway signs with) and
// cfg's options. Its errors wrap ErrNoFixture when the gateway sends no
// webhook for f, and never include a secret.
type FixtureFunc func(cfg Config, f Fixture, now time.Time) (*Webhook, error)

// ErrNoFixture marks a fact a gateway's webhooks cannot tell (an Asaas
// partial refund with its id, a PagBank dispute, …).
var ErrNoFixture = errors.New("the gateway sends no webhook for it")

// NewWebhook returns a Webhook with a JSON Content-Type and body.
func NewWebhook(body []byte) *Webhook {
	return &Webhook{Header: http.Header{"Content-Type": {"application/json"}}, Body: body}
}

// HeaderWebhook is the Webhook of body from a gateway that signs with its
// first secret (FirstSecret, naming driver) into one header: sign makes
// the header's value from the secret.
func HeaderWebhook(driver string, cfg Config, body []byte, header string, sign func(secret string) string) (*Webhook, error) {
	secret, err := FirstSecret(driver, cfg)
	if err != nil {
		return nil, err
	}
	w := NewWebhook(body)
	w.Header.Set(header, sign(secret))
	return w, nil
}

// FirstSecret returns cfg's first secret, or an error naming driver when
// there is none.
func FirstSecret(driver string, cfg Config) (string, error) {
	if len(cfg.Secrets) == 0 || cfg.Secrets[0] == "" {
		return "", errors.New(driver + ": no secret to sign with")
	}
	return cfg.Secrets[0], nil
}
