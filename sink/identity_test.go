package sink_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/paystream/paystream/internal/statelog"
	"github.com/paystream/paystream/internal/testenv"
	"github.com/paystream/paystream/sink"
)

// newDatabase creates a database of its own on the server of base (a
// logical-level one) and returns its schema public, as a deployment that
// has the database to itself uses it. Its slots are dropped, and it is
// dropped, when the test ends.
func newDatabase(t *testing.T, base *testenv.DB) *testenv.DB {
	t.Helper()
	ctx := context.Background()
	suffix := make([]byte, 6)
	_, _ = rand.Read(suffix)
	name := "t_db_" + hex.EncodeToString(suffix)
	if _, err := base.Pool.Exec(ctx, "CREATE DATABASE "+pgx.Identifier{name}.Sanitize()); err != nil {
		t.Fatalf("create database: %v", err)
	}
	u, err := url.Parse(base.URL)
	if err != nil {
		t.Fatal(err)
	}
	u.Path = "/" + name
	q := u.Query()
	q.Del("search_path")
	u.RawQuery = q.Encode()
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		// Its slots first: a database with a slot cannot be dropped.
		testenv.WaitFor(t, 30*time.Second, func() error {
			_, err := base.Pool.Exec(ctx, `SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE database = $1`, name)
			return err
		})
		if _, err := base.Pool.Exec(ctx, "DROP DATABASE "+pgx.Identifier{name}.Sanitize()+" WITH (FORCE)"); err != nil {
			t.Errorf("drop database %s: %v", name, err)
		}
	})
	pool, err := pgxpool.New(ctx, u.String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return &testenv.DB{Pool: pool, URL: u.String(), Schema: "public"}
}

// TestTwoDatabasesOneCluster: two deployments whose databases both use
// schema public, on one Postgres cluster and one Kafka cluster (one
// checkpoint topic, as by default), set up as paystream migrate does and
// written to at once: each has its own slot, transactional id and
// checkpoint, and each state topic gets its own database's events exactly
// once, in order. (With the slot named after the schema alone, the second
// database got no slot, and its relay stood by forever.)
func TestTwoDatabasesOneCluster(t *testing.T) {
	t.Parallel()
	base := logicalDB(t)
	brokers := testenv.Kafka(t)
	ckpt := testenv.Topic(t, "ckpt", 1)
	type deployment struct {
		b     *bundle
		relay *runningRelay
		want  map[string]int64
	}
	var deps [2]*deployment
	for i := range deps {
		b := &bundle{db: newDatabase(t, base), brokers: brokers, topic: testenv.Topic(t, fmt.Sprintf("state%d", i), 3), checkpoint: ckpt}
		slot, err := sink.SetupSlot(context.Background(), b.db.Pool)
		if err != nil {
			t.Fatalf("deployment %d: SetupSlot: %v", i, err)
		}
		if slot != b.slot() {
			t.Fatalf("deployment %d: slot %s, want %s", i, slot, b.slot())
		}
		deps[i] = &deployment{b: b}
	}
	if deps[0].b.slot() == deps[1].b.slot() {
		t.Fatalf("both deployments have slot %s", deps[0].b.slot())
	}
	for _, d := range deps {
		d.relay = d.b.startRelay(t, nil)
	}
	for i, d := range deps {
		d.relay.waitActive(t, "relay %d active", i)
	}
	var wg sync.WaitGroup
	errs := make([]error, len(deps))
	for i, d := range deps {
		wg.Go(func() {
			// The same payment keys in both: the topics must not mix them.
			d.want, errs[i] = writer{pool: d.b.db.Pool, prefix: "both", payments: 20, maxPer: 8, rollbackEvery: 9}.run(context.Background(), 1500)
		})
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Fatalf("deployment %d: %v", i, err)
		}
	}
	for _, d := range deps {
		d.b.waitRelayed(t, time.Minute)
	}
	for i, d := range deps {
		t.Run(fmt.Sprintf("deployment%d", i), func(t *testing.T) {
			checkStream(t, testenv.ReadCommitted(t, brokers, d.b.topic), d.want)
			if got := d.relay.metric(t, "paystream_sink_events_published_total"); got != 1500 {
				t.Errorf("published %v events, want 1500", got)
			}
		})
	}
}

// TestSlotCollisionRefused: a slot of the relay's name that belongs to
// another database is never shared: SetupSlot and the relay refuse to
// start, naming both owners.
func TestSlotCollisionRefused(t *testing.T) {
	t.Parallel()
	base := logicalDB(t)
	mine, theirs := newDatabase(t, base), newDatabase(t, base)
	slot, err := sink.Slot(context.Background(), mine.Pool)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := theirs.Pool.Exec(context.Background(), `SELECT pg_create_logical_replication_slot($1, 'pgoutput')`, slot); err != nil {
		t.Fatal(err)
	}
	var theirName, myName string
	_ = theirs.Pool.QueryRow(context.Background(), `SELECT current_database()`).Scan(&theirName)
	_ = mine.Pool.QueryRow(context.Background(), `SELECT current_database()`).Scan(&myName)
	check := func(what string, err error) {
		t.Helper()
		var coll *sink.SlotCollisionError
		if !errors.As(err, &coll) {
			t.Fatalf("%s: %v, want a *SlotCollisionError", what, err)
		}
		for _, name := range []string{slot, theirName, myName} {
			if !containsString(err.Error(), name) {
				t.Errorf("%s: %q does not name %s", what, err, name)
			}
		}
	}
	_, err = sink.SetupSlot(context.Background(), mine.Pool)
	check("SetupSlot", err)
	r, err := sink.New(mine.Pool, sink.Config{Brokers: testenv.Kafka(t), CheckpointTopic: testenv.Topic(t, "ckpt", 1), Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	check("Relay.Run", r.Run(ctx))
}

func containsString(s, sub string) bool {
	return len(sub) == 0 || len(s) >= len(sub) && (s[:len(sub)] == sub || containsString(s[1:], sub))
}

// openForeignTransaction opens a Kafka transaction of another relay (its
// own transactional id) holding a record on topic, and returns a function
// that aborts it.
func openForeignTransaction(t *testing.T, brokers []string, topic string) (abort func()) {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.TransactionalID(testenv.Group(t)+"-foreign"),
		kgo.TransactionTimeout(5*time.Minute), kgo.DefaultProduceTopic(topic))
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if err := cl.BeginTransaction(); err != nil {
		t.Fatal(err)
	}
	if err := cl.ProduceSync(ctx, &kgo.Record{Key: []byte("another-relay"), Value: []byte(`{"lsn":"0/1"}`)}).FirstErr(); err != nil {
		t.Fatal(err)
	}
	var once sync.Once
	abort = func() {
		once.Do(func() {
			if err := cl.EndTransaction(ctx, kgo.TryAbort); err != nil {
				t.Errorf("abort the foreign transaction: %v", err)
			}
			cl.Close()
		})
	}
	t.Cleanup(abort)
	return abort
}

// checkSkipsAfterCrash is the scenario of the checkpoint tests: a relay
// whose second Kafka transaction fails between its commit and the slot
// confirmation (as a crash there would) starts over, reads its checkpoint
// and must skip that transaction when Postgres sends it again. It starts
// the relay, calls whenActive once the relay is active, emits versions 1
// and 2 of acme:pay_1 in a transaction each, calls afterCrash once the
// planted crash happened, and checks that the state topic holds each
// version once and the relay skipped one replayed transaction.
func checkSkipsAfterCrash(t *testing.T, b *bundle, whenActive, afterCrash func()) {
	t.Helper()
	r, crashes := b.startCrashingRelay(t, func(commit int) bool { return commit == 2 })
	whenActive()
	for v := int64(1); v <= 2; v++ {
		b.emitVersion(t, "acme:pay_1", v)
		testenv.Eventually(t, 30*time.Second, func() bool {
			return r.metric(t, "paystream_sink_kafka_transaction_seconds") >= float64(v)
		}, "transaction %d committed", v)
	}
	testenv.Eventually(t, 30*time.Second, func() bool { return crashes() == 1 }, "planted crash")
	afterCrash()
	b.checkRelayed(t, time.Minute, map[string]int64{"acme:pay_1": 2})
	if got := r.metric(t, "paystream_sink_replayed_transactions_skipped_total"); got != 1 {
		t.Errorf("skipped %v replayed transactions, want 1 (the crashed one)", got)
	}
}

// TestCheckpointNotPinnedByForeignTransaction: another relay's Kafka
// transaction, open on the shared checkpoint topic since before this
// relay's newest checkpoint, holds the topic's last stable offset below
// it. A relay taking over after a crash between its Kafka commit and the
// slot confirmation must still read that checkpoint (it waits for the
// foreign transaction to end), not an older one: else it publishes the
// crashed transaction's events again.
func TestCheckpointNotPinnedByForeignTransaction(t *testing.T) {
	t.Parallel()
	b := setup(t, 1)
	var abortForeign func()
	checkSkipsAfterCrash(t, b, func() { abortForeign = openForeignTransaction(t, b.brokers, b.checkpoint) }, func() {
		// The relay starts over and reads the checkpoint topic; the
		// foreign transaction ends a moment later.
		time.Sleep(2 * time.Second)
		abortForeign()
	})
}

// TestCheckpointOfAnotherHistoryIgnored: a checkpoint of this system on a
// timeline that is not this server's history (the old history a
// point-in-time restore or a promote went back from), with a larger LSN,
// is written before this relay's own. A relay taking over after a crash
// between its Kafka commit and the slot confirmation must use its own
// newest checkpoint: the largest LSN across histories would be discarded
// as foreign, and the crashed transaction published again.
func TestCheckpointOfAnotherHistoryIgnored(t *testing.T) {
	t.Parallel()
	b := setup(t, 1)
	if err := setupSlotFor(b); err != nil {
		t.Fatal(err)
	}
	id, err := sink.Identify(context.Background(), b.db.Pool, "")
	if err != nil {
		t.Fatal(err)
	}
	cl, err := kgo.NewClient(kgo.SeedBrokers(b.brokers...))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	stale, _ := json.Marshal(map[string]any{"lsn": "FFFF/0", "system_id": id.SystemID, "timeline": 7})
	for _, key := range []string{id.Key(), b.slot()} {
		if err := cl.ProduceSync(context.Background(), &kgo.Record{Topic: b.checkpoint, Key: []byte(key), Value: stale}).FirstErr(); err != nil {
			t.Fatal(err)
		}
	}
	checkSkipsAfterCrash(t, b, func() {}, func() {})
}

// TestLostSlotNotRecreated: the slot gone while its publication remains
// (a failover to a standby, which has no logical slot) is never silently
// created again: SetupSlot says so, and the relay relays nothing and
// reports paystream_sink_slot_lost until the slot is back.
func TestLostSlotNotRecreated(t *testing.T) {
	t.Parallel()
	b := setup(t, 1)
	ctx := context.Background()
	if err := setupSlotFor(b); err != nil {
		t.Fatal(err)
	}
	if _, err := b.db.Pool.Exec(ctx, `SELECT pg_drop_replication_slot($1)`, b.slot()); err != nil {
		t.Fatal(err)
	}
	if _, err := sink.SetupSlot(ctx, b.db.Pool); !errors.Is(err, sink.ErrSlotLost) {
		t.Fatalf("SetupSlot = %v, want ErrSlotLost", err)
	}
	r := b.startRelay(t, nil)
	testenv.Eventually(t, 30*time.Second, func() bool { return r.metric(t, "paystream_sink_slot_lost") == 1 }, "slot reported lost")
	var exists bool
	if err := b.db.Pool.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_replication_slots WHERE slot_name = $1)`, b.slot()).Scan(&exists); err != nil {
		t.Fatal(err)
	}
	if exists {
		t.Fatal("the relay created the lost slot again")
	}
	if got := r.metric(t, "paystream_sink_active"); got != 0 {
		t.Errorf("paystream_sink_active = %v with the slot lost", got)
	}
}

// TestIdentityCollisionStopsRelay: another relay with this relay's
// transactional id (a second deployment of the same identity: a database
// cloned from another's backup, sharing the Kafka cluster) fences it while
// it holds the slot. Reading each other's checkpoints would skip events,
// so the relay stops with an error that says to set --deployment.
func TestIdentityCollisionStopsRelay(t *testing.T) {
	t.Parallel()
	b := setup(t, 1)
	// The slot first, so that event 1 is in it whenever the relay starts.
	if err := setupSlotFor(b); err != nil {
		t.Fatal(err)
	}
	r, err := sink.New(b.db.Pool, sink.Config{
		Brokers: b.brokers, Topic: b.topic, CheckpointTopic: b.checkpoint,
		HeartbeatInterval: 100 * time.Millisecond, StandbyRetry: 50 * time.Millisecond,
		Logger: slog.New(slog.DiscardHandler), Registerer: prometheus.NewRegistry(),
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	ctx0 := context.Background()
	if err := emit(ctx0, b.db.Pool, []statelog.Event{stateEvent("acme:pay_1", 1, "committed")}, false); err != nil {
		t.Fatal(err)
	}
	b.waitRelayed(t, 30*time.Second)
	id, err := sink.Identify(ctx0, b.db.Pool, "")
	if err != nil {
		t.Fatal(err)
	}
	twin, err := kgo.NewClient(kgo.SeedBrokers(b.brokers...), kgo.TransactionalID(id.TransactionalID()))
	if err != nil {
		t.Fatal(err)
	}
	defer twin.Close()
	if _, _, err := twin.ProducerID(ctx0); err != nil {
		t.Fatal(err)
	}
	if err := emit(ctx0, b.db.Pool, []statelog.Event{stateEvent("acme:pay_1", 2, "committed")}, false); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-done:
		var coll *sink.IdentityCollisionError
		if !errors.As(err, &coll) {
			t.Fatalf("Run = %v, want an *IdentityCollisionError", err)
		}
		if !containsString(err.Error(), "--deployment") {
			t.Errorf("the error does not say what to do: %v", err)
		}
	case <-ctx.Done():
		t.Fatal("the fenced relay did not stop")
	}
}
