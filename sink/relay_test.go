package sink_test

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"reflect"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/paystream/paystream/internal/envelope"
	"github.com/paystream/paystream/internal/testenv"
	"github.com/paystream/paystream/sink"
)

// bundle is what each test gets: its own schema and state topic.
type bundle struct {
	db      *testenv.DB
	brokers []string
	topic   string
}

func setup(t *testing.T, partitions int) *bundle {
	t.Helper()
	return &bundle{db: testenv.NewDB(t), brokers: testenv.Kafka(t), topic: testenv.Topic(t, "state", partitions)}
}

// relay is a running sink.Relay with its own metrics registry.
type relay struct {
	reg  *prometheus.Registry
	stop func() // cancels Run and waits for it to return
}

func (b *bundle) startRelay(t *testing.T) *relay {
	t.Helper()
	reg := prometheus.NewRegistry()
	r, err := sink.New(b.db.Pool, sink.Config{
		Brokers: b.brokers, Topic: b.topic, PollInterval: 10 * time.Millisecond,
		Logger: slog.New(slog.DiscardHandler), Registerer: reg,
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	var once sync.Once
	stop := func() {
		once.Do(func() {
			cancel()
			select {
			case err := <-done:
				if err != nil {
					t.Errorf("relay Run: %v", err)
				}
			case <-time.After(30 * time.Second):
				t.Errorf("relay Run did not return within 30s of cancel")
			}
		})
	}
	t.Cleanup(stop)
	return &relay{reg: reg, stop: stop}
}

// metric returns the value of the relay's gauge or counter name.
func (r *relay) metric(t *testing.T, name string) float64 {
	t.Helper()
	mfs, err := r.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name || len(mf.GetMetric()) != 1 {
			continue
		}
		m := mf.GetMetric()[0]
		switch {
		case m.GetGauge() != nil:
			return m.GetGauge().GetValue()
		case m.GetCounter() != nil:
			return m.GetCounter().GetValue()
		}
	}
	t.Fatalf("relay has no metric %s", name)
	return 0
}

// outboxRow is an event the processor would have written.
type outboxRow struct {
	id      int64
	key     string
	version int64
	eventID string
	payload []byte
}

// insertEvent writes what the outbox's foreign key needs (the payment and
// its transition) and the outbox row for key at version, through q (a pool
// or an open transaction).
func insertEvent(t *testing.T, q interface {
	Exec(context.Context, string, ...any) (pgconn.CommandTag, error)
	QueryRow(context.Context, string, ...any) pgx.Row
}, key string, version int64) outboxRow {
	t.Helper()
	ctx := context.Background()
	row := outboxRow{key: key, version: version, eventID: envelope.StateEventID(key, version)}
	row.payload, _ = json.Marshal(map[string]any{"event_id": row.eventID, "payment_key": key, "version": version})
	if _, err := q.Exec(ctx, `
		INSERT INTO payments (payment_key, source, payment_id, status, version, state) VALUES ($1, 'acme', $1, 'paid', $2, '{}')
		ON CONFLICT (payment_key) DO UPDATE SET version = EXCLUDED.version`, key, version); err != nil {
		t.Fatalf("insert payment %s: %v", key, err)
	}
	if _, err := q.Exec(ctx, `
		INSERT INTO payment_transitions (payment_key, version, from_status, to_status, kind) VALUES ($1, $2, 'pending', 'paid', 'capture')`,
		key, version); err != nil {
		t.Fatalf("insert transition %s v%d: %v", key, version, err)
	}
	if err := q.QueryRow(ctx, `INSERT INTO outbox (payment_key, version, event_id, payload) VALUES ($1, $2, $3, $4) RETURNING id`,
		key, version, row.eventID, row.payload).Scan(&row.id); err != nil {
		t.Fatalf("insert outbox %s: %v", row.eventID, err)
	}
	return row
}

// sameJSON reports whether a and b are the same JSON value.
func sameJSON(t *testing.T, a, b []byte) bool {
	t.Helper()
	var va, vb any
	if err := json.Unmarshal(a, &va); err != nil {
		t.Fatalf("%s: %v", a, err)
	}
	if err := json.Unmarshal(b, &vb); err != nil {
		t.Fatalf("%s: %v", b, err)
	}
	return reflect.DeepEqual(va, vb)
}

func eventID(r *kgo.Record) string {
	for _, h := range r.Headers {
		if h.Key == envelope.HeaderEventID {
			return string(h.Value)
		}
	}
	return ""
}

// consume reads topic from the start until it holds want records (failing
// after timeout) and checks that it holds no more than that.
func consume(t *testing.T, brokers []string, topic string, want int, timeout time.Duration) []*kgo.Record {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.ConsumeTopics(topic), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	var out []*kgo.Record
	for len(out) < want {
		fs := cl.PollFetches(ctx)
		if ctx.Err() != nil {
			t.Fatalf("topic %s: %d records after %s, want %d", topic, len(out), timeout, want)
		}
		fs.EachError(func(_ string, p int32, err error) { t.Fatalf("consume %s/%d: %v", topic, p, err) })
		out = append(out, fs.Records()...)
	}
	if n := endOffsets(t, brokers, topic); n != int64(want) {
		t.Fatalf("topic %s holds %d records, want %d", topic, n, want)
	}
	return out
}

func endOffsets(t *testing.T, brokers []string, topic string) int64 {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	ends, err := kadm.NewClient(cl).ListEndOffsets(context.Background(), topic)
	if err != nil {
		t.Fatal(err)
	}
	var n int64
	ends.Each(func(o kadm.ListedOffset) { n += o.Offset })
	return n
}

func unpublished(t *testing.T, pool *pgxpool.Pool) int {
	t.Helper()
	var n int
	if err := pool.QueryRow(context.Background(), `SELECT count(*) FROM outbox WHERE published_at IS NULL`).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// TestRelayPublishesInIDOrder: on a one-partition topic, the relay produces
// every unpublished row — and no row already published — in outbox id
// order, keyed by payment, with the event id header and the payload (as
// JSON: the outbox stores jsonb, which Postgres re-renders), and marks each
// published.
func TestRelayPublishesInIDOrder(t *testing.T) {
	t.Parallel()
	b := setup(t, 1)
	var want []outboxRow
	// Payments interleaved, each one's versions in order, as the processor
	// writes them.
	for v := int64(1); v <= 3; v++ {
		for _, key := range []string{"acme:pay_b", "acme:pay_a", "acme:pay_c"} {
			want = append(want, insertEvent(t, b.db.Pool, key, v))
		}
	}
	// Already published by an earlier relay: must not be sent again.
	old := insertEvent(t, b.db.Pool, "acme:pay_old", 1)
	if _, err := b.db.Pool.Exec(context.Background(), `UPDATE outbox SET published_at = now() WHERE id = $1`, old.id); err != nil {
		t.Fatal(err)
	}

	r := b.startRelay(t)
	recs := consume(t, b.brokers, b.topic, len(want), 30*time.Second)
	for i, rec := range recs {
		w := want[i]
		if string(rec.Key) != w.key || eventID(rec) != w.eventID || !sameJSON(t, rec.Value, w.payload) {
			t.Errorf("record %d = key %q event-id %q value %s; want outbox row %d: key %q event-id %q value %s",
				i, rec.Key, eventID(rec), rec.Value, w.id, w.key, w.eventID, w.payload)
		}
	}
	testenv.Eventually(t, 10*time.Second, func() bool {
		return unpublished(t, b.db.Pool) == 0 && r.metric(t, "paystream_sink_published_total") == float64(len(want))
	}, "every row marked published and counted")
	if got := r.metric(t, "paystream_sink_active"); got != 1 {
		t.Errorf("paystream_sink_active = %v, want 1", got)
	}

	// Rows committed later are relayed too, after the others.
	late := insertEvent(t, b.db.Pool, "acme:pay_a", 4)
	recs = consume(t, b.brokers, b.topic, len(want)+1, 30*time.Second)
	if last := recs[len(recs)-1]; eventID(last) != late.eventID {
		t.Errorf("last record = %s, want %s", eventID(last), late.eventID)
	}
}

// TestRelayKeysByPayment: on a multi-partition topic each payment's events
// land on one partition, in version order.
func TestRelayKeysByPayment(t *testing.T) {
	t.Parallel()
	b := setup(t, 3)
	const payments, versions = 12, 4
	for v := int64(1); v <= versions; v++ {
		for p := range payments {
			insertEvent(t, b.db.Pool, fmt.Sprintf("acme:pay_%02d", p), v)
		}
	}
	b.startRelay(t)
	recs := consume(t, b.brokers, b.topic, payments*versions, 30*time.Second)
	partition := map[string]int32{}
	next := map[string]int64{}
	for _, rec := range recs { // in offset order within each partition
		key := string(rec.Key)
		if p, ok := partition[key]; ok && p != rec.Partition {
			t.Errorf("%s on partitions %d and %d", key, p, rec.Partition)
		}
		partition[key] = rec.Partition
		next[key]++
		if want := envelope.StateEventID(key, next[key]); eventID(rec) != want {
			t.Errorf("partition %d offset %d: event %s, want %s (version order per payment)", rec.Partition, rec.Offset, eventID(rec), want)
		}
	}
	if len(partition) != payments {
		t.Errorf("%d payments on the topic, want %d", len(partition), payments)
	}
}

// TestRelayStandbyTakesOver: a second relay on the same outbox stays a
// standby (paystream_sink_active 0, nothing published) while the first holds
// the lock, and takes over, publishing what is new, once the first stops.
func TestRelayStandbyTakesOver(t *testing.T) {
	t.Parallel()
	b := setup(t, 1)
	first := b.startRelay(t)
	testenv.Eventually(t, 10*time.Second, func() bool { return first.metric(t, "paystream_sink_active") == 1 }, "first relay active")

	second := b.startRelay(t)
	// The standby retries the lock every second: watch it through a few
	// attempts while the first relay publishes.
	for i := range 5 {
		insertEvent(t, b.db.Pool, "acme:pay_1", int64(i+1))
		deadline := time.Now().Add(500 * time.Millisecond)
		for time.Now().Before(deadline) {
			if a := second.metric(t, "paystream_sink_active"); a != 0 {
				t.Fatalf("second relay active = %v while the first holds the lock", a)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	consume(t, b.brokers, b.topic, 5, 30*time.Second)
	testenv.Eventually(t, 10*time.Second, func() bool { return first.metric(t, "paystream_sink_published_total") == 5 },
		"the first relay counts the 5 events")
	if got := second.metric(t, "paystream_sink_published_total"); got != 0 {
		t.Errorf("standby published %v, want 0", got)
	}

	first.stop()
	if got := first.metric(t, "paystream_sink_active"); got != 0 {
		t.Errorf("stopped relay active = %v, want 0", got)
	}
	testenv.Eventually(t, 10*time.Second, func() bool { return second.metric(t, "paystream_sink_active") == 1 }, "standby takes over")
	insertEvent(t, b.db.Pool, "acme:pay_1", 6)
	recs := consume(t, b.brokers, b.topic, 6, 30*time.Second)
	if got, want := eventID(recs[5]), envelope.StateEventID("acme:pay_1", 6); got != want {
		t.Errorf("after takeover, record 6 = %s, want %s", got, want)
	}
	// The counter moves once the row is marked published, just after the ack.
	testenv.Eventually(t, 10*time.Second, func() bool { return second.metric(t, "paystream_sink_published_total") == 1 },
		"the new relay counts the event it published")
}

// TestRelayIgnoresRolledBackRows (I8): rows of a transaction that is still
// open are not relayed, and neither the relay's progress nor, after the
// rollback, the topic shows them.
func TestRelayIgnoresRolledBackRows(t *testing.T) {
	t.Parallel()
	b := setup(t, 1)
	b.startRelay(t)
	ctx := context.Background()

	tx, err := b.db.Pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx) //nolint:errcheck // rolled back below; a no-op then
	var doomed []string
	for v := int64(1); v <= 3; v++ {
		doomed = append(doomed, insertEvent(t, tx, "acme:pay_doomed", v).eventID)
	}
	// Committed while the doomed transaction is open, with higher ids: the
	// relay publishes them without waiting for it.
	kept := insertEvent(t, b.db.Pool, "acme:pay_kept", 1)
	recs := consume(t, b.brokers, b.topic, 1, 30*time.Second)
	if eventID(recs[0]) != kept.eventID {
		t.Fatalf("first record = %s, want %s", eventID(recs[0]), kept.eventID)
	}
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	// A row committed after the rollback is relayed; by then the relay has
	// read the outbox again, and nothing of the rolled-back rows is there.
	after := insertEvent(t, b.db.Pool, "acme:pay_kept", 2)
	recs = consume(t, b.brokers, b.topic, 2, 30*time.Second)
	if eventID(recs[1]) != after.eventID {
		t.Errorf("second record = %s, want %s", eventID(recs[1]), after.eventID)
	}
	for _, rec := range recs {
		for _, id := range doomed {
			if eventID(rec) == id {
				t.Errorf("rolled-back event %s reached the topic", id)
			}
		}
	}
	testenv.Eventually(t, 10*time.Second, func() bool { return unpublished(t, b.db.Pool) == 0 }, "every committed row published")
}

func TestNewValidates(t *testing.T) {
	t.Parallel()
	pool := testenv.NewDB(t).Pool
	if _, err := sink.New(nil, sink.Config{Brokers: []string{"x:1"}}); err == nil {
		t.Error("nil pool accepted")
	}
	if _, err := sink.New(pool, sink.Config{}); err == nil {
		t.Error("no brokers accepted")
	}
	if _, err := sink.New(pool, sink.Config{Brokers: []string{"x:1"}, BatchSize: -1}); err == nil {
		t.Error("negative BatchSize accepted")
	}
}
