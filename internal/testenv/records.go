package testenv

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
)

// Produce produces recs (each with its Topic set) in order, with the key
// partitioner ingest uses (one key's records land on one partition, in the
// order given), and fails the test unless every one was acknowledged by
// all in-sync replicas within a minute.
func Produce(t testing.TB, brokers []string, recs ...*kgo.Record) {
	t.Helper()
	if err := TryProduce(brokers, recs...); err != nil {
		t.Fatal(err)
	}
}

// TryProduce is [Produce] for goroutines other than the test's: it returns
// the first error instead of failing the test.
func TryProduce(brokers []string, recs ...*kgo.Record) error {
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...),
		kgo.RecordPartitioner(kgo.StickyKeyPartitioner(nil)),
		kgo.RequiredAcks(kgo.AllISRAcks()))
	if err != nil {
		return fmt.Errorf("kafka client: %w", err)
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := cl.ProduceSync(ctx, recs...).FirstErr(); err != nil {
		return fmt.Errorf("produce %d records: %w", len(recs), err)
	}
	return nil
}

// EndOffsets returns each partition's end offset (high watermark) of
// topic. It counts every record ever produced, including those of aborted
// transactions and the transaction markers.
func EndOffsets(t testing.TB, brokers []string, topic string) map[int32]int64 {
	t.Helper()
	return listOffsets(t, brokers, topic, kgo.ReadUncommitted())
}

// EndOffsetSum is the sum of topic's [EndOffsets]: it grows with every
// record produced to it, committed or not.
func EndOffsetSum(t testing.TB, brokers []string, topic string) int64 {
	t.Helper()
	var n int64
	for _, off := range EndOffsets(t, brokers, topic) {
		n += off
	}
	return n
}

// listOffsets returns each partition's end offset for a consumer at level:
// the last stable offset for read_committed, the high watermark otherwise.
func listOffsets(t testing.TB, brokers []string, topic string, level kgo.IsolationLevel) map[int32]int64 {
	t.Helper()
	adm, closeAdm, err := newAdmin(brokers)
	if err != nil {
		t.Fatalf("testenv: %v", err)
	}
	defer closeAdm()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	list := adm.ListEndOffsets
	if level == kgo.ReadCommitted() {
		list = adm.ListCommittedOffsets
	}
	listed, err := list(ctx, topic)
	if err == nil {
		err = listed.Error()
	}
	if err != nil {
		t.Fatalf("testenv: end offsets of %s: %v", topic, err)
	}
	out := map[int32]int64{}
	listed.Each(func(o kadm.ListedOffset) { out[o.Partition] = o.Offset })
	return out
}

// ReadCommitted returns the records of topic a read_committed consumer
// sees, from each partition's start up to its last stable offset at the
// time of the call, in each partition's order (partitions interleaved).
// Records of aborted transactions and transaction markers are left out.
func ReadCommitted(t testing.TB, brokers []string, topic string) []*kgo.Record {
	t.Helper()
	return ReadTopic(t, brokers, topic, kgo.ReadCommitted())
}

// ReadTopic returns topic's data records from each partition's start up
// to its end at the time of the call (the last stable offset for
// read_committed, the high watermark otherwise), in each partition's
// order. It fails the test if they are not read within two minutes.
func ReadTopic(t testing.TB, brokers []string, topic string, level kgo.IsolationLevel) []*kgo.Record {
	t.Helper()
	todo := map[int32]int64{}
	from := map[int32]kgo.Offset{}
	for p, end := range listOffsets(t, brokers, topic, level) {
		if end > 0 {
			todo[p] = end
			// An exact offset, not AtStart: no offset listing, whose late
			// answer can start a fetch while Close runs (a data race inside
			// franz-go v1.22's Client.close).
			from[p] = kgo.NewOffset().At(0)
		}
	}
	if len(todo) == 0 {
		return nil
	}
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...),
		kgo.ConsumePartitions(map[string]map[int32]kgo.Offset{topic: from}),
		kgo.FetchMaxWait(100*time.Millisecond),
		kgo.FetchIsolationLevel(level),
		// Markers too, so the read sees it reached a partition's end when
		// the last offsets below it are markers.
		kgo.KeepControlRecords())
	if err != nil {
		t.Fatalf("testenv: %v", err)
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var out []*kgo.Record
	for len(todo) > 0 {
		fs := cl.PollFetches(ctx)
		if ctx.Err() != nil {
			t.Fatalf("testenv: read %s: partitions %v (partition: end) not read to their end within 2m", topic, todo)
		}
		fs.EachError(func(topic string, p int32, err error) { t.Fatalf("testenv: consume %s/%d: %v", topic, p, err) })
		fs.EachRecord(func(r *kgo.Record) {
			end, ok := todo[r.Partition]
			if !ok || r.Offset >= end {
				return
			}
			if r.Offset+1 >= end {
				delete(todo, r.Partition)
			}
			if !r.Attrs.IsControl() {
				out = append(out, r)
			}
		})
	}
	return out
}

// Header returns the value of r's first header named key, "" if it has
// none.
func Header(r *kgo.Record, key string) string {
	for _, h := range r.Headers {
		if h.Key == key {
			return string(h.Value)
		}
	}
	return ""
}
