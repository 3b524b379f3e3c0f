package main

import (
	"bytes"
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/paystream/paystream/internal/envelope"
	"github.com/paystream/paystream/internal/payment"
	"github.com/paystream/paystream/internal/testenv"
)

func TestMain(m *testing.M) { testenv.Main(m) }

// consumeUntil runs Consume with a new client of group until handle has
// seen the event last, and returns the printed transitions.
func consumeUntil(t *testing.T, brokers []string, topic, group string, last string) []string {
	t.Helper()
	cl, err := NewClient(brokers, topic, group)
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	var out bytes.Buffer
	var ids []string
	err = Consume(ctx, cl, NewDeduper(), func(ev StateEvent) error {
		ids = append(ids, ev.EventID)
		if err := PrintTransition(&out, ev); err != nil {
			return err
		}
		if ev.EventID == last {
			cancel()
		}
		return nil
	})
	if ids[len(ids)-1] != last || err != context.Canceled {
		t.Fatalf("consume: %v after %q; want to have seen %s", err, ids, last)
	}
	return strings.Split(strings.TrimSpace(out.String()), "\n")
}

// TestConsumeOnceInOrderCommittedOnly: on a state topic written in Kafka
// transactions, the example consumer prints each committed transition once,
// in version order per payment: nothing of an aborted transaction
// (read_committed), and nothing twice when the relay re-sends an event (a
// second transaction carrying A v2 again, as after a relay crash). A second
// run of the same group starts after what the first handled.
func TestConsumeOnceInOrderCommittedOnly(t *testing.T) {
	t.Parallel()
	brokers := testenv.Kafka(t)
	topic := testenv.Topic(t, "state", 3)
	group := testenv.Group(t)
	a1 := testenv.StateEvent("acme:pay_a", 1, "", payment.StatusPending, "status", 0)
	a2 := testenv.StateEvent("acme:pay_a", 2, payment.StatusPending, payment.StatusPaid, "capture", 1050)
	testenv.PublishStates(t, brokers, topic,
		testenv.StateBatch{Events: []envelope.State{a1, a2}},
		testenv.StateBatch{Events: []envelope.State{testenv.StateEvent("acme:pay_a", 3, payment.StatusPaid, payment.StatusRefunded, "refund", 1050)}, Abort: true},
		testenv.StateBatch{Events: []envelope.State{a2, testenv.StateEvent("acme:pay_a", 3, payment.StatusPaid, payment.StatusPartiallyRefunded, "refund", 50)}},
		testenv.StateBatch{Events: []envelope.State{testenv.StateEvent("acme:pay_b", 1, "", payment.StatusPending, "status", 0)}},
	)
	got := consumeUntil(t, brokers, topic, group, "acme:pay_b:1")
	var forA []string
	for _, l := range got {
		if strings.Contains(l, "acme:pay_a") {
			forA = append(forA, l)
		}
	}
	want := []string{
		"2026-11-29T18:00:01Z acme:pay_a v1 (new) -> pending (status 0 BRL)",
		"2026-11-29T18:00:02Z acme:pay_a v2 pending -> paid (capture 1050 BRL)",
		"2026-11-29T18:00:03Z acme:pay_a v3 paid -> partially_refunded (refund 50 BRL)",
	}
	if fmt.Sprint(forA) != fmt.Sprint(want) || len(got) != 4 {
		t.Errorf("printed:\n%s\nwant payment A's lines\n%s\nand one for B", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}

	testenv.PublishStates(t, brokers, topic, testenv.StateBatch{Events: []envelope.State{testenv.StateEvent("acme:pay_c", 1, "", payment.StatusPending, "status", 0)}})
	if again := consumeUntil(t, brokers, topic, group, "acme:pay_c:1"); len(again) != 1 {
		t.Errorf("second run of the group printed %q, want only pay_c's event", again)
	}
}
