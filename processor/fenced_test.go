package processor

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/paystream/paystream/internal/testenv"
)

// countingHandler counts the log records whose message is msg.
type countingHandler struct {
	slog.Handler
	msg string
	n   *atomic.Int64
}

func (h countingHandler) Handle(ctx context.Context, r slog.Record) error {
	if r.Message == h.msg {
		h.n.Add(1)
	}
	return h.Handler.Handle(ctx, r)
}

func (h countingHandler) WithAttrs(as []slog.Attr) slog.Handler {
	return countingHandler{h.Handler.WithAttrs(as), h.msg, h.n}
}

func (h countingHandler) WithGroup(name string) slog.Handler {
	return countingHandler{h.Handler.WithGroup(name), h.msg, h.n}
}

// produceTo produces recs to partition of their topic.
func produceTo(brokers []string, partition int32, recs []*kgo.Record) error {
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.RecordPartitioner(kgo.ManualPartitioner()))
	if err != nil {
		return err
	}
	defer cl.Close()
	for _, r := range recs {
		r.Partition = partition
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	return cl.ProduceSync(ctx, recs...).FirstErr()
}

// TestFencedWorkerLeavesAtOnce: when a newer owner claims a partition in
// Postgres while Kafka still assigns it here, the worker's commit is fenced.
// The worker must leave the worker set at once and the partition's fetching
// must stop (paused), with one log line, while the other partition keeps
// flowing. Before, the fenced worker stayed in the set until Kafka revoked
// the partition, and every record fetched for it meanwhile was dropped.
func TestFencedWorkerLeavesAtOnce(t *testing.T) {
	f := setup(t, 2)

	var fencedLogs atomic.Int64
	logger := slog.New(countingHandler{
		Handler: slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelWarn}),
		msg:     "partition fenced: a newer owner claimed it; stopping its worker and fetching",
		n:       &fencedLogs,
	})
	p, _ := newTestProcessor(t, f.db.Pool, Config{Brokers: f.brokers, Topic: f.topic, Group: f.group, BatchMaxRecords: 10, Logger: logger})
	testenv.Start(t, "processor", p.Run)
	if err := produceTo(f.brokers, 0, paymentRecords(t, f.topic, 0, 5)); err != nil {
		t.Fatal(err)
	}
	if err := produceTo(f.brokers, 1, paymentRecords(t, f.topic, 5, 5)); err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, 60*time.Second, func() error { return storedAtEnd(f.adm, f.db.Pool, f.group, f.topic) })

	// A newer owner claims partition 0 behind the group's back.
	if _, err := f.db.Pool.Exec(context.Background(),
		`UPDATE consumer_offsets SET owner_epoch = owner_epoch + 1 WHERE group_id = $1 AND topic = $2 AND partition = 0`, f.group, f.topic); err != nil {
		t.Fatal(err)
	}
	if err := produceTo(f.brokers, 0, paymentRecords(t, f.topic, 10, 5)); err != nil {
		t.Fatal(err)
	}
	hasWorker := func(partition int32) bool {
		p.mu.Lock()
		defer p.mu.Unlock()
		return p.workers[partition] != nil
	}
	testenv.Eventually(t, 30*time.Second, func() bool { return fencedLogs.Load() > 0 }, "the worker of partition 0 fenced")
	testenv.Eventually(t, 10*time.Second, func() bool { return !hasWorker(0) }, "the fenced worker gone from the worker set")
	paused := p.kcl.Load().PauseFetchPartitions(nil)
	if !slices.Contains(paused[f.topic], 0) {
		t.Errorf("paused partitions = %v, want partition 0 of %s paused", paused, f.topic)
	}

	// More traffic on both partitions: partition 1 still flows, the fenced
	// one is not fetched, applied or logged again.
	if err := produceTo(f.brokers, 0, paymentRecords(t, f.topic, 15, 5)); err != nil {
		t.Fatal(err)
	}
	if err := produceTo(f.brokers, 1, paymentRecords(t, f.topic, 20, 5)); err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, 60*time.Second, func() error {
		ends := testenv.EndOffsets(t, f.brokers, f.topic)
		if got := storedOffset(t, f.db, f.group, f.topic, 1); got != ends[1] {
			return fmt.Errorf("partition 1: stored %d, end %d", got, ends[1])
		}
		return nil
	})
	if !hasWorker(1) {
		t.Error("partition 1 lost its worker")
	}
	if n := fencedLogs.Load(); n != 1 {
		t.Errorf("fenced logged %d times, want once", n)
	}
	if got, want := storedOffset(t, f.db, f.group, f.topic, 0), int64(20); got != want {
		t.Errorf("partition 0: stored offset %d after fencing, want %d (nothing applied by the fenced worker)", got, want)
	}
}
