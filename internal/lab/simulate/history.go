package simulate

import (
	"fmt"
	"math/rand/v2"
	"time"

	"github.com/paystream/paystream/internal/provider"
)

// Kind is what one step of a payment's history says happened: the kinds of
// fact a driver's fixture webhook tells (provider.Fixture).
type Kind = provider.FixtureKind

// The kinds of step a history is made of.
const (
	KindCreated     = provider.FixtureCreated
	KindAuthorized  = provider.FixtureAuthorized
	KindPaid        = provider.FixturePaid
	KindFailed      = provider.FixtureFailed
	KindCanceled    = provider.FixtureCanceled
	KindRefund      = provider.FixtureRefund      // a refund with its own id and amount
	KindFullRefund  = provider.FixtureFullRefund  // "refunded in full", without a refund id
	KindDisputed    = provider.FixtureDisputed    // a dispute of the whole captured amount opens
	KindDisputeWon  = provider.FixtureDisputeWon  // the merchant won it
	KindDisputeLost = provider.FixtureDisputeLost // the buyer won it
)

// Step is one fact of a payment's true history, told by one webhook.
type Step struct {
	Kind Kind `json:"kind"`
	// AmountMinor is the captured amount (paid), the refund's amount
	// (refund) or the disputed amount (disputed); the payment's amount for
	// the others.
	AmountMinor int64 `json:"amount_minor"`
	// RefundID identifies a refund; empty for other kinds.
	RefundID string `json:"refund_id,omitempty"`
	// RefundedMinor is the sum of the refunds up to and including this step
	// (the cumulative totals some gateways send).
	RefundedMinor int64 `json:"refunded_minor,omitempty"`
	// Echo marks a second webhook for a fact an earlier step already told
	// (Stripe's charge.succeeded after payment_intent.succeeded, Asaas'
	// PAYMENT_RECEIVED after PAYMENT_CONFIRMED): a distinct event that must
	// change nothing.
	Echo bool `json:"echo,omitempty"`
	// At is when the gateway says the step happened.
	At time.Time `json:"at"`
}

// Shape names the kind of history a payment has.
type Shape string

// The shapes of history the generator draws from; each driver supports the
// ones its webhooks can tell (see profiles).
const (
	ShapePaid            Shape = "paid"              // created, paid
	ShapeAuthorizedPaid  Shape = "authorized_paid"   // created, authorized, paid
	ShapeFailed          Shape = "failed"            // created, failed
	ShapeCanceled        Shape = "canceled"          // created, canceled
	ShapePartialRefunds  Shape = "partial_refunds"   // created, paid, one or two partial refunds with ids
	ShapeRefundedByParts Shape = "refunded_by_parts" // created, paid, partial refund, the remainder refunded: with ids
	ShapeFullRefund      Shape = "full_refund"       // created, paid, refunded in full without an id
	ShapeDisputeOpen     Shape = "dispute_open"      // created, paid, disputed
	ShapeDisputeWon      Shape = "dispute_won"       // created, paid, disputed, won
	ShapeDisputeLost     Shape = "dispute_lost"      // created, paid, disputed, lost
)

// Currency is every simulated payment's currency.
const Currency = "BRL"

// History is one payment's true history: what happened at the gateway, in
// order, one webhook per step.
type History struct {
	Source     string `json:"source"`
	Driver     string `json:"driver"`
	PaymentID  string `json:"payment_id"`
	PaymentKey string `json:"payment_key"`
	Shape      Shape  `json:"shape"`
	// AmountMinor is the payment's amount, in minor units of Currency.
	AmountMinor int64  `json:"amount_minor"`
	Steps       []Step `json:"steps"`
}

// generateSteps draws the steps of a payment of shape, for amount, with
// refund ids made by refundID(n), starting at start. echoes lists the kinds
// after which the driver sends a second webhook for the same fact.
func generateSteps(rng *rand.Rand, shape Shape, amount int64, start time.Time, refundID func(n int) string, echoes map[Kind]bool) []Step {
	at := start
	var steps []Step
	var refunded int64
	add := func(k Kind, amt int64, id string) {
		if k == KindRefund {
			refunded += amt
		}
		if k == KindFullRefund {
			refunded = amount
		}
		steps = append(steps, Step{Kind: k, AmountMinor: amt, RefundID: id, RefundedMinor: refunded, At: at})
		if echoes[k] {
			e := steps[len(steps)-1]
			e.Echo = true
			e.At = at.Add(time.Second)
			steps = append(steps, e)
		}
		at = at.Add(time.Duration(1+rng.IntN(120)) * time.Minute)
	}
	add(KindCreated, amount, "")
	switch shape {
	case ShapeFailed:
		add(KindFailed, amount, "")
		return steps
	case ShapeCanceled:
		add(KindCanceled, amount, "")
		return steps
	case ShapeAuthorizedPaid:
		add(KindAuthorized, amount, "")
	}
	add(KindPaid, amount, "")
	switch shape {
	case ShapePartialRefunds:
		n := 1 + rng.IntN(2)
		for i := range n {
			add(KindRefund, 1+rng.Int64N(amount/4), refundID(i))
		}
	case ShapeRefundedByParts:
		first := 1 + rng.Int64N(amount/2)
		add(KindRefund, first, refundID(0))
		add(KindRefund, amount-first, refundID(1))
	case ShapeFullRefund:
		add(KindFullRefund, amount, "")
	case ShapeDisputeOpen, ShapeDisputeWon, ShapeDisputeLost:
		add(KindDisputed, amount, "")
		switch shape {
		case ShapeDisputeWon:
			add(KindDisputeWon, amount, "")
		case ShapeDisputeLost:
			add(KindDisputeLost, amount, "")
		}
	}
	return steps
}

// drawAmount returns a payment amount between 10.00 and 5,000.00.
func drawAmount(rng *rand.Rand) int64 { return 1000 + rng.Int64N(499001) }

// validate checks a history's steps against its shape's own rules: refunds
// within the amount, an outcome only after a dispute.
func (h *History) validate() error {
	var refunded int64
	disputed := false
	for i, s := range h.Steps {
		switch s.Kind {
		case KindRefund:
			refunded += s.AmountMinor
		case KindDisputed:
			disputed = true
		case KindDisputeWon, KindDisputeLost:
			if !disputed {
				return fmt.Errorf("payment %s step %d: %s before a dispute", h.PaymentKey, i, s.Kind)
			}
		}
		if s.AmountMinor <= 0 {
			return fmt.Errorf("payment %s step %d: amount %d", h.PaymentKey, i, s.AmountMinor)
		}
	}
	if refunded > h.AmountMinor {
		return fmt.Errorf("payment %s: refunds %d above the amount %d", h.PaymentKey, refunded, h.AmountMinor)
	}
	return nil
}
