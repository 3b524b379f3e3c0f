package testenv

import (
	"fmt"
	"testing"

	"github.com/twmb/franz-go/pkg/kgo"
)

// TestReadCommitted produces a committed transaction, an aborted one and a
// plain record with one key, then checks what each reader returns: the
// read_committed one leaves the aborted records out, the read_uncommitted
// one keeps them, both in order and without markers; the end offsets count
// the records and both markers.
func TestReadCommitted(t *testing.T) {
	t.Parallel()
	brokers := Kafka(t)
	topic := Topic(t, "read", 3)

	txn := func(commit bool, values ...string) {
		cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.TransactionalID(topic+fmt.Sprint(commit)),
			kgo.DefaultProduceTopic(topic), kgo.RecordPartitioner(kgo.StickyKeyPartitioner(nil)))
		if err != nil {
			t.Fatal(err)
		}
		defer cl.Close()
		if err := cl.BeginTransaction(); err != nil {
			t.Fatal(err)
		}
		for _, v := range values {
			if err := cl.ProduceSync(t.Context(), &kgo.Record{Key: []byte("k"), Value: []byte(v)}).FirstErr(); err != nil {
				t.Fatal(err)
			}
		}
		if err := cl.EndTransaction(t.Context(), kgo.TransactionEndTry(commit)); err != nil {
			t.Fatal(err)
		}
	}
	txn(true, "c1", "c2")
	txn(false, "a1")
	Produce(t, brokers, &kgo.Record{Topic: topic, Key: []byte("k"), Value: []byte("p1")})

	values := func(recs []*kgo.Record) string {
		var out []string
		for _, r := range recs {
			out = append(out, string(r.Value))
		}
		return fmt.Sprint(out)
	}
	if got, want := values(ReadCommitted(t, brokers, topic)), "[c1 c2 p1]"; got != want {
		t.Errorf("ReadCommitted: %s, want %s", got, want)
	}
	if got, want := values(ReadTopic(t, brokers, topic, kgo.ReadUncommitted())), "[c1 c2 a1 p1]"; got != want {
		t.Errorf("ReadTopic read_uncommitted: %s, want %s", got, want)
	}
	if got, want := EndOffsetSum(t, brokers, topic), int64(6); got != want { // 4 records, 2 markers
		t.Errorf("EndOffsetSum = %d, want %d", got, want)
	}
	if n := len(EndOffsets(t, brokers, topic)); n != 3 {
		t.Errorf("EndOffsets has %d partitions, want 3", n)
	}
	if recs := ReadCommitted(t, brokers, Topic(t, "empty", 2)); len(recs) != 0 {
		t.Errorf("ReadCommitted of an empty topic: %d records", len(recs))
	}
}
