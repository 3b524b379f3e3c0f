package sink_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"os"
	"os/exec"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/paystream/paystream/internal/envelope"
	"github.com/paystream/paystream/internal/statelog"
	"github.com/paystream/paystream/internal/testenv"
	"github.com/paystream/paystream/sink"
)

// bundle is what each relay test gets: its own schema on a
// logical-level server, state topic and checkpoint topic.
type bundle struct {
	db         *testenv.DB
	brokers    []string
	topic      string
	checkpoint string
}

func setup(t *testing.T, partitions int) *bundle {
	t.Helper()
	return &bundle{
		db:         logicalDB(t),
		brokers:    testenv.Kafka(t),
		topic:      testenv.Topic(t, "state", partitions),
		checkpoint: testenv.Topic(t, "ckpt", 1),
	}
}

func (b *bundle) slot() string { return slotOf(b.db) }

// slotOf is the relay's slot name on db's database and schema.
func slotOf(db *testenv.DB) string {
	var database string
	if err := db.Pool.QueryRow(context.Background(), `SELECT current_database()`).Scan(&database); err != nil {
		panic(err)
	}
	return sink.SlotName(database, db.Schema)
}

// runningRelay is a Relay running in the test process.
type runningRelay struct {
	reg  *prometheus.Registry
	stop func() // cancels Run and waits for it to return
}

func (b *bundle) startRelay(t *testing.T, configure func(*sink.Relay)) *runningRelay {
	t.Helper()
	reg := prometheus.NewRegistry()
	r, err := sink.New(b.db.Pool, sink.Config{
		Brokers: b.brokers, Topic: b.topic, CheckpointTopic: b.checkpoint,
		HeartbeatInterval: 100 * time.Millisecond, StandbyRetry: 50 * time.Millisecond, LostSlotRetry: 100 * time.Millisecond,
		Logger: slog.New(slog.DiscardHandler), Registerer: reg,
	})
	if err != nil {
		t.Fatal(err)
	}
	if configure != nil {
		configure(r)
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
			case <-time.After(60 * time.Second):
				t.Errorf("relay Run did not return within 60s of cancel")
			}
		})
	}
	t.Cleanup(stop)
	return &runningRelay{reg: reg, stop: stop}
}

// startCrashingRelay starts a relay whose Kafka transactions numbered
// crashAt (from 1, in commit order) fail between their commit and the slot
// confirmation, as a crash there would, and returns it once it is active,
// with the number of crashes planted so far.
func (b *bundle) startCrashingRelay(t *testing.T, crashAt func(commit int) bool) (r *runningRelay, crashes func() int) {
	t.Helper()
	var mu sync.Mutex
	commits, crashed := 0, 0
	r = b.startRelay(t, func(r *sink.Relay) {
		sink.SetAfterCommitHook(r, func(uint64) error {
			mu.Lock()
			defer mu.Unlock()
			if commits++; crashAt(commits) {
				crashed++
				return errors.New("planted crash between Kafka commit and slot confirm")
			}
			return nil
		})
	})
	r.waitActive(t, "relay active")
	return r, func() int {
		mu.Lock()
		defer mu.Unlock()
		return crashed
	}
}

// waitActive waits until r holds the slot (paystream_sink_active 1);
// msgAndArgs say what the test waited for if it never does.
func (r *runningRelay) waitActive(t *testing.T, msgAndArgs ...any) {
	t.Helper()
	testenv.Eventually(t, 30*time.Second, func() bool { return r.metric(t, "paystream_sink_active") == 1 }, msgAndArgs...)
}

// metric returns the value of the relay's metric name (a histogram's
// sample count), failing the test if the relay has none.
func (r *runningRelay) metric(t *testing.T, name string) float64 {
	t.Helper()
	m := testenv.Gather(t, r.reg)
	if _, ok := m[name]; !ok {
		t.Fatalf("relay has no metric %s", name)
	}
	return m.Sum(name, nil)
}

// statePayload is the payload the tests' events carry.
type statePayload struct {
	EventID string `json:"event_id"`
	Attempt string `json:"attempt"` // "committed" or "rolled-back"
}

func stateEvent(key string, version int64, attempt string) statelog.Event {
	p, _ := json.Marshal(statePayload{EventID: envelope.StateEventID(key, version), Attempt: attempt})
	return statelog.Event{
		Key: key, Version: version, Payload: p,
		Headers: []statelog.Header{{Key: "traceparent", Value: []byte("00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01")}},
	}
}

// emit writes events as the processor does, one compressed state message
// (format 2) in one transaction through pool, and commits it unless
// rollback.
func emit(ctx context.Context, pool *pgxpool.Pool, events []statelog.Event, rollback bool) error {
	return emitFormat(ctx, pool, events, rollback, 2)
}

// emitFormat is emit with the frames of format version 1 (a message per
// event, as processors before format 2 and migration 004 write them) or 2.
func emitFormat(ctx context.Context, pool *pgxpool.Pool, events []statelog.Event, rollback bool, format int) error {
	tx, err := pool.Begin(ctx)
	if err != nil {
		return err
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	if format == 1 {
		frames, err := statelog.EncodeAll(events)
		if err != nil {
			return err
		}
		var n int64
		if err := tx.QueryRow(ctx, statelog.EmitSQL, frames).Scan(&n); err != nil {
			return fmt.Errorf("emit: %w", err)
		}
		if n != int64(len(frames)) {
			return fmt.Errorf("emitted %d messages, want %d", n, len(frames))
		}
	} else {
		frame, err := statelog.EncodeMessage(events)
		if err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, statelog.EmitMessageSQL, frame); err != nil {
			return fmt.Errorf("emit: %w", err)
		}
	}
	if rollback {
		return tx.Rollback(ctx)
	}
	return tx.Commit(ctx)
}

// writer is a processor-like writer: it owns payments (as a partition
// worker does) and emits their versions in order, in transactions of
// 1..maxPer events across its payments, rolling back every rollbackEvery-th
// transaction and then committing the same versions again. Each
// transaction is one format 2 message, except every v1Every-th, whose
// events are format 1 messages (as during an upgrade, when the slot holds
// both).
type writer struct {
	pool          *pgxpool.Pool
	prefix        string
	payments      int
	maxPer        int
	rollbackEvery int
	v1Every       int
}

// run emits total events and returns how many versions each payment got.
func (w writer) run(ctx context.Context, total int) (map[string]int64, error) {
	versions := map[string]int64{}
	emitted, txns := 0, 0
	for emitted < total {
		txns++
		n := min(1+txns%w.maxPer, total-emitted)
		var events []statelog.Event
		for i := range n {
			key := fmt.Sprintf("%s_pay_%03d", w.prefix, (emitted+i)%w.payments)
			events = append(events, stateEvent(key, versions[key]+1+int64(countKey(events, key)), "committed"))
		}
		format := 2
		if w.v1Every > 0 && txns%w.v1Every == 0 {
			format = 1
		}
		if w.rollbackEvery > 0 && txns%w.rollbackEvery == 0 {
			rolled := make([]statelog.Event, len(events))
			for i, e := range events {
				rolled[i] = stateEvent(e.Key, e.Version, "rolled-back")
			}
			if err := emitFormat(ctx, w.pool, rolled, true, format); err != nil {
				return nil, err
			}
		}
		if err := emitFormat(ctx, w.pool, events, false, format); err != nil {
			return nil, err
		}
		for _, e := range events {
			versions[e.Key] = e.Version
		}
		emitted += n
	}
	return versions, nil
}

func countKey(events []statelog.Event, key string) int {
	n := 0
	for _, e := range events {
		if e.Key == key {
			n++
		}
	}
	return n
}

// walInsertLSN is the server's current WAL insert position.
func walInsertLSN(t *testing.T, pool *pgxpool.Pool) string {
	t.Helper()
	var lsn string
	if err := pool.QueryRow(context.Background(), `SELECT pg_current_wal_insert_lsn()::text`).Scan(&lsn); err != nil {
		t.Fatal(err)
	}
	return lsn
}

// waitRelayed waits until the relay confirmed b's slot up to the WAL
// written so far: every state message committed before the call is then
// in a committed Kafka transaction.
func (b *bundle) waitRelayed(t *testing.T, timeout time.Duration) {
	t.Helper()
	slot, lsn := b.slot(), walInsertLSN(t, b.db.Pool)
	testenv.WaitFor(t, timeout, func() error {
		var ok bool
		var confirmed *string
		err := b.db.Pool.QueryRow(context.Background(), `
			SELECT confirmed_flush_lsn >= $2::pg_lsn, confirmed_flush_lsn::text FROM pg_replication_slots WHERE slot_name = $1`,
			slot, lsn).Scan(&ok, &confirmed)
		if err != nil {
			return err
		}
		if !ok {
			return fmt.Errorf("slot %s confirmed %v, waiting for %s", slot, deref(confirmed), lsn)
		}
		return nil
	})
}

// checkRelayed waits up to timeout until the relay confirmed the WAL
// written so far, then checks that the state topic, read_committed, holds
// each payment's versions 1..want once, in order.
func (b *bundle) checkRelayed(t *testing.T, timeout time.Duration, want map[string]int64) {
	t.Helper()
	b.waitRelayed(t, timeout)
	checkStream(t, testenv.ReadCommitted(t, b.brokers, b.topic), want)
}

// emitVersion commits version v of payment key's state in a Postgres
// transaction of its own, as the processor does for one event.
func (b *bundle) emitVersion(t *testing.T, key string, v int64) {
	t.Helper()
	if err := emit(context.Background(), b.db.Pool, []statelog.Event{stateEvent(key, v, "committed")}, false); err != nil {
		t.Fatal(err)
	}
}

func deref(s *string) string {
	if s == nil {
		return "(none)"
	}
	return *s
}

// checkStream checks what a read_committed consumer of the state topic
// sees against want (payment key → its last version): every version of
// every payment exactly once, in order within one partition, each with
// its event id, none from a rolled-back transaction.
func checkStream(t *testing.T, recs []*kgo.Record, want map[string]int64) {
	t.Helper()
	next := map[string]int64{}
	partition := map[string]int32{}
	seen := map[string]bool{}
	var total int64
	for _, w := range want {
		total += w
	}
	for _, r := range recs {
		key := string(r.Key)
		id := testenv.Header(r, envelope.HeaderEventID)
		if seen[id] {
			t.Fatalf("event id %s repeated (partition %d offset %d)", id, r.Partition, r.Offset)
		}
		seen[id] = true
		var p statePayload
		if err := json.Unmarshal(r.Value, &p); err != nil {
			t.Fatalf("record %s/%d: %v", key, r.Offset, err)
		}
		if p.Attempt != "committed" || p.EventID != id {
			t.Fatalf("record at partition %d offset %d: payload %s with event id %s (from a rolled-back transaction?)", r.Partition, r.Offset, r.Value, id)
		}
		if pt, ok := partition[key]; ok && pt != r.Partition {
			t.Fatalf("%s on partitions %d and %d", key, pt, r.Partition)
		}
		partition[key] = r.Partition
		next[key]++
		if wantID := envelope.StateEventID(key, next[key]); id != wantID {
			t.Fatalf("partition %d offset %d: %s, want %s (a gap or out of order)", r.Partition, r.Offset, id, wantID)
		}
		if testenv.Header(r, "traceparent") == "" {
			t.Fatalf("%s lost its traceparent header", id)
		}
	}
	for key, w := range want {
		if next[key] != w {
			t.Errorf("%s: %d versions on the topic, want %d", key, next[key], w)
		}
	}
	if int64(len(recs)) != total {
		t.Errorf("%d records on the topic, want %d", len(recs), total)
	}
}

// TestRelayPublishesCommittedInOrder (I3, I6, I8): concurrent
// processor-like transactions, some rolled back, and another schema's
// transactions in the same database: a read_committed consumer sees every
// committed version of every payment of the relay's schema once, in
// order, with its headers, and nothing rolled back or of the other schema.
// One transaction's many events of one payment come out in emit order;
// messages of frame formats 1 and 2 mix in one stream (an upgrade).
func TestRelayPublishesCommittedInOrder(t *testing.T) {
	t.Parallel()
	b := setup(t, 3)
	other := schemaOnSameServer(t, b)
	r := b.startRelay(t, nil)
	r.waitActive(t, "relay active")

	ctx := context.Background()
	// One transaction, 300 versions of one payment: emit order is kept.
	var one []statelog.Event
	for v := int64(1); v <= 300; v++ {
		one = append(one, stateEvent("acme:pay_long", v, "committed"))
	}
	if err := emit(ctx, b.db.Pool, one, false); err != nil {
		t.Fatal(err)
	}
	want := map[string]int64{"acme:pay_long": 300}
	var mu sync.Mutex
	var wg sync.WaitGroup
	errs := make(chan error, 6)
	for i := range 4 {
		wg.Go(func() {
			w := writer{pool: b.db.Pool, prefix: fmt.Sprintf("w%d", i), payments: 10, maxPer: 7, rollbackEvery: 3, v1Every: 4}
			v, err := w.run(ctx, 500)
			errs <- err
			mu.Lock()
			for k, n := range v {
				want[k] = n
			}
			mu.Unlock()
		})
	}
	// The other schema's events must not reach this relay's topic.
	wg.Go(func() {
		_, err := writer{pool: other, prefix: "other", payments: 5, maxPer: 3}.run(ctx, 100)
		errs <- err
	})
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	b.checkRelayed(t, time.Minute, want)
	if got := r.metric(t, "paystream_sink_events_published_total"); got != 2300 {
		t.Errorf("paystream_sink_events_published_total = %v, want 2300", got)
	}
	if got := r.metric(t, "paystream_sink_kafka_transaction_seconds"); got == 0 {
		t.Error("no Kafka transaction observed")
	}
	if got := r.metric(t, "paystream_sink_kafka_transactions_aborted_total"); got != 0 {
		t.Errorf("aborted transactions = %v, want 0", got)
	}
}

// schemaOnSameServer returns a pool on another schema of b's database.
func schemaOnSameServer(t *testing.T, b *bundle) *pgxpool.Pool {
	t.Helper()
	ctx := context.Background()
	schema := b.db.Schema + "_other"
	if _, err := b.db.Pool.Exec(ctx, "CREATE SCHEMA "+pgx.Identifier{schema}.Sanitize()); err != nil {
		t.Fatal(err)
	}
	cfg := b.db.Pool.Config()
	cfg.ConnConfig.RuntimeParams["search_path"] = schema
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		pool.Close()
		_, _ = b.db.Pool.Exec(context.Background(), "DROP SCHEMA IF EXISTS "+pgx.Identifier{schema}.Sanitize()+" CASCADE")
	})
	return pool
}

// TestRelayStandbyTakesOver: a second relay stays a standby while the
// first streams the slot (the slot is the leadership), publishes nothing,
// and takes over once the first stops, without repeating or losing an
// event.
func TestRelayStandbyTakesOver(t *testing.T) {
	t.Parallel()
	b := setup(t, 1)
	first := b.startRelay(t, nil)
	first.waitActive(t, "first relay active")
	second := b.startRelay(t, nil)
	for v := int64(1); v <= 5; v++ {
		b.emitVersion(t, "acme:pay_1", v)
		// The standby retries the slot every 50ms meanwhile.
		b.waitRelayed(t, 30*time.Second)
		if a := second.metric(t, "paystream_sink_active"); a != 0 {
			t.Fatalf("standby active = %v while the first relay holds the slot", a)
		}
	}
	if got := second.metric(t, "paystream_sink_events_published_total"); got != 0 {
		t.Errorf("standby published %v events, want 0", got)
	}
	first.stop()
	second.waitActive(t, "standby takes over")
	for v := int64(6); v <= 8; v++ {
		b.emitVersion(t, "acme:pay_1", v)
	}
	b.checkRelayed(t, 30*time.Second, map[string]int64{"acme:pay_1": 8})
	if got := second.metric(t, "paystream_sink_events_published_total"); got != 3 {
		t.Errorf("new relay published %v events, want 3", got)
	}
}

// TestRelaySkipsCheckpointedAfterCrash: a relay that stops between its
// Kafka commit and confirming the slot (planted with the hook) leaves the
// slot behind the checkpoint; Postgres sends those transactions again and
// the relay skips them, so nothing is published twice.
func TestRelaySkipsCheckpointedAfterCrash(t *testing.T) {
	t.Parallel()
	b := setup(t, 3)
	r, crashes := b.startCrashingRelay(t, func(commit int) bool { return commit <= 3 })
	// Three rounds of writes, each published by a Kafka transaction whose
	// slot confirmation the hook prevents.
	want := map[string]int64{}
	for round := int64(1); round <= 3; round++ {
		v, err := writer{pool: b.db.Pool, prefix: fmt.Sprintf("ck%d", round), payments: 4, maxPer: 5}.run(context.Background(), 60)
		if err != nil {
			t.Fatal(err)
		}
		for k, n := range v {
			want[k] = n
		}
		testenv.Eventually(t, time.Minute, func() bool { return int64(crashes()) >= round }, "planted crash %d", round)
	}
	b.waitRelayed(t, time.Minute)
	if got := r.metric(t, "paystream_sink_replayed_transactions_skipped_total"); got == 0 {
		t.Error("no replayed transaction skipped: the planted crashes did not exercise the checkpoint")
	}
	checkStream(t, testenv.ReadCommitted(t, b.brokers, b.topic), want)
}

// TestRelayCrashInsideAMessage (I3, I6): one format 2 message holds many
// events; a relay that crashes after producing part of them (the broker
// has those records, in a transaction neither committed nor aborted) is
// followed by one that fences it and publishes the message's transaction
// again from the checkpoint before it. A read_committed consumer sees every
// event of the message once, in order, none of the first attempt's; a
// format 1 transaction before it (an upgrade's leftovers) too.
func TestRelayCrashInsideAMessage(t *testing.T) {
	t.Parallel()
	b := setup(t, 3)
	if err := setupSlotFor(b); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	want := map[string]int64{}
	var old []statelog.Event
	for v := int64(1); v <= 3; v++ {
		old = append(old, stateEvent("acme:pay_old", v, "committed"))
	}
	if err := emitFormat(ctx, b.db.Pool, old, false, 1); err != nil {
		t.Fatal(err)
	}
	want["acme:pay_old"] = 3
	// Two messages of 150 events over 10 payments, 15 versions each.
	for m := range 2 {
		var events []statelog.Event
		for i := range 150 {
			key := fmt.Sprintf("acme:pay_%02d", i%10)
			events = append(events, stateEvent(key, int64(m*15+i/10+1), "committed"))
			want[key] = int64(m*15 + i/10 + 1)
		}
		if err := emit(ctx, b.db.Pool, events, false); err != nil {
			t.Fatal(err)
		}
	}
	const crashAt = 60 // records into a Kafka transaction: inside the first message
	var crashes atomic.Int64
	r := b.startRelay(t, func(r *sink.Relay) {
		sink.SetMidPublishHook(r, func(produced int) error {
			if produced == crashAt && crashes.Load() < 2 {
				crashes.Add(1)
				return errors.New("planted crash in the middle of a message's events")
			}
			return nil
		})
	})
	b.waitRelayed(t, time.Minute)
	if got := crashes.Load(); got != 2 {
		t.Fatalf("%d planted crashes, want 2", got)
	}
	recs := testenv.ReadCommitted(t, b.brokers, b.topic)
	checkStream(t, recs, want)
	// The crashed attempts' records are in the log, aborted: each attempt
	// put crashAt records there (and its successor an abort marker per
	// partition it wrote to).
	if hw := testenv.EndOffsetSum(t, b.brokers, b.topic); hw < int64(len(recs))+2*crashAt {
		t.Errorf("state topic high water %d, want at least %d committed + %d crashed records: the crashes did not happen mid-message", hw, len(recs), 2*crashAt)
	}
	if got := r.metric(t, "paystream_sink_events_published_total"); got != float64(len(recs)) {
		t.Errorf("paystream_sink_events_published_total = %v, want %d", got, len(recs))
	}
}

// TestRelayHeartbeatAdvancesQuietSlot: with no state event at all, the
// heartbeat keeps the slot's confirmed position following the WAL, so
// Postgres can recycle it, and the lag gauges are set.
func TestRelayHeartbeatAdvancesQuietSlot(t *testing.T) {
	t.Parallel()
	b := setup(t, 1)
	r := b.startRelay(t, nil)
	r.waitActive(t, "relay active")
	// WAL that holds no message for this relay.
	if _, err := b.db.Pool.Exec(context.Background(), `CREATE TABLE filler AS SELECT g FROM generate_series(1, 10000) g`); err != nil {
		t.Fatal(err)
	}
	b.waitRelayed(t, 30*time.Second)
	if got := r.metric(t, "paystream_sink_events_published_total"); got != 0 {
		t.Errorf("published %v events, want 0", got)
	}
	if got := r.metric(t, "paystream_sink_kafka_transaction_seconds"); got != 0 {
		t.Errorf("%v Kafka transactions for heartbeats, want 0", got)
	}
}

// TestRelayRefusesWALLevelReplica: on a server without wal_level =
// logical the relay stops at once with one line saying what to set.
func TestRelayRefusesWALLevelReplica(t *testing.T) {
	t.Parallel()
	testenv.SkipIfShort(t)
	db := schemaDB(t, privateCluster(t, "replica", map[string]string{"wal_level": "replica"}))
	r, err := sink.New(db.Pool, sink.Config{Brokers: []string{"127.0.0.1:1"}, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	err = r.Run(ctx)
	if !errors.Is(err, sink.ErrWALLevel) {
		t.Fatalf("Run = %v, want ErrWALLevel", err)
	}
	if msg := err.Error(); !strings.Contains(msg, "wal_level = logical") || !strings.Contains(msg, "max_replication_slots") ||
		!strings.Contains(msg, "max_wal_senders") || !strings.Contains(msg, "wal_level = replica") || strings.Contains(msg, "\n") {
		t.Errorf("error %q: want one line naming wal_level = logical, max_replication_slots, max_wal_senders and the current level", msg)
	}
	if err := sink.CheckWALLevel(ctx, db.Pool); !errors.Is(err, sink.ErrWALLevel) {
		t.Errorf("CheckWALLevel = %v, want ErrWALLevel", err)
	}
}

// childRelay is `paystream sink` running as a child process.
type childRelay struct {
	name string
	cmd  *exec.Cmd
	done chan struct{}
	log  string // its stderr and stdout
}

// startChild runs `paystream sink` on b's schema and topics, as an
// operator does (the real binary, its flags), named name in
// pg_stat_replication's application_name.
func (b *bundle) startChild(t *testing.T, name string) *childRelay {
	t.Helper()
	u := b.db.URL
	sep := "?"
	if strings.Contains(u, "?") {
		sep = "&"
	}
	cmd := exec.Command(paystreamBinary(t), "sink",
		"--database-url", u+sep+"application_name="+name,
		"--kafka-brokers", strings.Join(b.brokers, ","),
		"--state-topic", b.topic,
		"--checkpoint-topic", b.checkpoint,
		"--heartbeat-interval", "100ms",
		"--standby-retry", "50ms",
	)
	// Only the flags configure it.
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "PAYSTREAM_") {
			cmd.Env = append(cmd.Env, kv)
		}
	}
	c := &childRelay{name: name, cmd: cmd, done: make(chan struct{}), log: t.TempDir() + "/" + name + ".log"}
	logf, err := os.Create(c.log)
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { _ = cmd.Wait(); logf.Close(); close(c.done) }()
	t.Cleanup(func() {
		select {
		case <-c.done:
			return // SIGKILLed by the test
		default:
		}
		// A relay still running stops cleanly on SIGTERM.
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-c.done:
			if code := cmd.ProcessState.ExitCode(); code != 0 {
				out, _ := os.ReadFile(c.log)
				t.Errorf("paystream sink %s: exit %d after SIGTERM, want 0\n%s", name, code, out)
			}
		case <-time.After(30 * time.Second):
			_ = cmd.Process.Kill()
			<-c.done
			t.Errorf("paystream sink %s did not stop within 30s of SIGTERM", name)
		}
	})
	return c
}

// activeRelay returns the application_name of the connection streaming
// the slot, or "" when none does.
func activeRelay(t *testing.T, pool *pgxpool.Pool, slot string) string {
	t.Helper()
	var name *string
	err := pool.QueryRow(context.Background(), `
		SELECT r.application_name FROM pg_replication_slots s JOIN pg_stat_replication r ON r.pid = s.active_pid
		 WHERE s.slot_name = $1`, slot).Scan(&name)
	if errors.Is(err, pgx.ErrNoRows) {
		return ""
	}
	if err != nil {
		t.Fatal(err)
	}
	return deref(name)
}

// TestRelaySIGKILL is the bar (I2, I3, I6, I8): `paystream sink`
// run as the binary, two replicas, the active one SIGKILLed 5 times, a
// standby taking over each time, while 50,000 events are written by
// concurrent processor-like transactions (some rolled back): the state
// topic read with read_committed holds every version of every payment, in
// order, no repeated event id, no gap.
func TestRelaySIGKILL(t *testing.T) {
	t.Parallel()
	const total, writers, kills = 50_000, 4, 5
	b := setup(t, 3)
	if err := setupSlotFor(b); err != nil {
		t.Fatal(err)
	}
	children := map[string]*childRelay{}
	spawned := 0
	spawn := func() {
		spawned++
		name := fmt.Sprintf("relay%d", spawned)
		children[name] = b.startChild(t, name)
	}
	spawn()
	spawn()

	ctx := context.Background()
	start := time.Now()
	want := map[string]int64{}
	var mu sync.Mutex
	var wg sync.WaitGroup
	errs := make(chan error, writers)
	for i := range writers {
		wg.Go(func() {
			w := writer{pool: b.db.Pool, prefix: fmt.Sprintf("w%d", i), payments: 250, maxPer: 20, rollbackEvery: 5, v1Every: 7}
			v, err := w.run(ctx, total/writers)
			errs <- err
			mu.Lock()
			for k, n := range v {
				want[k] = n
			}
			mu.Unlock()
		})
	}

	// Kill the active relay each time the topic grew by another sixth of
	// the events, and start a new standby.
	var killed []string
	var takeovers []time.Duration
	for k := 1; k <= kills; k++ {
		mark := int64(k) * total / (kills + 1)
		testenv.Eventually(t, 5*time.Minute, func() bool { return testenv.EndOffsetSum(t, b.brokers, b.topic) >= mark },
			"state topic past %d records before kill %d", mark, k)
		var active string
		testenv.Eventually(t, time.Minute, func() bool {
			active = activeRelay(t, b.db.Pool, b.slot())
			return children[active] != nil
		}, "a child relay streaming the slot before kill %d", k)
		c := children[active]
		killedAt := time.Now()
		if err := c.cmd.Process.Signal(syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
		<-c.done
		delete(children, active)
		killed = append(killed, active)
		spawn()
		// Measured, not asserted: how long the slot had no relay.
		testenv.Eventually(t, 2*time.Minute, func() bool { return children[activeRelay(t, b.db.Pool, b.slot())] != nil },
			"a standby streaming the slot after kill %d", k)
		takeovers = append(takeovers, time.Since(killedAt).Round(time.Millisecond))
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	written := time.Since(start)
	b.waitRelayed(t, 5*time.Minute)
	elapsed := time.Since(start)
	recs := testenv.ReadCommitted(t, b.brokers, b.topic)
	checkStream(t, recs, want)
	t.Logf("%d events written in %s; all in Kafka after %s (%.0f events/s end to end) with relays %v SIGKILLed, a standby streaming the slot %v after each kill; topic high water %d (records, aborted records and markers)",
		total, written.Round(time.Millisecond), elapsed.Round(time.Millisecond), float64(total)/elapsed.Seconds(), killed,
		takeovers, testenv.EndOffsetSum(t, b.brokers, b.topic))
}

// setupSlotFor creates the slot of b's schema before anything is emitted,
// as migrate will.
func setupSlotFor(b *bundle) error {
	_, err := sink.SetupSlot(context.Background(), b.db.Pool)
	return err
}

// TestNewValidates: New names the bad field.
func TestNewValidates(t *testing.T) {
	t.Parallel()
	pool := logicalDB(t).Pool
	for _, c := range []struct {
		name string
		cfg  sink.Config
		want string
	}{
		{"no brokers", sink.Config{}, "Brokers"},
		{"negative batch", sink.Config{Brokers: []string{"x:1"}, MaxBatchEvents: -1}, "MaxBatchEvents"},
		{"negative delay", sink.Config{Brokers: []string{"x:1"}, MaxBatchDelay: -time.Second}, "MaxBatchDelay"},
		{"negative heartbeat", sink.Config{Brokers: []string{"x:1"}, HeartbeatInterval: -time.Second}, "HeartbeatInterval"},
		{"long slot", sink.Config{Brokers: []string{"x:1"}, Slot: strings.Repeat("s", 64)}, "Slot"},
	} {
		if _, err := sink.New(pool, c.cfg); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: New = %v, want an error naming %s", c.name, err, c.want)
		}
	}
	if _, err := sink.New(nil, sink.Config{Brokers: []string{"x:1"}}); err == nil {
		t.Error("nil pool accepted")
	}
}

// TestRelayConfirmsWALEndingInARollback: Postgres can shut down while a
// relay streams, even when the WAL ends in something that decodes to
// nothing (here a rolled-back transaction). A fast shutdown waits for every
// walsender to see all it sent confirmed; a relay that confirmed only
// commit positions made it wait until wal_sender_timeout (a minute by
// default: the chaos suite's Postgres restarts took 60 s). It now confirms
// a keepalive's position when nothing of its own is pending. A private
// cluster keeps other tests' commits, which would move the slot anyway, out
// of it, and its wal_sender_timeout of 10 minutes turns the old wait into a
// failed stop (pg_ctl gives up after 60 s).
func TestRelayConfirmsWALEndingInARollback(t *testing.T) {
	t.Parallel()
	testenv.SkipIfShort(t)
	settings := maps.Clone(logicalSettings)
	settings["wal_sender_timeout"] = "10min"
	cluster := privateCluster(t, "shutdown", settings)
	b := &bundle{
		db:         schemaDB(t, cluster),
		brokers:    testenv.Kafka(t),
		topic:      testenv.Topic(t, "state", 1),
		checkpoint: testenv.Topic(t, "ckpt", 1),
	}
	r, err := sink.New(b.db.Pool, sink.Config{
		Brokers: b.brokers, Topic: b.topic, CheckpointTopic: b.checkpoint,
		HeartbeatInterval: time.Hour, // no heartbeat commits to follow
		Logger:            slog.New(slog.DiscardHandler), Registerer: prometheus.NewRegistry(),
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		select {
		case <-done:
		case <-time.After(time.Minute):
			t.Error("relay Run did not return within a minute of cancel")
		}
	})
	testenv.Eventually(t, 30*time.Second, func() bool {
		var active bool
		err := b.db.Pool.QueryRow(context.Background(),
			`SELECT coalesce(bool_or(active), false) FROM pg_replication_slots WHERE slot_name = $1`, b.slot()).Scan(&active)
		return err == nil && active
	}, "relay streaming")

	rollback := func() {
		t.Helper()
		tx, err := b.db.Pool.Begin(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		if _, err := tx.Exec(context.Background(), `CREATE TABLE filler AS SELECT g FROM generate_series(1, 1000) g`); err != nil {
			t.Fatal(err)
		}
		if err := tx.Rollback(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
	// Caught up first, so the stop below waits on nothing but the
	// rolled-back transaction.
	b.waitRelayed(t, 30*time.Second)
	rollback()
	stopCtx, stopCancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer stopCancel()
	if err := cluster.Stop(stopCtx); err != nil {
		t.Fatalf("fast shutdown with a relay streaming: %v (the walsender waited for a confirmation?)", err)
	}
}
