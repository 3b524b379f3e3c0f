package e2e

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/paystream/paystream/internal/payment"
	"github.com/paystream/paystream/internal/provider"
	"github.com/paystream/paystream/internal/store"
	"github.com/paystream/paystream/internal/testenv"
	"github.com/paystream/paystream/processor"
)

// testClock is a clock a test moves by hand.
type testClock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *testClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *testClock) set(t time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = t
}

// TestRetention: with an injected clock, payment A is paid on day 0 (and a
// poison record of payment Q is quarantined), payment B on day 10. On day
// 40, retention (7-day deliveries, 35-day dedup keys; run on days 10 and
// 40) has dropped the
// partitions of days 0 and 10 — but moved the quarantined delivery out
// first, and kept its dedup key; A's dedup keys are gone, B's remain. A
// redelivery of B's paid event (inside the dedup window) is still
// duplicate_event; one of A's (outside it) is stored as a new delivery and
// the machine ignores it (duplicate_fact): no new transition, no movement.
// The processor's own retention pass created the partitions of day 0 at
// start.
func TestRetention(t *testing.T) {
	t.Parallel()
	db := testenv.NewDB(t)
	brokers := testenv.Kafka(t)
	raw := testenv.Topic(t, "raw", 1)
	group := testenv.Group(t)
	ctx := context.Background()
	day0 := time.Date(2031, 3, 1, 12, 0, 0, 0, time.UTC)
	clock := &testClock{now: day0}
	const day = 24 * time.Hour

	rec := func(paymentID, id string, f payment.Fact) *kgo.Record {
		key := "acme:" + paymentID
		f.OccurredAt = clock.Now()
		ev := provider.Event{EventID: id, DedupKey: id, PaymentID: paymentID, Type: "payment." + string(f.Status), Fact: f}
		return &kgo.Record{Topic: raw, Key: []byte(key), Value: envelopeValue(t, "acme", key, ev)}
	}
	fact := func(s payment.Status) payment.Fact {
		return payment.Fact{Status: s, AmountMinor: 1000, Currency: "BRL"}
	}
	processed := 0
	produce := func(recs ...*kgo.Record) {
		t.Helper()
		produceRaw(t, brokers, recs...)
		processed += len(recs)
		testenv.WaitFor(t, 60*time.Second, func() error {
			return caughtUp(t, db.Pool, group, raw, map[int32]int64{0: int64(processed)})
		})
	}
	runProcessor(t, db.Pool, processor.Config{Brokers: brokers, Topic: raw, Group: group, Now: clock.Now, RetentionInterval: time.Hour})

	aCreated, aPaid := rec("pay_a", "evt_a_created", fact(payment.StatusPending)), rec("pay_a", "evt_a_paid", fact(payment.StatusPaid))
	poison := rec("pay_q", "evt_q_paid", payment.Fact{Status: "no_such_status", AmountMinor: 1, Currency: "BRL"})
	produce(aCreated, aPaid, poison)
	testenv.WaitFor(t, 30*time.Second, func() error {
		parts, err := store.ListPartitions(ctx, db.Pool)
		if err != nil {
			return err
		}
		for _, p := range parts {
			if p.Day.Equal(day0.Truncate(day)) {
				return nil
			}
		}
		return errString("the processor's retention pass has not created day 0's partition")
	})

	retention := func(cfg processor.RetentionConfig) processor.RetentionReport {
		t.Helper()
		cfg.Now, cfg.DeliveryRetention, cfg.Logger = clock.Now, 7*day, testLogger(t)
		var r processor.RetentionReport
		// The processor's own pass may hold the lock a moment.
		testenv.WaitFor(t, 30*time.Second, func() error {
			var err error
			r, err = processor.Retention(ctx, db.Pool, cfg)
			if err != nil && !errors.Is(err, processor.ErrRetentionBusy) {
				t.Fatal(err)
			}
			return err
		})
		return r
	}
	clock.set(day0.Add(10 * day))
	r10 := retention(processor.RetentionConfig{})
	bCreated, bPaid := rec("pay_b", "evt_b_created", fact(payment.StatusPending)), rec("pay_b", "evt_b_paid", fact(payment.StatusPaid))
	produce(bCreated, bPaid)

	clock.set(day0.Add(40 * day))
	r := retention(processor.RetentionConfig{})
	t.Logf("retention on day 40: %+v", r)
	if n := r10.KeptWaiting + r.KeptWaiting; n != 1 {
		t.Errorf("kept %d waiting deliveries of dropped partitions, want the quarantined one", n)
	}
	parts, err := store.ListPartitions(ctx, db.Pool)
	if err != nil {
		t.Fatal(err)
	}
	cutoff := clock.Now().Add(-7 * day)
	for _, p := range parts {
		if p.Day.Add(day).Before(cutoff) {
			t.Errorf("partition %s is past the delivery retention and still there", p.Name)
		}
	}
	if len(parts) == 0 || !parts[len(parts)-1].Day.After(clock.Now()) {
		t.Errorf("no partition ahead of day 40: %v", parts)
	}
	if n := count(t, db.Pool, `SELECT count(*) FROM deliveries WHERE payment_key IN ('acme:pay_a', 'acme:pay_b')`); n != 0 {
		t.Errorf("%d deliveries of days 0 and 10 left, want 0", n)
	}
	if n := count(t, db.Pool, `SELECT count(*) FROM deliveries WHERE payment_key = 'acme:pay_q' AND status = 'quarantined'`); n != 1 {
		t.Errorf("quarantined deliveries = %d, want 1 (never dropped)", n)
	}
	var keys []string
	rows, err := db.Pool.Query(ctx, `SELECT dedup_key FROM dedup_keys ORDER BY dedup_key`)
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var k string
		if err := rows.Scan(&k); err != nil {
			t.Fatal(err)
		}
		keys = append(keys, k)
	}
	if want := []string{"evt_b_created", "evt_b_paid", "evt_q_paid"}; !equalStrings(keys, want) {
		t.Errorf("dedup keys on day 40 = %v, want %v", keys, want)
	}

	// Redeliveries on day 40.
	transitions := count(t, db.Pool, `SELECT count(*) FROM payment_transitions`)
	movements := count(t, db.Pool, `SELECT count(*) FROM ledger_movements`)
	produce(&kgo.Record{Topic: raw, Key: bPaid.Key, Value: bPaid.Value}, &kgo.Record{Topic: raw, Key: aPaid.Key, Value: aPaid.Value})
	var status, reason string
	if err := db.Pool.QueryRow(ctx, `SELECT status, COALESCE(reason, '') FROM deliveries WHERE dedup_key = 'evt_b_paid'`).Scan(&status, &reason); err != nil {
		t.Fatal(err)
	}
	if status != "ignored" || reason != "duplicate_event" {
		t.Errorf("redelivery inside the dedup window: %s/%s, want ignored/duplicate_event", status, reason)
	}
	if err := db.Pool.QueryRow(ctx, `SELECT status, COALESCE(reason, '') FROM deliveries WHERE dedup_key = 'evt_a_paid'`).Scan(&status, &reason); err != nil {
		t.Fatal(err)
	}
	if status != "ignored" || reason != payment.ReasonDuplicateFact {
		t.Errorf("redelivery after the dedup window: %s/%s, want ignored/%s", status, reason, payment.ReasonDuplicateFact)
	}
	if n := count(t, db.Pool, `SELECT count(*) FROM payment_transitions`); n != transitions {
		t.Errorf("transitions %d after the redeliveries, want %d", n, transitions)
	}
	if n := count(t, db.Pool, `SELECT count(*) FROM ledger_movements`); n != movements {
		t.Errorf("ledger movements %d after the redeliveries, want %d", n, movements)
	}
	// The dry run of the next day changes nothing.
	clock.set(day0.Add(41 * day))
	before := count(t, db.Pool, `SELECT count(*) FROM dedup_keys`)
	dry := retention(processor.RetentionConfig{DryRun: true})
	if len(dry.Created) != 1 || count(t, db.Pool, `SELECT count(*) FROM dedup_keys`) != before {
		t.Errorf("dry run: %+v; it must report one partition to create and change nothing", dry)
	}
}

type errString string

func (e errString) Error() string { return string(e) }

func equalStrings(a, b []string) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}
