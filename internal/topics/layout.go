package topics

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kadm"

	"github.com/paystream/paystream/internal/store"
)

// ErrNotRecorded is CheckPartitions' error for a topic whose partition
// count was never recorded (paystream migrate never ran with brokers).
var ErrNotRecorded = errors.New("partition count not recorded")

// ErrPartitionsChanged is the error of CheckPartitions and
// RecordPartitions when the live partition count differs from the
// recorded one.
var ErrPartitionsChanged = errors.New("partition count changed")

// Partitions returns topic's live partition count.
func Partitions(ctx context.Context, adm *kadm.Client, topic string) (int32, error) {
	td, err := describe(ctx, adm, topic)
	if err != nil {
		return 0, err
	}
	return int32(len(td.Partitions)), nil
}

// RecordPartitions records topic's live partition count in the
// topic_layout table and returns it. When a different count is recorded
// already it fails with ErrPartitionsChanged, unless accept is set (the
// operator followed the procedure for changing partition counts): then it
// records the new count.
func RecordPartitions(ctx context.Context, adm *kadm.Client, pool *pgxpool.Pool, topic string, accept bool) (int32, error) {
	live, err := Partitions(ctx, adm, topic)
	if err != nil {
		return 0, err
	}
	recorded, err := recordedPartitions(ctx, pool, topic)
	switch {
	case errors.Is(err, ErrNotRecorded):
	case err != nil:
		return 0, err
	case recorded == live:
		return live, nil
	case !accept:
		return 0, changedError(topic, live, recorded)
	}
	if err := store.RecordTopicPartitions(ctx, pool, topic, live); err != nil {
		return 0, fmt.Errorf("record partitions of topic %s: %w", topic, err)
	}
	return live, nil
}

// CheckPartitions fails with ErrPartitionsChanged when topic's live
// partition count differs from the one recorded by paystream migrate, and
// with ErrNotRecorded when none was recorded. A processor must not start
// then: Kafka maps a payment's key to a partition by the partition count,
// so after a change a payment's new events land on another partition than
// its old ones, and the two are applied in no particular order.
func CheckPartitions(ctx context.Context, adm *kadm.Client, pool *pgxpool.Pool, topic string) error {
	recorded, err := recordedPartitions(ctx, pool, topic)
	if err != nil {
		return err
	}
	live, err := Partitions(ctx, adm, topic)
	if err != nil {
		return err
	}
	if live != recorded {
		return changedError(topic, live, recorded)
	}
	return nil
}

func recordedPartitions(ctx context.Context, pool *pgxpool.Pool, topic string) (int32, error) {
	n, ok, err := store.TopicPartitions(ctx, pool, topic)
	if err != nil {
		return 0, fmt.Errorf("read recorded partitions of topic %s: %w", topic, err)
	}
	if !ok {
		return 0, fmt.Errorf("topic %s: %w: run paystream migrate with --kafka-brokers", topic, ErrNotRecorded)
	}
	return n, nil
}

func changedError(topic string, live, recorded int32) error {
	return fmt.Errorf("topic %s: %w: it has %d partitions, %d were recorded; adding partitions moves payments to other partitions "+
		"and breaks their order: follow the README's procedure for changing partition counts, "+
		"then run paystream migrate --accept-partition-change", topic, ErrPartitionsChanged, live, recorded)
}
