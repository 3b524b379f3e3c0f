package store

import (
	"context"
	"errors"

	"github.com/jackc/pgx/v5"
)

// TopicPartitions returns the partition count recorded for topic in
// topic_layout, and whether one is recorded.
func TopicPartitions(ctx context.Context, db DB, topic string) (partitions int32, recorded bool, err error) {
	err = db.QueryRow(ctx, `SELECT partitions FROM topic_layout WHERE topic = $1`, topic).Scan(&partitions)
	if errors.Is(err, pgx.ErrNoRows) {
		return 0, false, nil
	}
	return partitions, err == nil, err
}

// RecordTopicPartitions records partitions as topic's partition count,
// replacing any count recorded before.
func RecordTopicPartitions(ctx context.Context, db DB, topic string, partitions int32) error {
	_, err := db.Exec(ctx, `
		INSERT INTO topic_layout (topic, partitions, recorded_at) VALUES ($1, $2, now())
		ON CONFLICT (topic) DO UPDATE SET partitions = EXCLUDED.partitions, recorded_at = EXCLUDED.recorded_at`,
		topic, partitions)
	return err
}
