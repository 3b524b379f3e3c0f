package loadgen

import (
	"sync"
	"testing"
	"time"

	"github.com/paystream/paystream/internal/payment"
	"github.com/paystream/paystream/internal/provider"
)

// TestLifecycleSchedule: the schedule has exactly the asked fraction of
// repeats, each re-sending an earlier event byte for byte; every body
// verifies and parses with the real driver, is padded to the asked size;
// and each payment's events, through the state machine, make exactly
// LifecycleTransitions transitions, the late created being ignored.
func TestLifecycleSchedule(t *testing.T) {
	t.Parallel()
	src := testSources(t)[0] // sw: standardwebhooks
	b, err := NewBuilder(src, "lc", 1)
	if err != nil {
		t.Fatal(err)
	}
	const payments = 50
	l, err := NewLifecycle(LifecycleConfig{Builder: b, Payments: payments, Repeats: 0.2, BodyBytes: 1024, Seed: 9})
	if err != nil {
		t.Fatal(err)
	}
	if want := payments * LifecycleSteps * 5 / 4; l.Len() != want {
		t.Fatalf("Len = %d, want %d (20%% repeats)", l.Len(), want)
	}
	drv := driverFor(t, src)
	now := time.Now()
	bodies := map[string]string{} // event id → body
	facts := make([][]payment.Fact, payments)
	var repeats int
	for i := range l.Len() {
		req, err := l.Request(i, now)
		if err != nil {
			t.Fatal(err)
		}
		if n := len(req.Body); n < 1000 || n > 1030 {
			t.Fatalf("delivery %d: body of %d bytes, want about 1024", i, n)
		}
		pr := &provider.Request{Header: req.Header, Body: req.Body, Now: now}
		if err := drv.Verify(pr); err != nil {
			t.Fatalf("delivery %d: %v", i, err)
		}
		ev, err := drv.Parse(pr)
		if err != nil {
			t.Fatalf("delivery %d: %v", i, err)
		}
		p, _ := l.Event(i)
		if ev.EventID != l.EventID(i) || ev.PaymentID != l.PaymentID(p) {
			t.Fatalf("delivery %d: event %s payment %s, want %s %s", i, ev.EventID, ev.PaymentID, l.EventID(i), l.PaymentID(p))
		}
		prev, seen := bodies[ev.EventID]
		if seen != l.Repeat(i) {
			t.Fatalf("delivery %d: seen before %v, Repeat %v", i, seen, l.Repeat(i))
		}
		if seen {
			repeats++
			if prev != string(req.Body) {
				t.Fatalf("delivery %d: a repeat with another body", i)
			}
			continue
		}
		bodies[ev.EventID] = string(req.Body)
		facts[p] = append(facts[p], ev.Fact)
	}
	if repeats != l.Len()/5 {
		t.Errorf("%d repeats, want %d", repeats, l.Len()/5)
	}
	for p, fs := range facts {
		r := payment.Machine{}.Replay(payment.State{}, fs)
		last := r.Decisions[len(r.Decisions)-1]
		if len(fs) != LifecycleSteps || len(r.Transitions) != LifecycleTransitions || r.State.Status != payment.StatusRefunded ||
			last.Outcome != payment.OutcomeIgnored || last.Reason != payment.ReasonStale {
			t.Fatalf("payment %d: %d facts, %d transitions, status %s, late created %s/%s", p, len(fs), len(r.Transitions), r.State.Status, last.Outcome, last.Reason)
		}
	}
}

// TestRunScheduleSendsEachOnce: RunSchedule sends every delivery exactly
// once, with either client, reports each answer through OnAnswer, and
// counts the repeats.
func TestRunScheduleSendsEachOnce(t *testing.T) {
	t.Parallel()
	vs := newVerifyingServer(t)
	eachSender(t, vs, func(t *testing.T, sender Sender) { testRunScheduleSendsEachOnce(t, vs, sender) })
}

func testRunScheduleSendsEachOnce(t *testing.T, vs *verifyingServer, sender Sender) {
	b, err := NewBuilder(testSources(t)[0], "rs", 2)
	if err != nil {
		t.Fatal(err)
	}
	l, err := NewLifecycle(LifecycleConfig{Builder: b, Payments: 40, Repeats: 0.2})
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	answered := map[int]int{}
	res, err := RunSchedule(t.Context(), ScheduleConfig{URL: vs.URL, Schedule: l, Concurrency: 8, Sender: sender,
		OnAnswer: func(i, status int, _ time.Time) {
			mu.Lock()
			answered[i] = status
			mu.Unlock()
		}})
	if err != nil {
		t.Fatal(err)
	}
	if res.Sent != int64(l.Len()) || res.OK() != int64(l.Len()) || len(answered) != l.Len() {
		t.Fatalf("sent %d, status %v, %d answers reported; want %d 200s", res.Sent, res.Status, len(answered), l.Len())
	}
	if want := int64(l.Len() / 5); res.Duplicates != want {
		t.Errorf("duplicates %d, want %d", res.Duplicates, want)
	}
	var deliveries int
	for _, n := range vs.keys {
		deliveries += n
	}
	if deliveries != l.Len() || len(vs.keys) != 40*LifecycleSteps {
		t.Errorf("server saw %d deliveries of %d events, want %d of %d", deliveries, len(vs.keys), l.Len(), 40*LifecycleSteps)
	}
}
