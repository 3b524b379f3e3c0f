package store

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"
)

// ErrNoOffsetRow is returned by BatchTx.Offset when the partition was
// never claimed in the group.
var ErrNoOffsetRow = errors.New("no offset row")

// Claim is what ClaimPartition found.
type Claim struct {
	Epoch int64 // the caller's owner epoch
	Next  int64 // the offset to resume from
	// Fresh is true when no offset was stored for the partition.
	Fresh bool
	// PrevTopicID is the topic ID stored before, "" if none.
	PrevTopicID string
}

// ClaimPartition bumps the partition's owner epoch in consumer_offsets
// (creating the row at offset 0) and returns the new epoch and the offset
// to resume from. topicID, when not "", is the Kafka topic ID of the live
// topic: a different stored ID means the stored offset belongs to a
// deleted incarnation, and the partition resumes from 0. It waits at most
// lockTimeout for the row (SQLSTATE 55P03 after).
func ClaimPartition(ctx context.Context, db DB, group, topic string, partition int32, topicID string, lockTimeout time.Duration) (Claim, error) {
	var c Claim
	var prev *string
	b := &pgx.Batch{}
	// One implicit transaction: the setting lasts for the claim only.
	b.Queue(`SELECT set_config('lock_timeout', $1, true)`, Millis(lockTimeout))
	b.Queue(`
		WITH prev AS (SELECT topic_id FROM consumer_offsets WHERE group_id = $1 AND topic = $2 AND partition = $3)
		INSERT INTO consumer_offsets AS co (group_id, topic, partition, next_offset, owner_epoch, topic_id)
		VALUES ($1, $2, $3, 0, 1, NULLIF($4, ''))
		ON CONFLICT (group_id, topic, partition) DO UPDATE
		   SET owner_epoch = co.owner_epoch + 1,
		       next_offset = CASE WHEN co.topic_id <> EXCLUDED.topic_id THEN 0 ELSE co.next_offset END,
		       topic_id = COALESCE(EXCLUDED.topic_id, co.topic_id),
		       updated_at = now()
		RETURNING owner_epoch, next_offset, (xmax = 0), (SELECT topic_id FROM prev)`,
		group, topic, partition, topicID).QueryRow(func(row pgx.Row) error {
		return row.Scan(&c.Epoch, &c.Next, &c.Fresh, &prev)
	})
	if err := db.SendBatch(ctx, b).Close(); err != nil {
		return Claim{}, fmt.Errorf("claim partition %s/%d: %w", topic, partition, err)
	}
	if prev != nil {
		c.PrevTopicID = *prev
	}
	return c, nil
}

// TerminateHolder ends the session whose transaction locks the partition's
// offset row: the transaction that last locked or updated the row (its
// xmax) holds a lock on its own transaction ID, which names its backend.
// It returns pgx.ErrNoRows when no other session holds it.
func TerminateHolder(ctx context.Context, db DB, group, topic string, partition int32) (pid int32, terminated bool, err error) {
	err = db.QueryRow(ctx, `
		SELECT l.pid, pg_terminate_backend(l.pid)
		  FROM consumer_offsets co
		  JOIN pg_locks l ON l.locktype = 'transactionid' AND l.transactionid = co.xmax AND l.mode = 'ExclusiveLock' AND l.granted
		 WHERE co.group_id = $1 AND co.topic = $2 AND co.partition = $3 AND l.pid <> pg_backend_pid()`,
		group, topic, partition).Scan(&pid, &terminated)
	return pid, terminated, err
}

// Millis formats d for a Postgres timeout setting.
func Millis(d time.Duration) string { return strconv.FormatInt(d.Milliseconds(), 10) }
