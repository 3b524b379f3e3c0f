package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/paystream/paystream/internal/envelope"
	"github.com/paystream/paystream/internal/payment"
	"github.com/paystream/paystream/internal/testenv"
	"github.com/paystream/paystream/schemas"
)

// tailFixture publishes, on a fresh 3-partition state topic: payment A
// created, paid (one transaction, with B created), a refund of A in an
// aborted transaction, then A partially refunded.
func tailFixture(t *testing.T) (env []string) {
	t.Helper()
	brokers := testenv.Kafka(t)
	topic := testenv.Topic(t, "state", 3)
	testenv.PublishStates(t, brokers, topic,
		testenv.StateBatch{Events: []envelope.State{
			testenv.StateEvent("acme:pay_a", 1, "", payment.StatusPending, "status", 0),
			testenv.StateEvent("acme:pay_b", 1, "", payment.StatusPending, "status", 0),
			testenv.StateEvent("acme:pay_a", 2, payment.StatusPending, payment.StatusPaid, "capture", 1050),
		}},
		testenv.StateBatch{Events: []envelope.State{testenv.StateEvent("acme:pay_a", 3, payment.StatusPaid, payment.StatusRefunded, "refund", 1050)}, Abort: true},
		testenv.StateBatch{Events: []envelope.State{testenv.StateEvent("acme:pay_a", 3, payment.StatusPaid, payment.StatusPartiallyRefunded, "refund", 50)}},
	)
	return []string{"PAYSTREAM_KAFKA_BROKERS=" + strings.Join(brokers, ","), "PAYSTREAM_STATE_TOPIC=" + topic}
}

// TestTail: `paystream tail --payment --json` prints exactly the payment's
// committed events, in version order, each a valid payment-state value —
// never the aborted transaction's (read_committed) — and stops at --max;
// the readable form shows every payment's transitions.
func TestTail(t *testing.T) {
	t.Parallel()
	env := tailFixture(t)

	r := paystream.Run(t, env, "tail", "--from-beginning", "--payment", "acme:pay_a", "--json", "--max", "3")
	if r.Code != 0 {
		t.Fatalf("tail: exit %d\n%s", r.Code, r.Stderr)
	}
	lines := strings.Split(strings.TrimSpace(r.Stdout), "\n")
	var got []string
	for _, l := range lines {
		if err := schemas.Validate(schemas.PaymentState, []byte(l)); err != nil {
			t.Errorf("tail --json line does not match %s: %v\n%s", schemas.PaymentState, err, l)
		}
		var ev envelope.State
		if err := json.Unmarshal([]byte(l), &ev); err != nil {
			t.Fatal(err)
		}
		got = append(got, fmt.Sprintf("%s v%d %s", ev.PaymentKey, ev.Version, ev.Status))
	}
	want := []string{"acme:pay_a v1 pending", "acme:pay_a v2 paid", "acme:pay_a v3 partially_refunded"}
	if strings.Join(got, "|") != strings.Join(want, "|") {
		t.Errorf("tail --payment acme:pay_a --json --max 3:\n got %q\nwant %q", got, want)
	}

	r = paystream.Run(t, env, "tail", "--from-beginning", "--max", "4")
	if r.Code != 0 {
		t.Fatalf("tail: exit %d\n%s", r.Code, r.Stderr)
	}
	for _, want := range []string{"acme:pay_a  v2  pending → paid  capture 1050 BRL", "acme:pay_b  v1  ∅ → pending", "v3  paid → partially_refunded  refund 50 BRL"} {
		if !strings.Contains(r.Stdout, want) {
			t.Errorf("tail output lacks %q:\n%s", want, r.Stdout)
		}
	}
	if strings.Contains(r.Stdout, "→ refunded") {
		t.Errorf("tail printed the aborted transaction's event:\n%s", r.Stdout)
	}
}

// TestTailStopsOnInterrupt: without --max, tail runs until Ctrl-C, then
// exits 0 having printed every committed event.
func TestTailStopsOnInterrupt(t *testing.T) {
	t.Parallel()
	env := tailFixture(t)
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	cmd := paystream.Command(ctx, env, "tail", "--from-beginning")
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	sc := bufio.NewScanner(stdout)
	var lines []string
	for len(lines) < 4 && sc.Scan() {
		lines = append(lines, sc.Text())
	}
	if len(lines) < 4 {
		t.Fatalf("tail printed %d lines before ending, want 4: %q", len(lines), lines)
	}
	if err := cmd.Process.Signal(os.Interrupt); err != nil {
		t.Fatal(err)
	}
	for sc.Scan() {
		lines = append(lines, sc.Text())
	}
	if err := cmd.Wait(); err != nil || ctx.Err() != nil {
		t.Fatalf("tail after Ctrl-C: %v (context %v), want exit 0", err, ctx.Err())
	}
	if len(lines) != 4 {
		t.Errorf("tail printed %d lines, want the 4 committed events: %q", len(lines), lines)
	}
}
