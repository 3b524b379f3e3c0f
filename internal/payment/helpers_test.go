package payment_test

import (
	"encoding/json"
	"fmt"
	"maps"
	"reflect"
	"testing"
	"time"

	"github.com/paystream/paystream/internal/ledger"
	"github.com/paystream/paystream/internal/payment"
)

var t0 = time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)

// st is a status fact in BRL.
func st(s payment.Status, amount int64) payment.Fact {
	return payment.Fact{Status: s, AmountMinor: amount, Currency: "BRL"}
}

// refund is a partial-refund fact with an id.
func refund(id string, amount int64) payment.Fact {
	return payment.Fact{Status: payment.StatusPartiallyRefunded, RefundID: id, AmountMinor: amount, Currency: "BRL"}
}

// fullRefund is a refunded fact without id or amount.
func fullRefund() payment.Fact {
	return payment.Fact{Status: payment.StatusRefunded, Currency: "BRL"}
}

// posts builds the sorted BRL journal entry with the given changes to
// gateway_receivable, merchant_payable and dispute_reserve.
func posts(gr, mp, reserve int64) []ledger.Posting {
	var ps []ledger.Posting
	for _, p := range []ledger.Posting{
		{Account: ledger.AccountDisputeReserve, AmountMinor: reserve, Currency: "BRL"},
		{Account: ledger.AccountGatewayReceivable, AmountMinor: gr, Currency: "BRL"},
		{Account: ledger.AccountMerchantPayable, AmountMinor: mp, Currency: "BRL"},
	} {
		if p.AmountMinor != 0 {
			ps = append(ps, p)
		}
	}
	return ps
}

// deepCopy copies a State and its reference fields, so tests can check
// Apply leaves its input alone.
func deepCopy(s payment.State) payment.State {
	c := s
	c.Refunds = append([]string(nil), s.Refunds...)
	if s.RefundAmounts != nil {
		c.RefundAmounts = maps.Clone(s.RefundAmounts)
	}
	return c
}

// checkDecision checks what every decision must satisfy, whatever the rule:
// the input is not modified; ignored and deferred leave the state as it was
// and carry a reason; applied makes exactly one transition, one version up,
// from the old status to the new, whose balanced postings are the difference
// of State.Balances.
func checkDecision(before, input payment.State, d payment.Decision) error {
	if !reflect.DeepEqual(before, input) {
		return fmt.Errorf("Apply modified its input state")
	}
	if d.Outcome != payment.OutcomeApplied {
		switch {
		case d.Reason == "":
			return fmt.Errorf("%s without reason", d.Outcome)
		case len(d.Transitions) != 0:
			return fmt.Errorf("%s with transitions", d.Outcome)
		case !reflect.DeepEqual(d.State, before):
			return fmt.Errorf("%s changed the state: %+v -> %+v", d.Outcome, before, d.State)
		}
		return nil
	}
	if d.Reason != "" {
		return fmt.Errorf("applied with reason %q", d.Reason)
	}
	if len(d.Transitions) != 1 {
		return fmt.Errorf("applied with %d transitions, want 1", len(d.Transitions))
	}
	tr := d.Transitions[0]
	switch {
	case tr.Version != before.Version+1 || d.State.Version != tr.Version:
		return fmt.Errorf("version %d -> transition %d, state %d", before.Version, tr.Version, d.State.Version)
	case tr.From != before.Status || tr.To != d.State.Status:
		return fmt.Errorf("transition %s -> %s, states %s -> %s", tr.From, tr.To, before.Status, d.State.Status)
	case d.State.RefundedMinor > d.State.CapturedMinor || d.State.RefundedMinor < before.RefundedMinor:
		return fmt.Errorf("refunded %d -> %d of %d", before.RefundedMinor, d.State.RefundedMinor, d.State.CapturedMinor)
	}
	if len(tr.Postings()) > 0 {
		if err := ledger.Validate(tr.Postings()); err != nil {
			return fmt.Errorf("transition postings: %w", err)
		}
	}
	want := before.Balances()
	for k, v := range ledger.Balances(tr.Postings()) {
		want[k] += v
	}
	maps.DeleteFunc(want, func(_ ledger.Key, v int64) bool { return v == 0 })
	if got := d.State.Balances(); !maps.Equal(got, want) {
		return fmt.Errorf("balances %v + postings %v = %v, state says %v", before.Balances(), tr.Postings(), want, got)
	}
	return nil
}

// mustApply applies facts in order, each of which must be applied.
func mustApply(t *testing.T, facts []payment.Fact) payment.State {
	t.Helper()
	var m payment.Machine
	var s payment.State
	for i, f := range facts {
		if f.OccurredAt.IsZero() {
			f.OccurredAt = t0.Add(time.Duration(i) * time.Minute)
		}
		d := m.Apply(s, f)
		if d.Outcome != payment.OutcomeApplied {
			t.Fatalf("given fact %d %+v: %s %s, want applied", i, f, d.Outcome, d.Reason)
		}
		s = d.State
	}
	return s
}

func roundTrip(t *testing.T, s payment.State) payment.State {
	t.Helper()
	b, err := json.Marshal(s)
	if err != nil {
		t.Fatal(err)
	}
	var got payment.State
	if err := json.Unmarshal(b, &got); err != nil {
		t.Fatal(err)
	}
	return got
}

// checkTransitions checks a run of transitions starting from state from and
// ending in state to: versions gapless from from.Version+1, each From the
// previous To, postings valid, and the ledger they add up to equal to what
// the end state says.
func checkTransitions(from payment.State, ts []payment.Transition, to payment.State) error {
	prev := from.Status
	journals := [][]ledger.Posting{}
	for k, v := range from.Balances() {
		journals = append(journals, []ledger.Posting{{Account: k.Account, AmountMinor: v, Currency: k.Currency}})
	}
	for i, tr := range ts {
		if want := from.Version + int64(i) + 1; tr.Version != want {
			return fmt.Errorf("transition %d has version %d, want %d", i, tr.Version, want)
		}
		if tr.From != prev {
			return fmt.Errorf("transition v%d from %q, but the payment was %q", tr.Version, tr.From, prev)
		}
		prev = tr.To
		if len(tr.Postings()) > 0 {
			if err := ledger.Validate(tr.Postings()); err != nil {
				return fmt.Errorf("transition v%d: %w", tr.Version, err)
			}
		}
		for _, p := range tr.Postings() {
			if p.Currency != to.Currency {
				return fmt.Errorf("transition v%d posts %s, payment is %s", tr.Version, p.Currency, to.Currency)
			}
		}
		journals = append(journals, tr.Postings())
	}
	if to.Version != from.Version+int64(len(ts)) || prev != to.Status {
		return fmt.Errorf("end state v%d %q after %d transitions from v%d ending in %q", to.Version, to.Status, len(ts), from.Version, prev)
	}
	if to.RefundedMinor > to.CapturedMinor {
		return fmt.Errorf("refunded %d of %d captured", to.RefundedMinor, to.CapturedMinor)
	}
	if got, want := ledger.Balances(journals...), to.Balances(); !maps.Equal(got, want) {
		return fmt.Errorf("postings add up to %v, state says %v", got, want)
	}
	return nil
}
