package testenv

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
)

func TestTopic(t *testing.T) {
	SkipIfShort(t)
	t.Parallel()

	t.Run("CreatesItWithItsPartitionsAndDeletesItAfterwards", func(t *testing.T) {
		t.Parallel()
		brokers := Kafka(t)

		var topic string
		t.Run("Inner", func(t *testing.T) { // not parallel: t.Run returns after its cleanup
			topic = Topic(t, "payments", 3)
			if !strings.HasPrefix(topic, "payments-TestTopic-CreatesItWithItsPartitionsAndDeletesItAfterwards-Inner-") {
				t.Errorf("topic name %q lacks the prefix and test name", topic)
			}

			adm := Admin(t, brokers)
			md, err := adm.Metadata(t.Context(), topic)
			if err != nil {
				t.Fatal(err)
			}
			td := md.Topics[topic]
			if td.Err != nil || len(td.Partitions) != 3 {
				t.Fatalf("metadata for %s: err %v, %d partitions; want 3", topic, td.Err, len(td.Partitions))
			}
			for _, p := range td.Partitions {
				if len(p.Replicas) != 1 {
					t.Errorf("partition %d has %d replicas, want 1", p.Partition, len(p.Replicas))
				}
			}

			// Usable at once: a record to its last partition goes through.
			cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.RecordPartitioner(kgo.ManualPartitioner()))
			if err != nil {
				t.Fatal(err)
			}
			defer cl.Close()
			if err := cl.ProduceSync(t.Context(), &kgo.Record{Topic: topic, Partition: 2, Value: []byte("v")}).FirstErr(); err != nil {
				t.Fatalf("produce to %s: %v", topic, err)
			}
		})
		if topic == "" {
			t.Fatal("inner test made no topic")
		}

		adm := Admin(t, brokers)
		WaitFor(t, 30*time.Second, func() error {
			md, err := adm.Metadata(t.Context(), topic)
			if err != nil {
				return err
			}
			if err := md.Topics[topic].Err; !errors.Is(err, kerr.UnknownTopicOrPartition) {
				return fmt.Errorf("topic %s still in metadata (err %v)", topic, err)
			}
			return nil
		})
	})

	t.Run("NamesAreUnique", func(t *testing.T) {
		t.Parallel()
		a, b := Topic(t, "dup", 1), Topic(t, "dup", 1)
		if a == b {
			t.Fatalf("two topics named %s", a)
		}
	})

	t.Run("RejectsZeroPartitions", func(t *testing.T) {
		t.Parallel()
		fatals, _ := runFake(t, func(tb testing.TB) { Topic(tb, "x", 0) })
		if len(fatals) != 1 || !strings.Contains(fatals[0], "partitions = 0") {
			t.Fatalf("fatals = %q, want one about partitions = 0", fatals)
		}
	})
}

func TestGroup(t *testing.T) {
	t.Parallel()

	a, b := Group(t), Group(t)
	if a == b {
		t.Fatalf("Group returned %s twice", a)
	}
	if !strings.HasPrefix(a, "g-TestGroup-") {
		t.Fatalf("Group = %q, want g-TestGroup-<random>", a)
	}
}
