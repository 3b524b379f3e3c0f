package payment_test

import (
	"flag"
	"fmt"
	"maps"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/paystream/paystream/internal/ledger"
	"github.com/paystream/paystream/internal/payment"
	"github.com/paystream/paystream/internal/payment/paymenttest"
	"github.com/paystream/paystream/internal/testenv"
)

var seedFlag = flag.Uint64("payment.seed", 0, "seed for the payment property tests (0: random, logged)")

func propertySeed(t *testing.T) uint64 {
	return testenv.Seed(t, *seedFlag, "./internal/payment", "payment.seed")
}

// deliver is what the processor may see: the facts in any order, some more
// than once (redeliveries whose dedup keys differ, e.g. manual resends).
func deliver(r *rand.Rand, facts []payment.Fact) []payment.Fact {
	out := make([]payment.Fact, 0, 2*len(facts))
	for _, i := range r.Perm(len(facts)) {
		out = append(out, facts[i])
	}
	for _, f := range facts {
		for r.IntN(4) == 0 {
			out = slices.Insert(out, r.IntN(len(out)+1), f)
		}
	}
	return out
}

// checkReplay checks what holds for any replay, consistent or not: the
// transitions are gapless from version 1 and never regress, each From is the
// previous To, every journal entry is valid and balanced and together they
// give the final state's ledger, refunds never exceed the capture, and the
// final state is a fixpoint: no fact delivered applies to it again.
func checkReplay(facts []payment.Fact, got payment.Replayed) error {
	if len(got.Decisions) != len(facts) {
		return fmt.Errorf("%d decisions for %d facts", len(got.Decisions), len(facts))
	}
	if err := checkTransitions(payment.State{}, got.Transitions, got.State); err != nil {
		return err
	}
	var m payment.Machine
	for i, f := range facts {
		d := m.Apply(got.State, f)
		if d.Outcome == payment.OutcomeApplied {
			return fmt.Errorf("fact %d %s applies again to the final state", i, fmtFact(f))
		}
		if got.Decisions[i].Outcome == payment.OutcomeDeferred && d.Outcome != payment.OutcomeDeferred {
			return fmt.Errorf("fact %d %s left deferred but now %s", i, fmtFact(f), d.Outcome)
		}
	}
	return nil
}

func fmtFact(f payment.Fact) string {
	s := fmt.Sprintf("%s(%d %s", f.Status, f.AmountMinor, f.Currency)
	if f.RefundID != "" {
		s += " id=" + f.RefundID
	}
	return s + " @" + f.OccurredAt.Format("15:04:05") + ")"
}

func fmtFacts(fs []payment.Fact) string {
	var b strings.Builder
	for _, f := range fs {
		b.WriteString("\n\t" + fmtFact(f))
	}
	return b.String()
}

func journals(ts []payment.Transition) [][]ledger.Posting {
	js := make([][]ledger.Posting, len(ts))
	for i, t := range ts {
		js[i] = t.Postings()
	}
	return js
}

// TestConvergence is the order-independence property: any permutation and
// duplication of a payment's facts, replayed as the processor does
// (Machine.Replay: deferred facts resumed after every transition), ends in a
// state Equivalent to in-order delivery, with the same ledger balances, and
// with gapless, balanced transitions.
func TestConvergence(t *testing.T) {
	t.Parallel()
	r := rand.New(rand.NewPCG(propertySeed(t), 0))
	const histories, orders = 3000, 5

	var m payment.Machine
	seen := map[string]int{}
	for i := range histories {
		facts := paymenttest.History(r, t0, paymenttest.Options{Junk: true})
		want := m.Replay(payment.State{}, facts)
		if err := checkReplay(facts, want); err != nil {
			t.Fatalf("history %d, in order: %v\nfacts:%s", i, err, fmtFacts(facts))
		}
		wantLedger := ledger.Balances(journals(want.Transitions)...)
		seen["final "+string(want.State.Status)]++
		if want.State.FullRefund {
			seen["full refund pending detail"]++
		}

		for range orders {
			delivered := deliver(r, facts)
			got := m.Replay(payment.State{}, delivered)
			if err := checkReplay(delivered, got); err != nil {
				t.Fatalf("history %d: %v\nin order:%s\ndelivered:%s", i, err, fmtFacts(facts), fmtFacts(delivered))
			}
			if !got.State.Equivalent(want.State) {
				t.Fatalf("history %d diverged:\n got  %+v\n want %+v\nin order:%s\ndelivered:%s",
					i, got.State, want.State, fmtFacts(facts), fmtFacts(delivered))
			}
			if gotLedger := ledger.Balances(journals(got.Transitions)...); !maps.Equal(gotLedger, wantLedger) {
				t.Fatalf("history %d: ledger %v, want %v\nin order:%s\ndelivered:%s",
					i, gotLedger, wantLedger, fmtFacts(facts), fmtFacts(delivered))
			}
			for j, d := range got.Decisions {
				if d.Outcome == payment.OutcomeApplied && j > 0 {
					seen["applied"]++
				}
				if d.Outcome == payment.OutcomeDeferred {
					seen["left deferred"]++
				}
			}
			for _, tr := range got.Transitions {
				seen["kind "+tr.Kind]++
			}
			if len(got.Transitions) != len(want.Transitions) {
				seen["different transition count"]++
			}
		}
	}

	// The generator must reach every corner, or the property proves little.
	for _, k := range []string{
		"final pending", "final authorized", "final failed", "final canceled", "final paid",
		"final partially_refunded", "final refunded", "final disputed", "final dispute_won", "final dispute_lost",
		"full refund pending detail", "left deferred", "different transition count",
		"kind " + payment.KindStatus, "kind " + payment.KindCapture, "kind " + payment.KindRefund,
		"kind " + payment.KindRefundIdentified, "kind " + payment.KindDispute,
		"kind " + payment.KindDisputeWon, "kind " + payment.KindDisputeLost,
	} {
		if seen[k] == 0 {
			t.Errorf("no history covered %q", k)
		}
	}
	t.Logf("coverage: %v", seen)
}

// TestReplaySafety replays random fact soups (inconsistent amounts, any
// statuses, ids and currencies): convergence is not promised for them, but
// every replay must keep the invariants checkReplay checks and be
// deterministic.
func TestReplaySafety(t *testing.T) {
	t.Parallel()
	r := rand.New(rand.NewPCG(propertySeed(t), 1))
	var m payment.Machine
	for i := range 3000 {
		facts := make([]payment.Fact, r.IntN(20))
		for j := range facts {
			facts[j] = randomFact(r)
		}
		got := m.Replay(payment.State{}, facts)
		if err := checkReplay(facts, got); err != nil {
			t.Fatalf("soup %d: %v\nfacts:%s", i, err, fmtFacts(facts))
		}
		if again := m.Replay(payment.State{}, facts); !again.State.Equivalent(got.State) || again.State.Version != got.State.Version {
			t.Fatalf("soup %d: replay not deterministic", i)
		}
	}
}

var soupStatuses = []payment.Status{
	pending, authorized, paid, failed, canceled, refunded, partially, disputed, won, lost, "chargeback",
}

func randomFact(r *rand.Rand) payment.Fact {
	return payment.Fact{
		Status:      soupStatuses[r.IntN(len(soupStatuses))],
		AmountMinor: []int64{0, 1, 100, 300, 500, 700, 1000, 1001, 5000, payment.MaxAmountMinor, -1}[r.IntN(11)],
		Currency:    []string{"", "BRL", "BRL", "USD", "brl"}[r.IntN(5)],
		RefundID:    []string{"", "", "r1", "r2", "r3", payment.FullRefundID}[r.IntN(6)],
		OccurredAt:  t0.Add(time.Duration(r.IntN(100)) * time.Minute),
	}
}
