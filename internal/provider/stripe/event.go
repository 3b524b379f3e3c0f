package stripe

import (
	"encoding/json"
	"strings"

	"github.com/paystream/paystream/internal/payment"
	"github.com/paystream/paystream/internal/provider"
)

// event is the part of a Stripe event paystream reads.
type event struct {
	ID      string      `json:"id"`
	Object  string      `json:"object"`
	Type    string      `json:"type"`
	Created json.Number `json:"created"`
	Data    struct {
		Object object `json:"object"`
	} `json:"data"`
}

// object is the union of the PaymentIntent, Charge, Refund and Dispute
// fields paystream reads.
type object struct {
	ID               string          `json:"id"`
	Object           string          `json:"object"`
	Amount           provider.Amount `json:"amount"`
	AmountReceived   provider.Amount `json:"amount_received"`
	AmountCapturable provider.Amount `json:"amount_capturable"`
	AmountCaptured   provider.Amount `json:"amount_captured"`
	AmountRefunded   provider.Amount `json:"amount_refunded"`
	Captured         *bool           `json:"captured"`
	Currency         string          `json:"currency"`
	Status           string          `json:"status"`
	PaymentIntent    *string         `json:"payment_intent"`
	Charge           *string         `json:"charge"`
	Refunded         *bool           `json:"refunded"`
}

// Statuses maps the Stripe event types the driver understands to the
// status each asserts. Types whose status depends on the object
// (charge.succeeded, charge.refunded, charge.dispute.closed, refunds) are
// resolved in Parse; they map to the most common outcome here, for docs.
var Statuses = map[string]payment.Status{
	"payment_intent.created":                   payment.StatusPending,
	"payment_intent.processing":                payment.StatusPending,
	"payment_intent.requires_action":           payment.StatusPending,
	"payment_intent.amount_capturable_updated": payment.StatusAuthorized,
	"payment_intent.succeeded":                 payment.StatusPaid,
	"payment_intent.payment_failed":            payment.StatusFailed,
	"payment_intent.canceled":                  payment.StatusCanceled,
	"charge.pending":                           payment.StatusPending,
	"charge.succeeded":                         payment.StatusPaid, // authorized when captured is false
	"charge.captured":                          payment.StatusPaid,
	"charge.failed":                            payment.StatusFailed,
	"charge.refunded":                          payment.StatusRefunded, // partially_refunded when amount_refunded < amount
	"charge.refund.updated":                    payment.StatusPartiallyRefunded,
	"refund.created":                           payment.StatusPartiallyRefunded,
	"refund.updated":                           payment.StatusPartiallyRefunded,
	"charge.dispute.created":                   payment.StatusDisputed,
	"charge.dispute.funds_withdrawn":           payment.StatusDisputed,
	"charge.dispute.funds_reinstated":          payment.StatusDisputeWon,
	"charge.dispute.closed":                    payment.StatusDisputeLost, // dispute_won when status is won or warning_closed
}

// Parse normalizes a Stripe event. EventID and DedupKey are the event id
// (evt_…); PaymentID is the PaymentIntent id (the object's own id for
// payment_intent.* events, its payment_intent for charges, refunds and
// disputes, falling back to the charge id for charges made without a
// PaymentIntent).
func (d *Driver) Parse(r *provider.Request) (provider.Event, error) {
	var e event
	if err := provider.DecodeJSON(r.Body, &e); err != nil {
		return provider.Event{}, err
	}
	if err := provider.CheckID("event id", e.ID); err != nil {
		return provider.Event{}, err
	}
	status, err := provider.LookupStatus(Statuses, "type", e.Type)
	if err != nil {
		return provider.Event{}, err
	}
	created, err := parseUnix(e.Created.String())
	if err != nil {
		return provider.Event{}, provider.Unprocessable("bad created")
	}
	if err := provider.CheckTime("created", created); err != nil {
		return provider.Event{}, err
	}
	o := e.Data.Object
	fact := payment.Fact{Status: status, OccurredAt: created.UTC()}
	if o.Currency != "" {
		if fact.Currency, err = provider.Currency(o.Currency); err != nil {
			return provider.Event{}, err
		}
	}
	amount := o.Amount
	paymentID := o.ID
	if !strings.HasPrefix(e.Type, "payment_intent.") {
		paymentID = deref(o.PaymentIntent)
		if paymentID == "" {
			// A charge made without a PaymentIntent (legacy Charges API):
			// the charge is the payment.
			paymentID = deref(o.Charge)
			if o.Object == "charge" {
				paymentID = o.ID
			}
		}
	}

	switch e.Type {
	case "payment_intent.succeeded":
		amount = first(o.AmountReceived, o.Amount)
	case "payment_intent.amount_capturable_updated":
		amount = first(o.AmountCapturable, o.Amount)
	case "charge.succeeded":
		if o.Captured != nil && !*o.Captured {
			fact.Status = payment.StatusAuthorized
		} else {
			amount = first(o.AmountCaptured, o.Amount)
		}
	case "charge.captured":
		amount = first(o.AmountCaptured, o.Amount)
	case "charge.refunded":
		// A refunded charge without refund ids: "refunded in full" when
		// everything captured came back, else a partial refund whose ids
		// arrive with the refund.* events.
		if o.AmountRefunded == "" {
			return provider.Event{}, provider.Unprocessable("charge.refunded without amount_refunded")
		}
		refunded, err := provider.AmountMinor(o.AmountRefunded)
		if err != nil {
			return provider.Event{}, err
		}
		total, err := provider.AmountMinor(first(o.AmountCaptured, o.Amount))
		if err != nil {
			return provider.Event{}, err
		}
		if refunded < total && (o.Refunded == nil || !*o.Refunded) {
			fact.Status = payment.StatusPartiallyRefunded
		}
		amount = o.AmountRefunded
	case "charge.refund.updated", "refund.created", "refund.updated":
		if o.Object != "" && o.Object != "refund" {
			return provider.Event{}, provider.Unprocessable("refund event without a refund object")
		}
		if o.Status != "succeeded" {
			return provider.Event{}, provider.Irrelevant("refund status " + o.Status)
		}
		if err := provider.CheckID("refund id", o.ID); err != nil {
			return provider.Event{}, err
		}
		fact.RefundID = o.ID
	case "charge.dispute.closed":
		switch o.Status {
		case "won", "warning_closed":
			fact.Status = payment.StatusDisputeWon
		case "lost":
			fact.Status = payment.StatusDisputeLost
		default:
			return provider.Event{}, provider.Unprocessable("dispute closed with status " + o.Status)
		}
	}
	if err := provider.CheckID("payment id", paymentID); err != nil {
		return provider.Event{}, err
	}
	if amount != "" {
		v, err := provider.FactAmountMinor(amount, fact.Currency)
		if err != nil {
			return provider.Event{}, err
		}
		if fact.AmountMinor, err = toISO(v, fact.Currency); err != nil {
			return provider.Event{}, err
		}
	}
	return provider.Event{
		EventID:   e.ID,
		DedupKey:  provider.ScopeKey(d.signing.Account, e.ID),
		PaymentID: paymentID,
		Type:      e.Type,
		Fact:      fact,
	}, nil
}

func deref(s *string) string {
	if s == nil {
		return ""
	}
	return *s
}

func first(ns ...provider.Amount) provider.Amount {
	for _, n := range ns {
		if n != "" {
			return n
		}
	}
	return ""
}
