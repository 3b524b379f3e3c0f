package main

import (
	"strings"
	"testing"
	"time"

	"github.com/paystream/paystream/internal/reconcile"
	"github.com/paystream/paystream/internal/store"
)

// TestReconcileHelpAndErrors: --help shows an example and the exit
// statuses; missing settings fail with status 1 and a sentence naming the
// setting, before anything is dialed.
func TestReconcileHelpAndErrors(t *testing.T) {
	t.Parallel()
	r := paystream.Run(t, nil, "reconcile", "--help")
	if r.Code != 0 || !strings.Contains(r.Stdout, "Example:") || !strings.Contains(r.Stdout, "paystream reconcile --since") || !strings.Contains(r.Stdout, "exits 3") {
		t.Errorf("reconcile --help: exit %d, stdout:\n%s", r.Code, r.Stdout)
	}
	for _, c := range []struct {
		env  []string
		args []string
		want string
	}{
		{nil, nil, "--kafka-brokers"},
		{[]string{"PAYSTREAM_KAFKA_BROKERS=127.0.0.1:1"}, nil, "--database-url"},
		{[]string{"PAYSTREAM_KAFKA_BROKERS=127.0.0.1:1"}, []string{"--gateway"}, "--gateway: no sources file"},
	} {
		r := paystream.Run(t, c.env, append([]string{"reconcile"}, c.args...)...)
		if r.Code != 1 || !strings.Contains(r.Stderr, c.want) {
			t.Errorf("reconcile %v with %v: exit %d, stderr %q; want 1 naming %q", c.args, c.env, r.Code, r.Stderr, c.want)
		}
	}
}

// TestPrintReconcile: the text report names each finding with what to
// look at, and ends with the verdict.
func TestPrintReconcile(t *testing.T) {
	rep := &reconcile.Report{Since: time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC), OlderThan: "1h0m0s"}
	var out strings.Builder
	if err := printReconcile(&out, rep); err != nil {
		t.Fatal(err)
	}
	if !strings.HasSuffix(out.String(), "\nno drift\n") {
		t.Errorf("clean report does not end with \"no drift\":\n%s", out.String())
	}
	rep.Ledger.Drifted = 1
	rep.Ledger.Drift = []reconcile.PaymentDrift{{PaymentKey: "acme:p1", Status: "refunded", Problems: []string{"ledger movements do not add up"},
		Expected: map[string]int64{}, Actual: map[string]int64{"merchant_payable/BRL": -5000, "gateway_receivable/BRL": 5000}}}
	rep.Waiting.Payments = []store.Waiting{{PaymentKey: "acme:p2", Held: true, HeldReason: "bad", Deliveries: 1, Reasons: []string{"quarantined"}, Since: rep.Since}}
	rep.StateEvents.Missing, rep.StateEvents.MissingEvents = 1, []string{"acme:p3:2"}
	rep.DLQ.NotReplayed, rep.DLQ.Unreplayed = 1, []string{"0/7"}
	out.Reset()
	if err := printReconcile(&out, rep); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		"ledger drift: acme:p1 (refunded): ledger movements do not add up\n  expected (none)\n  ledger   gateway_receivable/BRL=5000 merchant_payable/BRL=-5000\n",
		"waiting: acme:p2 held (bad) since 2026-01-02T03:04:05Z: 1 deliveries waiting (quarantined)\n",
		"missing state event: acme:p3:2\n",
		"dlq record never replayed: 0/7 (paystream dlq show 0/7)\n",
		"\ndrift found\n",
	} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("report lacks %q:\n%s", want, out.String())
		}
	}
}
