// Package paymenttest generates payment histories for property tests: one
// consistent real history per payment, in the order it happened, with the
// duplicates gateways send (the same fact under two event types, thin
// payloads) and, on request, junk that must never matter. The machine's
// convergence tests and the processor's end-to-end property test share it.
package paymenttest

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"time"

	"github.com/paystream/paystream/internal/payment"
)

// Options shape a generated history.
type Options struct {
	// Junk adds facts that must change nothing: malformed ones (an unknown
	// status, a negative amount; the machine calls them invalid) and facts
	// in another currency.
	Junk bool
}

// history generates one payment's facts as a gateway would send them, in
// the order they happened: one consistent real history (every fact about a
// status, refund or dispute agrees on its amount; one currency) with the
// duplicates gateways send (two event types for one fact, thin payloads) and
// junk that must never matter (malformed facts, facts in another currency).
type history struct {
	r     *rand.Rand
	cur   string
	at    time.Time
	facts []payment.Fact
}

func (h *history) emit(f payment.Fact) {
	h.at = h.at.Add(time.Duration(1+h.r.IntN(3600)) * time.Second)
	f.OccurredAt = h.at
	if h.r.IntN(10) == 0 { // gateway clock skew
		f.OccurredAt = f.OccurredAt.Add(-time.Duration(h.r.IntN(7200)) * time.Second)
	}
	h.facts = append(h.facts, f)
}

func (h *history) chance(n int) bool { return h.r.IntN(n) == 0 }

// maybeCur is the currency, or empty as on thin refund and dispute payloads.
func (h *history) maybeCur() string {
	if h.chance(3) {
		return ""
	}
	return h.cur
}

func (h *history) foreign() string {
	for {
		if c := []string{"BRL", "USD", "JPY"}[h.r.IntN(3)]; c != h.cur {
			return c
		}
	}
}

// History generates one payment's facts, in the order they happened,
// starting after start. Facts about one status, refund or dispute agree on
// their amount and the payment has one currency, so every delivery order
// converges (see package payment).
func History(r *rand.Rand, start time.Time, opts Options) []payment.Fact {
	h := &history{r: r, cur: []string{"BRL", "USD", "JPY"}[r.IntN(3)], at: start}
	amount := 1 + r.Int64N(200_000)
	pays := !h.chance(4)

	// Before money: any statuses, any order (gateways skip some, retries
	// fail and succeed). They carry the payment's amount; thin duplicates
	// only on payments that get payment.StatusPaid, where the capture fixes the amount.
	for range r.IntN(4) {
		s := []payment.Status{payment.StatusPending, payment.StatusAuthorized, payment.StatusFailed, payment.StatusCanceled}[r.IntN(4)]
		h.emit(payment.Fact{Status: s, AmountMinor: amount, Currency: h.cur})
		if pays && h.chance(4) {
			h.emit(payment.Fact{Status: s})
		}
	}
	if pays {
		captured := amount
		if h.chance(6) { // partial capture
			captured = 1 + r.Int64N(amount)
		}
		h.emit(payment.Fact{Status: payment.StatusPaid, AmountMinor: captured, Currency: h.cur})
		if h.chance(3) { // Asaas PAYMENT_CONFIRMED then PAYMENT_RECEIVED
			h.emit(payment.Fact{Status: payment.StatusPaid, AmountMinor: captured, Currency: h.cur})
		}
		if h.chance(5) { // thin payload
			h.emit(payment.Fact{Status: payment.StatusPaid, Currency: h.cur})
		}
		if h.chance(2) {
			h.refunds(captured, amount)
			h.dispute(captured)
		} else {
			h.dispute(captured)
			h.refunds(captured, amount)
		}
	}
	if opts.Junk {
		h.junk()
	}
	if pays && h.chance(10) {
		// The capture's events never arrive: everything after it waits.
		h.facts = slices.DeleteFunc(h.facts, func(f payment.Fact) bool { return f.Status == payment.StatusPaid })
	}
	if len(h.facts) == 0 {
		// Not every payment is interesting, but every one says something.
		h.emit(payment.Fact{Status: payment.StatusPending, AmountMinor: amount, Currency: h.cur})
	}
	return h.facts
}

func (h *history) refunds(captured, amount int64) {
	left := captured
	for i := range h.r.IntN(4) {
		if left == 0 {
			break
		}
		id := fmt.Sprintf("re_%d", i)
		if h.chance(6) {
			// A refund of the remainder, its amount not said; maybe
			// detailed by a later event.
			h.emit(payment.Fact{Status: payment.StatusRefunded, RefundID: id, Currency: h.maybeCur()})
			if h.chance(2) {
				h.emit(payment.Fact{Status: payment.StatusRefunded, RefundID: id, AmountMinor: left, Currency: h.maybeCur()})
			}
			left = 0
			break
		}
		a := 1 + h.r.Int64N(left)
		if h.chance(3) {
			a = left
		}
		status := payment.StatusPartiallyRefunded
		if a == left || h.chance(4) {
			status = payment.StatusRefunded
		}
		h.emit(payment.Fact{Status: status, RefundID: id, AmountMinor: a, Currency: h.maybeCur()})
		if h.chance(3) { // the same refund again, under another event type
			h.emit(payment.Fact{Status: payment.StatusPartiallyRefunded, RefundID: id, AmountMinor: a, Currency: h.maybeCur()})
		}
		if h.chance(5) { // thin
			h.emit(payment.Fact{Status: payment.StatusPartiallyRefunded, RefundID: id})
		}
		left -= a
	}
	switch {
	case h.chance(3):
		// "Refunded", no id: a full refund of the remainder, or Stripe's
		// charge.refunded after refunds that already add up. Drivers
		// often put the payment's amount on it.
		h.emit(payment.Fact{Status: payment.StatusRefunded, AmountMinor: []int64{0, amount}[h.r.IntN(2)], Currency: h.maybeCur()})
		if h.chance(3) {
			h.emit(payment.Fact{Status: payment.StatusRefunded, Currency: h.maybeCur()})
		}
	case left < captured && h.chance(2):
		// "Partially refunded", no id, after some refund.
		h.emit(payment.Fact{Status: payment.StatusPartiallyRefunded, AmountMinor: amount, Currency: h.maybeCur()})
	}
}

func (h *history) dispute(captured int64) {
	if !h.chance(3) {
		return
	}
	d := 1 + h.r.Int64N(captured)
	if h.chance(8) { // said above the capture: capped
		d = captured + 1 + h.r.Int64N(100)
	}
	h.emit(payment.Fact{Status: payment.StatusDisputed, AmountMinor: d, Currency: h.maybeCur()})
	if h.chance(3) {
		h.emit(payment.Fact{Status: payment.StatusDisputed, AmountMinor: d, Currency: h.maybeCur()})
	}
	if h.chance(4) {
		h.emit(payment.Fact{Status: payment.StatusDisputed})
	}
	outcome := func(s payment.Status) {
		h.emit(payment.Fact{Status: s, AmountMinor: []int64{0, d}[h.r.IntN(2)], Currency: h.maybeCur()})
		if h.chance(3) {
			h.emit(payment.Fact{Status: s})
		}
	}
	switch h.r.IntN(4) {
	case 0:
		outcome(payment.StatusDisputeWon)
	case 1:
		outcome(payment.StatusDisputeLost)
	case 2:
		outcome(payment.StatusDisputeWon)
		outcome(payment.StatusDisputeLost)
	}
}

func (h *history) junk() {
	for range h.r.IntN(3) {
		switch h.r.IntN(4) {
		case 0:
			h.emit(payment.Fact{Status: "chargeback", AmountMinor: 1, Currency: h.cur})
		case 1:
			h.emit(payment.Fact{Status: payment.StatusPartiallyRefunded, RefundID: "re_x", AmountMinor: 1, Currency: h.foreign()})
		case 2:
			h.emit(payment.Fact{Status: payment.StatusDisputed, AmountMinor: 1, Currency: h.foreign()})
		case 3:
			h.emit(payment.Fact{Status: payment.StatusPaid, AmountMinor: -5, Currency: h.cur})
		}
	}
}
