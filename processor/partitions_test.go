package processor

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/paystream/paystream/internal/store"
	"github.com/paystream/paystream/internal/testenv"
	"github.com/paystream/paystream/internal/topics"
)

// TestPartitionsAddedWhileRunningStopTheProcessor: the raw topic has the 2
// partitions paystream migrate recorded, and a processor applies records
// from both. Then partitions are added on the broker while it runs, and a
// record lands on the new partition. The processor must stop, Run
// returning topics.ErrPartitionsChanged, without applying or claiming
// anything of the new partition: a payment's new events there would be
// applied in no particular order with its old ones. Before, only the start
// of paystream processor checked the count: a running processor went on,
// and took the new partition at its next rebalance.
func TestPartitionsAddedWhileRunningStopTheProcessor(t *testing.T) {
	f := setup(t, 2)
	ctx := context.Background()
	if err := store.RecordTopicPartitions(ctx, f.db.Pool, f.topic, 2); err != nil {
		t.Fatal(err)
	}

	p, _ := newTestProcessor(t, f.db.Pool, Config{Brokers: f.brokers, Topic: f.topic, Group: f.group, BatchMaxRecords: 10})
	runCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	ran := make(chan error, 1)
	go func() { ran <- p.Run(runCtx) }()
	var produced int
	for partition := range int32(2) {
		recs := paymentRecords(t, f.topic, int(partition)*5, 5)
		produced += len(recs)
		if err := produceTo(f.brokers, partition, recs); err != nil {
			t.Fatal(err)
		}
	}
	testenv.WaitFor(t, 60*time.Second, func() error { return storedAtEnd(f.adm, f.db.Pool, f.group, f.topic) })

	if _, err := f.adm.CreatePartitions(ctx, 1, f.topic); err != nil {
		t.Fatal(err)
	}
	added := time.Now()
	if err := produceTo(f.brokers, 2, paymentRecords(t, f.topic, 100, 3)); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-ran:
		if !errors.Is(err, topics.ErrPartitionsChanged) {
			t.Fatalf("Run = %v, want topics.ErrPartitionsChanged", err)
		}
		t.Logf("processor stopped %v after the partition was added: %v", time.Since(added).Round(10*time.Millisecond), err)
	case <-time.After(60 * time.Second):
		t.Fatal("the processor still runs 60s after partitions were added to its raw topic")
	}
	for _, c := range []struct {
		q    string
		want int
	}{
		{`SELECT count(*) FROM deliveries WHERE topic = $1 AND partition = 2`, 0},
		{`SELECT count(*) FROM consumer_offsets WHERE topic = $1 AND partition = 2`, 0},
		{`SELECT count(*) FROM deliveries WHERE topic = $1 AND partition < 2`, produced},
	} {
		if got := queryInt(t, f.db.Pool, c.q, f.topic); got != c.want {
			t.Errorf("%s = %d, want %d", c.q, got, c.want)
		}
	}
}
