package e2e

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/prometheus/client_golang/prometheus"
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

// retentionRig is what a retention test runs on: a schema of its own, a
// raw topic of one partition and a group, the clock its processors read,
// and how many records were produced, so that a wait covers them all.
type retentionRig struct {
	db      *testenv.DB
	brokers []string
	raw     string
	group   string
	clock   *testClock

	mu       sync.Mutex
	produced int
}

func newRetentionRig(t *testing.T, day0 time.Time) *retentionRig {
	t.Helper()
	return &retentionRig{db: testenv.NewDB(t), brokers: testenv.Kafka(t), raw: testenv.Topic(t, "raw", 1), group: testenv.Group(t),
		clock: &testClock{now: day0}}
}

// tryProduce produces recs, counted as produced first so that a wait
// starting meanwhile covers them; it suits goroutines other than the
// test's.
func (r *retentionRig) tryProduce(recs ...*kgo.Record) error {
	r.mu.Lock()
	r.produced += len(recs)
	r.mu.Unlock()
	return testenv.TryProduce(r.brokers, recs...)
}

// produce produces recs and waits until the group's processor stored them.
func (r *retentionRig) produce(t *testing.T, recs ...*kgo.Record) {
	t.Helper()
	if err := r.tryProduce(recs...); err != nil {
		t.Fatal(err)
	}
	r.waitCaughtUp(t)
}

// total is how many records were produced.
func (r *retentionRig) total() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.produced
}

// waitCaughtUp waits until the group's processor stored every record
// produced so far.
func (r *retentionRig) waitCaughtUp(t *testing.T) {
	t.Helper()
	end := int64(r.total())
	testenv.WaitFor(t, 60*time.Second, func() error {
		return testenv.OffsetsBehind(t, r.db.Pool, r.group, r.raw, map[int32]int64{0: end})
	})
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
	ctx := context.Background()
	day0 := time.Date(2031, 3, 1, 12, 0, 0, 0, time.UTC)
	rig := newRetentionRig(t, day0)
	const day = 24 * time.Hour

	rec := func(paymentID, id string, f payment.Fact) *kgo.Record {
		key := "acme:" + paymentID
		f.OccurredAt = rig.clock.Now()
		ev := provider.Event{EventID: id, DedupKey: id, PaymentID: paymentID, Type: "payment." + string(f.Status), Fact: f}
		return &kgo.Record{Topic: rig.raw, Key: []byte(key), Value: envelopeValue(t, "acme", key, ev)}
	}
	fact := func(s payment.Status) payment.Fact {
		return payment.Fact{Status: s, AmountMinor: 1000, Currency: "BRL"}
	}
	runProcessor(t, rig.db.Pool, processor.Config{Brokers: rig.brokers, Topic: rig.raw, Group: rig.group, Now: rig.clock.Now, RetentionInterval: time.Hour})

	aCreated, aPaid := rec("pay_a", "evt_a_created", fact(payment.StatusPending)), rec("pay_a", "evt_a_paid", fact(payment.StatusPaid))
	poison := rec("pay_q", "evt_q_paid", payment.Fact{Status: "no_such_status", AmountMinor: 1, Currency: "BRL"})
	rig.produce(t, aCreated, aPaid, poison)
	testenv.WaitFor(t, 30*time.Second, func() error {
		parts, err := store.ListPartitions(ctx, rig.db.Pool)
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
		cfg.Now, cfg.DeliveryRetention, cfg.Logger = rig.clock.Now, 7*day, testLogger(t)
		var r processor.RetentionReport
		// The processor's own pass may hold the lock a moment.
		testenv.WaitFor(t, 30*time.Second, func() error {
			var err error
			r, err = processor.Retention(ctx, rig.db.Pool, cfg)
			if err != nil && !errors.Is(err, processor.ErrRetentionBusy) {
				t.Fatal(err)
			}
			return err
		})
		return r
	}
	rig.clock.set(day0.Add(10 * day))
	r10 := retention(processor.RetentionConfig{})
	bCreated, bPaid := rec("pay_b", "evt_b_created", fact(payment.StatusPending)), rec("pay_b", "evt_b_paid", fact(payment.StatusPaid))
	rig.produce(t, bCreated, bPaid)

	rig.clock.set(day0.Add(40 * day))
	r := retention(processor.RetentionConfig{})
	t.Logf("retention on day 40: %+v", r)
	if n := r10.KeptWaiting + r.KeptWaiting; n != 1 {
		t.Errorf("kept %d waiting deliveries of dropped partitions, want the quarantined one", n)
	}
	parts, err := store.ListPartitions(ctx, rig.db.Pool)
	if err != nil {
		t.Fatal(err)
	}
	cutoff := rig.clock.Now().Add(-7 * day)
	for _, p := range parts {
		if p.Day.Add(day).Before(cutoff) {
			t.Errorf("partition %s is past the delivery retention and still there", p.Name)
		}
	}
	if len(parts) == 0 || !parts[len(parts)-1].Day.After(rig.clock.Now()) {
		t.Errorf("no partition ahead of day 40: %v", parts)
	}
	if n := count(t, rig.db.Pool, `SELECT count(*) FROM deliveries WHERE payment_key IN ('acme:pay_a', 'acme:pay_b')`); n != 0 {
		t.Errorf("%d deliveries of days 0 and 10 left, want 0", n)
	}
	if n := count(t, rig.db.Pool, `SELECT count(*) FROM deliveries WHERE payment_key = 'acme:pay_q' AND status = 'quarantined'`); n != 1 {
		t.Errorf("quarantined deliveries = %d, want 1 (never dropped)", n)
	}
	var keys []string
	rows, err := rig.db.Pool.Query(ctx, `SELECT dedup_key FROM dedup_keys ORDER BY dedup_key`)
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
	if want := []string{"evt_b_created", "evt_b_paid", "evt_q_paid"}; !slices.Equal(keys, want) {
		t.Errorf("dedup keys on day 40 = %v, want %v", keys, want)
	}

	// Redeliveries on day 40.
	transitions := count(t, rig.db.Pool, `SELECT count(*) FROM payment_transitions`)
	movements := count(t, rig.db.Pool, `SELECT count(*) FROM ledger_movements`)
	rig.produce(t, &kgo.Record{Topic: rig.raw, Key: bPaid.Key, Value: bPaid.Value}, &kgo.Record{Topic: rig.raw, Key: aPaid.Key, Value: aPaid.Value})
	var status, reason string
	if err := rig.db.Pool.QueryRow(ctx, `SELECT status, COALESCE(reason, '') FROM deliveries WHERE dedup_key = 'evt_b_paid'`).Scan(&status, &reason); err != nil {
		t.Fatal(err)
	}
	if status != "ignored" || reason != "duplicate_event" {
		t.Errorf("redelivery inside the dedup window: %s/%s, want ignored/duplicate_event", status, reason)
	}
	if err := rig.db.Pool.QueryRow(ctx, `SELECT status, COALESCE(reason, '') FROM deliveries WHERE dedup_key = 'evt_a_paid'`).Scan(&status, &reason); err != nil {
		t.Fatal(err)
	}
	if status != "ignored" || reason != payment.ReasonDuplicateFact {
		t.Errorf("redelivery after the dedup window: %s/%s, want ignored/%s", status, reason, payment.ReasonDuplicateFact)
	}
	if n := count(t, rig.db.Pool, `SELECT count(*) FROM payment_transitions`); n != transitions {
		t.Errorf("transitions %d after the redeliveries, want %d", n, transitions)
	}
	if n := count(t, rig.db.Pool, `SELECT count(*) FROM ledger_movements`); n != movements {
		t.Errorf("ledger movements %d after the redeliveries, want %d", n, movements)
	}
	// The dry run of the next day changes nothing.
	rig.clock.set(day0.Add(41 * day))
	before := count(t, rig.db.Pool, `SELECT count(*) FROM dedup_keys`)
	dry := retention(processor.RetentionConfig{DryRun: true})
	if len(dry.Created) != 1 || count(t, rig.db.Pool, `SELECT count(*) FROM dedup_keys`) != before {
		t.Errorf("dry run: %+v; it must report one partition to create and change nothing", dry)
	}
}

type errString string

func (e errString) Error() string { return string(e) }

// TestRetentionRecoversAfterThreeDaysWithoutProcessor: a processor runs
// on day 0 (its retention pass creates the partitions of days 0–3), then
// none runs for three and a half days. On day 4 a processor comes back
// whose retention does not run (as when every pass fails), and the
// deliveries of days 4 and 5 land in the default partition. Then, while
// records keep coming and one batch transaction holds a day-5 row
// uncommitted, retention runs: it must succeed, create the partitions of
// days 4 and 5 with their rows moved in, and lose nothing. Before, it
// created only the coming days' partitions, so day 4's rows stayed in the
// default partition, and day 5's creation moved the rows it saw and then
// found the open batch's row in the default partition at ATTACH (23514):
// every hourly run failed the same way while records came.
func TestRetentionRecoversAfterThreeDaysWithoutProcessor(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	const day = 24 * time.Hour
	day0 := time.Date(2031, 6, 1, 12, 0, 0, 0, time.UTC)
	rig := newRetentionRig(t, day0)

	var mu sync.Mutex
	payments := 0
	records := func(n int) []*kgo.Record {
		mu.Lock()
		defer mu.Unlock()
		var recs []*kgo.Record
		for range n {
			payments++
			id := fmt.Sprintf("pay_%d", payments)
			for _, s := range []payment.Status{payment.StatusPending, payment.StatusPaid} {
				ev := provider.Event{EventID: id + "_" + string(s), DedupKey: id + "_" + string(s), PaymentID: id, Type: "payment." + string(s),
					Fact: payment.Fact{Status: s, AmountMinor: 1000, Currency: "BRL", OccurredAt: rig.clock.Now()}}
				recs = append(recs, &kgo.Record{Topic: rig.raw, Key: []byte("acme:" + id), Value: envelopeValue(t, "acme", "acme:"+id, ev)})
			}
		}
		return recs
	}
	reg := prometheus.NewRegistry()
	lastSuccess := func(reg *prometheus.Registry) float64 {
		t.Helper()
		return testenv.Gather(t, reg).Sum("paystream_retention_last_success_timestamp_seconds", nil)
	}

	a := runProcessor(t, rig.db.Pool, processor.Config{Brokers: rig.brokers, Topic: rig.raw, Group: rig.group, Now: rig.clock.Now, RetentionInterval: time.Hour, Registerer: reg})
	rig.produce(t, records(10)...)
	testenv.WaitFor(t, 30*time.Second, func() error {
		if got, want := lastSuccess(reg), float64(day0.Unix()); got != want {
			return fmt.Errorf("the processor's last retention success is %v, want day 0 (%v)", got, want)
		}
		return nil
	})
	a.Stop()

	rig.clock.set(day0.Add(3*day + 13*time.Hour)) // day 4, 01:00: its partition was never made
	runProcessor(t, rig.db.Pool, processor.Config{Brokers: rig.brokers, Topic: rig.raw, Group: rig.group, Now: rig.clock.Now, RetentionInterval: -1})
	rig.produce(t, records(10)...)
	rig.clock.set(day0.Add(4*day + 13*time.Hour)) // day 5, 01:00
	rig.produce(t, records(10)...)
	stuck := count(t, rig.db.Pool, `SELECT count(*) FROM deliveries_default`)
	if stuck != 40 {
		t.Fatalf("%d deliveries in the default partition before retention, want the 40 of days 4 and 5", stuck)
	}

	// Records keep coming while retention runs, and one batch has stored a
	// day-5 row without committing yet.
	stop, streamed := make(chan struct{}), make(chan error, 1)
	go func() {
		defer close(streamed)
		for {
			select {
			case <-stop:
				return
			case <-time.After(20 * time.Millisecond):
			}
			if err := rig.tryProduce(records(1)...); err != nil {
				streamed <- err
				return
			}
		}
	}()
	open, committed := make(chan struct{}), make(chan error, 1)
	go func() {
		committed <- pgx.BeginFunc(ctx, rig.db.Pool, func(tx pgx.Tx) error {
			_, err := tx.Exec(ctx, `
				INSERT INTO deliveries (id, recorded_at, source, dedup_key, event_type, payment_key, status, topic, partition, kafka_offset, received_at)
				VALUES (nextval('deliveries_id_seq'), $1, 'acme', 'open_batch', 'payment.paid', 'acme:open_batch', 'processed', 'other', 0, 0, $1)`, rig.clock.Now())
			close(open)
			if err == nil {
				time.Sleep(500 * time.Millisecond)
			}
			return err
		})
	}()
	<-open
	mreg := prometheus.NewRegistry()
	m, err := processor.NewRetentionMetrics(mreg)
	if err != nil {
		t.Fatal(err)
	}
	r, err := processor.Retention(ctx, rig.db.Pool, processor.RetentionConfig{Now: rig.clock.Now, Logger: testLogger(t), Metrics: m})
	close(stop)
	if err := <-committed; err != nil {
		t.Fatalf("the open batch: %v", err)
	}
	if err := <-streamed; err != nil {
		t.Fatal(err)
	}
	if err != nil {
		t.Fatalf("retention after three days without a processor: %v", err)
	}
	rig.waitCaughtUp(t)
	t.Logf("retention on day 5: %+v", r)

	for _, d := range []int{4, 5, 6, 7, 8} {
		if p := store.PartitionOf(day0.Add(time.Duration(d) * day)).Name; !slices.Contains(r.Created, p) {
			t.Errorf("retention created %v, not day %d's %s", r.Created, d, p)
		}
	}
	if r.MovedFromDefault < int64(stuck) {
		t.Errorf("moved %d rows from the default partition, want at least the %d stuck there", r.MovedFromDefault, stuck)
	}
	if n := count(t, rig.db.Pool, `SELECT count(*) FROM deliveries_default`); n != 0 {
		t.Errorf("%d deliveries left in the default partition", n)
	}
	if n := count(t, rig.db.Pool, `
		SELECT count(*) FROM deliveries
		 WHERE tableoid::regclass::text <> 'deliveries_p' || to_char(recorded_at AT TIME ZONE 'UTC', 'YYYYMMDD')`); n != 0 {
		t.Errorf("%d deliveries outside their day's partition", n)
	}
	want := rig.total()
	if n := count(t, rig.db.Pool, `SELECT count(DISTINCT dedup_key) FROM deliveries WHERE topic = $1 AND status = 'processed'`, rig.raw); n != want {
		t.Errorf("%d records stored and processed, want every one of the %d produced", n, want)
	}
	if n := count(t, rig.db.Pool, `SELECT count(*) FROM deliveries WHERE dedup_key = 'open_batch'`); n != 1 {
		t.Errorf("the open batch's delivery: %d rows, want 1", n)
	}
	if n, want := count(t, rig.db.Pool, `SELECT count(*) FROM payment_transitions`), want; n != want {
		t.Errorf("%d transitions, want %d (created and paid of each payment)", n, want)
	}
	if got, want := lastSuccess(mreg), float64(rig.clock.Now().Unix()); got != want {
		t.Errorf("last success gauge %v after the run, want %v", got, want)
	}
}
