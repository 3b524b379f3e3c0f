package main

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/paystream/paystream/internal/envelope"
	"github.com/paystream/paystream/internal/statelog"
	"github.com/paystream/paystream/internal/testenv"
	"github.com/paystream/paystream/sink"
)

// countingRegisterer counts the collectors registered through it.
type countingRegisterer struct {
	prometheus.Registerer
	mu *sync.Mutex
	n  *int
}

func (r countingRegisterer) Register(c prometheus.Collector) error {
	err := r.Registerer.Register(c)
	if err == nil {
		r.mu.Lock()
		*r.n++
		r.mu.Unlock()
	}
	return err
}

// MustRegister is what kprom calls (through promauto): it panics on a
// conflict.
func (r countingRegisterer) MustRegister(cs ...prometheus.Collector) {
	for _, c := range cs {
		if err := r.Register(c); err != nil {
			panic(err)
		}
	}
}

// TestSinkKafkaMetricsPerClient runs a relay that takes over a slot whose
// predecessor committed a checkpoint, so that it creates every kind of
// Kafka client — admin (topic check, offset listing), relay (the
// transactional producer, alive throughout) and checkpoint (the
// read_committed reader) — with the command's sinkKafkaMetrics on one
// registry. Each client registers its kprom metrics without a conflict
// (kprom panics on one), and while the relay is active the registry serves
// paystream_sink_kafka_* for client="relay" only: the short-lived clients'
// series went with them.
func TestSinkKafkaMetricsPerClient(t *testing.T) {
	t.Parallel()
	db := testenv.NewDB(t)
	brokers := testenv.Kafka(t)
	state, ckpt := testenv.Topic(t, "state", 1), testenv.Topic(t, "ckpt", 1)
	if _, err := sink.SetupSlot(t.Context(), db.Pool); err != nil {
		t.Fatal(err)
	}
	log := slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelWarn}))
	run := func(reg *prometheus.Registry, clientOpts func(string) []kgo.Opt) (stop func()) {
		t.Helper()
		r, err := sink.New(db.Pool, sink.Config{
			Brokers: brokers, Topic: state, CheckpointTopic: ckpt, MaxBatchDelay: time.Millisecond,
			StandbyRetry: 50 * time.Millisecond, Logger: log, Registerer: reg, KafkaClientOpts: clientOpts,
		})
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan struct{})
		go func() {
			defer close(done)
			if err := r.Run(ctx); err != nil {
				t.Errorf("relay: %v", err)
			}
		}()
		return func() { cancel(); <-done }
	}

	// The predecessor publishes one event, and with it a checkpoint.
	first := prometheus.NewRegistry()
	stopFirst := run(first, sinkKafkaMetrics(first))
	emitStateEvent(t, db, "acme:pay_kprom")
	testenv.WaitFor(t, time.Minute, func() error {
		if n := testenv.Gather(t, first).Sum("paystream_sink_events_published_total", nil); n != 1 {
			return fmt.Errorf("%v events published, want 1", n)
		}
		return nil
	})
	stopFirst()

	reg := prometheus.NewRegistry()
	var mu sync.Mutex
	created, registered := map[string]int{}, map[string]*int{}
	stop := run(reg, func(client string) []kgo.Opt {
		mu.Lock()
		defer mu.Unlock()
		created[client]++
		if registered[client] == nil {
			registered[client] = new(int)
		}
		return sinkKafkaMetrics(countingRegisterer{Registerer: reg, mu: &mu, n: registered[client]})(client)
	})
	defer stop()
	// The relay is active once it has read the checkpoint back.
	testenv.WaitFor(t, time.Minute, func() error {
		if n := testenv.Gather(t, reg).Sum("paystream_sink_active", nil); n != 1 {
			return fmt.Errorf("paystream_sink_active %v, want 1", n)
		}
		return nil
	})
	mu.Lock()
	for _, client := range []string{sink.ClientAdmin, sink.ClientRelay, sink.ClientCheckpoint} {
		if created[client] == 0 || *registered[client] == 0 {
			t.Errorf("client %q: %d clients created, %d collectors registered; want both above 0", client, created[client], *registered[client])
		}
	}
	t.Logf("clients created by role: %v; collectors registered: admin %d, relay %d, checkpoint %d",
		created, *registered[sink.ClientAdmin], *registered[sink.ClientRelay], *registered[sink.ClientCheckpoint])
	mu.Unlock()

	relay := map[string]string{"client": sink.ClientRelay}
	if n := testenv.Gather(t, reg).Sum("paystream_sink_kafka_connects_total", relay); n < 1 {
		t.Errorf(`paystream_sink_kafka_connects_total{client="relay"} = %v, want at least 1`, n)
	}
	for _, client := range []string{sink.ClientAdmin, sink.ClientCheckpoint} {
		if n := len(testenv.Gather(t, reg).Series("paystream_sink_kafka_connects_total", map[string]string{"client": client})); n != 0 {
			t.Errorf(`%d paystream_sink_kafka_connects_total{client=%q} series after the client was closed, want 0`, n, client)
		}
	}
}

// emitStateEvent commits one state event of payment key, version 1, as
// the processor's batch transaction does.
func emitStateEvent(t *testing.T, db *testenv.DB, key string) {
	t.Helper()
	frames, err := statelog.EncodeAll([]statelog.Event{{
		Key: key, Version: 1, Payload: fmt.Appendf(nil, `{"event_id":%q}`, envelope.StateEventID(key, 1)),
	}})
	if err != nil {
		t.Fatal(err)
	}
	tx, err := db.Pool.Begin(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(context.Background()) }()
	if _, err := tx.Exec(t.Context(), statelog.EmitSQL, frames); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(t.Context()); err != nil {
		t.Fatal(err)
	}
}
