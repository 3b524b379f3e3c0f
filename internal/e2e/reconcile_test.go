package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/paystream/paystream/internal/store"
	"github.com/paystream/paystream/internal/testenv"
)

// reconcileJSON is the contract of `paystream reconcile --json`, spelled out
// here so that a renamed field fails this test.
type reconcileJSON struct {
	Ledger struct {
		Payments int `json:"payments_checked"`
		Drifted  int `json:"drifted"`
		Drift    []struct {
			PaymentKey string           `json:"payment_key"`
			Problems   []string         `json:"problems"`
			Expected   map[string]int64 `json:"expected_balances"`
			Actual     map[string]int64 `json:"ledger_balances"`
		} `json:"drift"`
	} `json:"ledger"`
	Waiting struct {
		Payments []struct {
			PaymentKey string `json:"payment_key"`
			Held       bool   `json:"held"`
		} `json:"payments"`
	} `json:"waiting"`
	StateEvents struct {
		Transitions   int      `json:"transitions_checked"`
		EventsRead    int      `json:"events_read"`
		Missing       int      `json:"missing"`
		MissingEvents []string `json:"missing_events"`
		Duplicated    []string `json:"duplicated"`
	} `json:"state_events"`
	DLQ struct {
		Records     int      `json:"records"`
		Replayed    int      `json:"replayed"`
		NotReplayed int      `json:"not_replayed"`
		Unreplayed  []string `json:"unreplayed"`
	} `json:"dlq"`
}

// TestReconcile runs `paystream reconcile` (the binary) on a healthy
// pipeline, where it must find nothing and exit 0, then plants one drift of
// each kind it checks — a deleted ledger movement, a transition whose
// state event never reached the topic, a payment held for two hours, a
// dead-lettered webhook never replayed — and requires each to be named,
// nothing else, and exit status 3.
func TestReconcile(t *testing.T) {
	testenv.SkipIfShort(t)
	t.Parallel()
	p := setup(t, pipelineOpts{})
	now := time.Now().UTC().Truncate(time.Second)
	event := func(typ, id, extra string) string {
		return fmt.Sprintf(`{"type":%q,"timestamp":%q,"data":{"payment_id":%q,"amount":5000,"currency":"BRL"%s}}`,
			typ, now.Format(time.RFC3339), id, extra)
	}
	posts := []struct{ msg, body string }{
		{"m1", event("payment.paid", "pay_paid", "")},
		{"m2", event("payment.paid", "pay_partial", "")},
		{"m3", event("payment.partially_refunded", "pay_partial", `,"refund_id":"rf_1","refund_amount":1200`)},
		{"m4", event("payment.paid", "pay_refunded", "")},
		{"m5", event("payment.refunded", "pay_refunded", "")},
		{"m6", event("payment.created", "pay_pending", "")},
	}
	for _, m := range posts {
		if code := p.post(t, "acme", m.msg, now, m.body, nil); code != http.StatusOK {
			t.Fatalf("post %s: status %d, want 200", m.msg, code)
		}
	}
	const transitions = 6 // 1 capture, 1 capture + 1 refund, 1 capture + 1 refund, 1 pending
	pool := p.db.Pool
	testenv.WaitFor(t, time.Minute, func() error {
		if n := count(t, pool, `SELECT count(*) FROM payment_transitions`); n != transitions {
			return fmt.Errorf("%d transitions, want %d", n, transitions)
		}
		if n := len(committedState(t, p.brokers, p.state)); n != transitions {
			return fmt.Errorf("%d state events on the topic, want %d", n, transitions)
		}
		return nil
	})

	args := []string{"reconcile", "--database-url", p.db.URL, "--kafka-brokers", strings.Join(p.brokers, ","),
		"--state-topic", p.state, "--dlq-topic", p.dlq, "--since", "1h", "--older-than", "1h", "--settle", "0s"}

	// Healthy: nothing to report, exit 0.
	r, stderr, code := runReconcile(t, args...)
	if code != 0 {
		t.Fatalf("reconcile on a healthy pipeline: exit %d, want 0; report %+v; stderr:\n%s", code, r, stderr)
	}
	if r.Ledger.Payments != 4 || r.Ledger.Drifted != 0 || len(r.Waiting.Payments) != 0 ||
		r.StateEvents.Transitions != transitions || r.StateEvents.EventsRead != transitions ||
		r.StateEvents.Missing != 0 || len(r.StateEvents.Duplicated) != 0 {
		t.Errorf("healthy report = %+v; want 4 payments and %d transitions checked, %d events read, no drift", r, transitions, transitions)
	}
	if r.DLQ.Records != 0 {
		t.Errorf("dlq = %+v, want no record", r.DLQ)
	}
	if !strings.Contains(stderr, "reconcile: ledger") || !strings.Contains(stderr, "reconcile: state events") {
		t.Errorf("stderr lacks the progress lines:\n%s", stderr)
	}

	// Plant the drift. An authentic but unprocessable webhook (a string
	// amount): ingest answers 200 and dead-letters it; nobody replays it.
	dead := `{"type":"payment.paid","timestamp":"` + now.Format(time.RFC3339) + `","data":{"payment_id":"pay_dlq","amount":"50","currency":"BRL"}}`
	if code := p.post(t, "acme", "m7", now, dead, nil); code != http.StatusOK {
		t.Fatalf("post an unprocessable webhook: status %d, want 200", code)
	}
	ctx := context.Background()
	exec := func(sql string) {
		t.Helper()
		if _, err := pool.Exec(ctx, sql); err != nil {
			t.Fatalf("%s: %v", sql, err)
		}
	}
	// A refund's movement lost: the ledger still holds the capture of a
	// refunded payment.
	exec(`DELETE FROM ledger_movements WHERE payment_key = 'acme:pay_refunded' AND version = 2`)
	// A transition recorded without its state event (no WAL message): the
	// payment's rows stay consistent, only the topic lacks the event.
	exec(`INSERT INTO payment_transitions (payment_key, version, from_status, to_status, kind, amount_minor, currency)
	      VALUES ('acme:pay_pending', 2, 'pending', 'pending', 'details', 5000, 'BRL')`)
	exec(`UPDATE payments SET version = 2, state = jsonb_set(state::jsonb, '{version}', '2')::json WHERE payment_key = 'acme:pay_pending'`)
	// A payment held for two hours, quarantined as the processor does.
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := store.Quarantine(ctx, tx, store.Quarantined{
		RecordedAt: time.Now(), Source: "acme", DedupKey: "m_poison", EventType: "payment.paid", PaymentKey: "acme:pay_held",
		Reason: "undecodable envelope", Record: []byte("{"), Topic: p.raw, Partition: 0, Offset: 1 << 40,
		ReceivedAt: time.Now().Add(-2 * time.Hour),
	}); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}

	r, stderr, code = runReconcile(t, args...)
	if code != 3 {
		t.Fatalf("reconcile with planted drift: exit %d, want 3; stderr:\n%s", code, stderr)
	}
	if r.Ledger.Drifted != 1 || len(r.Ledger.Drift) != 1 || r.Ledger.Drift[0].PaymentKey != "acme:pay_refunded" {
		t.Errorf("ledger drift = %+v, want acme:pay_refunded alone", r.Ledger.Drift)
	} else if d := r.Ledger.Drift[0]; len(d.Expected) != 0 || d.Actual["gateway_receivable/BRL"] != 5000 || d.Actual["merchant_payable/BRL"] != -5000 {
		t.Errorf("acme:pay_refunded: expected %v, ledger %v; want nothing expected (refunded nets to zero) and the capture left", d.Expected, d.Actual)
	}
	if r.StateEvents.Missing != 1 || !slices.Equal(r.StateEvents.MissingEvents, []string{"acme:pay_pending:2"}) {
		t.Errorf("missing state events = %d %v, want [acme:pay_pending:2]", r.StateEvents.Missing, r.StateEvents.MissingEvents)
	}
	if len(r.Waiting.Payments) != 1 || r.Waiting.Payments[0].PaymentKey != "acme:pay_held" || !r.Waiting.Payments[0].Held {
		t.Errorf("waiting = %+v, want acme:pay_held, held", r.Waiting.Payments)
	}
	if r.DLQ.Records != 1 || r.DLQ.NotReplayed != 1 || !slices.Equal(r.DLQ.Unreplayed, []string{"0/0"}) {
		t.Errorf("dlq = %+v, want the one record at 0/0, never replayed", r.DLQ)
	}

	// The same findings for people, and a held payment younger than
	// --older-than is not drift.
	out, _, code := runPaystream(t, args...)
	for _, want := range []string{"ledger drift: acme:pay_refunded", "missing state event: acme:pay_pending:2", "waiting: acme:pay_held held",
		"dlq record never replayed: 0/0", "drift found"} {
		if !strings.Contains(out, want) {
			t.Errorf("text report lacks %q:\n%s", want, out)
		}
	}
	if code != 3 {
		t.Errorf("text report: exit %d, want 3", code)
	}
	r, _, _ = runReconcile(t, append(slices.Clone(args), "--older-than", "3h")...)
	if len(r.Waiting.Payments) != 0 {
		t.Errorf("--older-than 3h: waiting = %+v, want none (held for 2h)", r.Waiting.Payments)
	}
}

// runReconcile runs `paystream reconcile --json` with args and decodes its
// report.
func runReconcile(t *testing.T, args ...string) (reconcileJSON, string, int) {
	t.Helper()
	out, stderr, code := runPaystream(t, append(slices.Clone(args), "--json")...)
	var r reconcileJSON
	if code == 0 || code == 3 {
		if err := json.Unmarshal([]byte(out), &r); err != nil {
			t.Fatalf("reconcile --json: %v:\n%s\nstderr:\n%s", err, out, stderr)
		}
	}
	return r, stderr, code
}
