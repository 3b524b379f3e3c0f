package payment_test

import (
	"reflect"
	"slices"
	"testing"
	"time"

	"github.com/paystream/paystream/internal/payment"
)

func at(f payment.Fact, minute int) payment.Fact {
	f.OccurredAt = t0.Add(time.Duration(minute) * time.Minute)
	return f
}

func TestResume(t *testing.T) {
	t.Parallel()
	var m payment.Machine
	s := mustApply(t, []payment.Fact{st(paid, 1000)})
	waiting := []payment.Fact{
		at(st(lost, 1000), 1),     // 0: needs the dispute, which is older
		at(st(disputed, 1000), 2), // 1
		at(refund("r1", 0), 3),    // 2: partial refund without amount
		at(refund("r1", 300), 5),  // 3
		at(st(won, 0), 9),         // 4: after lost: stale
		at(refund("r2", 0), 4),    // 5: stays deferred
	}
	orig := slices.Clone(waiting)
	got := m.Resume(s, waiting)

	if !reflect.DeepEqual(waiting, orig) {
		t.Fatal("Resume modified waiting")
	}
	// Pass 1, in OccurredAt order: lost (deferred), disputed (applied),
	// r1 without amount (deferred), r2 (deferred), r1 (applied), won
	// (applied: the dispute is open). Pass 2: lost (applied), r1 without
	// amount (ignored: duplicate), r2 (deferred). Pass 3: nothing.
	type step struct {
		index   int
		outcome payment.Outcome
		reason  string
	}
	var steps []step
	for _, r := range got.Resumed {
		steps = append(steps, step{r.Index, r.Decision.Outcome, r.Decision.Reason})
	}
	want := []step{
		{1, applied, ""}, {3, applied, ""}, {4, applied, ""},
		{0, applied, ""}, {2, ignored, payment.ReasonDuplicateFact},
	}
	if !slices.Equal(steps, want) {
		t.Fatalf("resumed = %v, want %v", steps, want)
	}
	if got.State.Status != lost || got.State.RefundedMinor != 300 || got.State.Version != 5 {
		t.Fatalf("state = %s refunded %d v%d, want dispute_lost 300 v5", got.State.Status, got.State.RefundedMinor, got.State.Version)
	}
	if err := checkTransitions(s, got.Transitions, got.State); err != nil {
		t.Fatal(err)
	}
	// Each applied step's state is the payment right after it.
	last := got.Resumed[3].Decision
	if last.State.Version != 5 || !reflect.DeepEqual(last.State, got.State) {
		t.Fatalf("last applied state = %+v, want %+v", last.State, got.State)
	}
}

func TestResumeNothingWaiting(t *testing.T) {
	t.Parallel()
	var m payment.Machine
	s := mustApply(t, []payment.Fact{st(paid, 1000)})
	got := m.Resume(s, nil)
	if !reflect.DeepEqual(got.State, s) || len(got.Resumed) != 0 || len(got.Transitions) != 0 {
		t.Fatalf("Resume(s, nil) = %+v", got)
	}
}

func TestOffer(t *testing.T) {
	t.Parallel()
	var m payment.Machine
	waiting := []payment.Fact{at(refund("r1", 300), 1), at(st(won, 0), 3), at(st(disputed, 1000), 2)}

	t.Run("deferred fact resumes nothing", func(t *testing.T) {
		t.Parallel()
		s := mustApply(t, []payment.Fact{st(pending, 1000)})
		d, settled := m.Offer(s, at(refund("r2", 100), 4), waiting)
		if d.Outcome != deferred || !reflect.DeepEqual(settled.State, s) || len(settled.Resumed) != 0 || len(settled.Transitions) != 0 {
			t.Fatalf("Offer() = %+v, %+v", d, settled)
		}
	})
	t.Run("ignored fact resumes nothing", func(t *testing.T) {
		t.Parallel()
		s := mustApply(t, []payment.Fact{st(pending, 1000)})
		d, settled := m.Offer(s, at(st(pending, 1000), 4), waiting)
		if d.Outcome != ignored || len(settled.Resumed) != 0 || len(settled.Transitions) != 0 {
			t.Fatalf("Offer() = %+v, %+v", d, settled)
		}
	})
	t.Run("applied fact resumes the waiting facts", func(t *testing.T) {
		t.Parallel()
		s := mustApply(t, []payment.Fact{st(pending, 1000)})
		d, settled := m.Offer(s, at(st(paid, 1000), 5), waiting)
		if d.Outcome != applied || len(d.Transitions) != 1 {
			t.Fatalf("decision = %+v", d)
		}
		if len(settled.Resumed) != 3 || len(settled.Transitions) != 4 {
			t.Fatalf("resumed %d, transitions %d; want 3, 4", len(settled.Resumed), len(settled.Transitions))
		}
		if !reflect.DeepEqual(settled.Transitions[0], d.Transitions[0]) {
			t.Fatalf("first transition %+v, want the offered fact's %+v", settled.Transitions[0], d.Transitions[0])
		}
		if err := checkTransitions(s, settled.Transitions, settled.State); err != nil {
			t.Fatal(err)
		}
		// Won dispute and a partial refund: refunds take precedence.
		if settled.State.Status != partially || settled.State.DisputeStatus != won || settled.State.RefundedMinor != 300 {
			t.Fatalf("state = %s refunded %d", settled.State.Status, settled.State.RefundedMinor)
		}
	})
}

func TestReplay(t *testing.T) {
	t.Parallel()
	var m payment.Machine
	facts := []payment.Fact{
		at(refund("r1", 300), 3),         // deferred, then applied after paid
		at(st(won, 0), 6),                // deferred until the dispute
		at(st(lost, 0), 7),               // deferred until the dispute
		at(st(paid, 1000), 1),            // applied; r1 follows
		at(st(pending, 1000), 0),         // stale
		at(st(paid, 1000), 2),            // the payment is partially_refunded by now: stale
		at(st(disputed, 400), 5),         // applied; won then lost follow
		at(payment.Fact{Status: "x"}, 8), // invalid
	}
	got := m.Replay(payment.State{}, facts)
	var outcomes []string
	for _, d := range got.Decisions {
		outcomes = append(outcomes, string(d.Outcome)+":"+d.Reason)
	}
	want := []string{"processed:", "processed:", "processed:", "processed:", "ignored:stale", "ignored:stale", "processed:", "ignored:invalid_fact"}
	if !slices.Equal(outcomes, want) {
		t.Fatalf("decisions = %v, want %v", outcomes, want)
	}
	if err := checkTransitions(payment.State{}, got.Transitions, got.State); err != nil {
		t.Fatal(err)
	}
	var kinds []string
	for _, tr := range got.Transitions {
		kinds = append(kinds, tr.Kind)
	}
	wantKinds := []string{payment.KindCapture, payment.KindRefund, payment.KindDispute, payment.KindDisputeWon, payment.KindDisputeLost}
	if !slices.Equal(kinds, wantKinds) {
		t.Fatalf("kinds = %v, want %v", kinds, wantKinds)
	}
	if got.State.Status != lost || got.State.Version != 5 {
		t.Fatalf("state %s v%d, want dispute_lost v5", got.State.Status, got.State.Version)
	}
}

func TestReplayStillWaiting(t *testing.T) {
	t.Parallel()
	var m payment.Machine
	facts := []payment.Fact{at(st(won, 0), 1), at(fullRefund(), 2), at(st(authorized, 1000), 0)}
	got := m.Replay(payment.State{}, facts)
	if got.Decisions[0].Outcome != deferred || got.Decisions[1].Outcome != deferred || got.Decisions[2].Outcome != applied {
		t.Fatalf("decisions = %+v", got.Decisions)
	}
	if got.State.Status != authorized || got.State.Version != 1 || len(got.Transitions) != 1 {
		t.Fatalf("state = %+v", got.State)
	}
}
