package store

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"
)

// ErrNoOffsetRow is returned by LockPartition when the partition was never
// claimed in the group.
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

// Bounds are server-side limits for a batch transaction (0: the server's).
type Bounds struct {
	IdleInTransaction time.Duration
	Statement         time.Duration
}

// LockPartition locks the partition's offset row for the rest of tx and
// returns its next offset and owner epoch, in one round trip that also
// sets bounds for the transaction. It fails with ErrNoOffsetRow when the
// row does not exist.
func LockPartition(ctx context.Context, tx pgx.Tx, group, topic string, partition int32, bounds Bounds) (next, owner int64, err error) {
	b := &pgx.Batch{}
	lock := QueueLockPartition(b, group, topic, partition, bounds)
	if err := tx.SendBatch(ctx, b).Close(); err != nil {
		return 0, 0, fmt.Errorf("lock partition offset: %w", err)
	}
	return lock.Result()
}

// PartitionLock is what QueueLockPartition read, once its batch was sent.
type PartitionLock struct {
	locks     *PartitionLocks
	partition int32
}

// Result returns the partition's next offset and owner epoch, or
// ErrNoOffsetRow when the row does not exist.
func (l *PartitionLock) Result() (next, owner int64, err error) {
	return l.locks.Result(l.partition)
}

// QueueLockPartition queues LockPartition's statements on b; statements
// queued after them on b run under the lock. A missing row is not an
// error of the batch (so what follows still runs and is discarded):
// Result reports it.
func QueueLockPartition(b *pgx.Batch, group, topic string, partition int32, bounds Bounds) *PartitionLock {
	return &PartitionLock{locks: QueueLockPartitions(b, group, topic, []int32{partition}, bounds), partition: partition}
}

// queueBounds queues the setting of bounds for the rest of the
// transaction (nothing when IdleInTransaction is 0: the server's).
func queueBounds(b *pgx.Batch, bounds Bounds) {
	if bounds.IdleInTransaction > 0 {
		b.Queue(`SELECT set_config('idle_in_transaction_session_timeout', $1, true), set_config('statement_timeout', $2, true)`,
			Millis(bounds.IdleInTransaction), Millis(bounds.Statement))
	}
}

// PartitionLocks is what QueueLockPartitions read, once its batch was sent.
type PartitionLocks struct {
	topic string
	rows  map[int32][2]int64 // next offset, owner epoch
}

// Result returns the partition's next offset and owner epoch, or
// ErrNoOffsetRow when its row does not exist.
func (l *PartitionLocks) Result(partition int32) (next, owner int64, err error) {
	r, ok := l.rows[partition]
	if !ok {
		return 0, 0, fmt.Errorf("%w for %s/%d", ErrNoOffsetRow, l.topic, partition)
	}
	return r[0], r[1], nil
}

// QueueLockPartitions queues the lock of several partitions' offset rows of
// one topic, in one statement in partition order (every writer that locks
// more than one row does so in key order, so none deadlocks), with
// QueueLockPartition's semantics for each: Result reports a missing row.
func QueueLockPartitions(b *pgx.Batch, group, topic string, partitions []int32, bounds Bounds) *PartitionLocks {
	l := &PartitionLocks{topic: topic, rows: make(map[int32][2]int64, len(partitions))}
	queueBounds(b, bounds)
	b.Queue(`
		SELECT partition, next_offset, owner_epoch FROM consumer_offsets
		 WHERE group_id = $1 AND topic = $2 AND partition = ANY($3)
		 ORDER BY partition FOR UPDATE`, group, topic, partitions).
		Query(func(rows pgx.Rows) error {
			var partition int32
			var next, owner int64
			_, err := pgx.ForEachRow(rows, []any{&partition, &next, &owner}, func() error {
				l.rows[partition] = [2]int64{next, owner}
				return nil
			})
			return err
		})
	return l
}

// LockAllPartitions locks every offset row of the schema (every group,
// topic and partition), in key order, for the rest of tx: a writer outside
// the consumer group (replay) then excludes every worker and sweeper until
// it commits, whatever partition its payment's records are consumed from.
// Every lock the rest of tx takes waits at most lockTimeout (SQLSTATE
// 55P03 after); with every partition excluded, none should wait. bounds
// are set for the rest of tx too, before the rows are locked.
func LockAllPartitions(ctx context.Context, tx pgx.Tx, lockTimeout time.Duration, bounds Bounds) error {
	b := &pgx.Batch{}
	queueBounds(b, bounds)
	b.Queue(`SELECT set_config('lock_timeout', $1, true)`, Millis(lockTimeout))
	b.Queue(`SELECT count(*) FROM (SELECT 1 FROM consumer_offsets ORDER BY group_id, topic, partition FOR UPDATE) AS locked`)
	if err := tx.SendBatch(ctx, b).Close(); err != nil {
		return fmt.Errorf("lock partitions: %w", err)
	}
	return nil
}

// QueueStoreOffset queues, on b, the move of the partition's next offset.
func QueueStoreOffset(b *pgx.Batch, group, topic string, partition int32, next int64) {
	QueueStoreOffsets(b, group, topic, []int32{partition}, []int64{next})
}

// QueueStoreOffsets queues, on b, the move of several partitions' next
// offsets (partitions[i] to nexts[i]), in one statement.
func QueueStoreOffsets(b *pgx.Batch, group, topic string, partitions []int32, nexts []int64) {
	b.Queue(`
		UPDATE consumer_offsets c SET next_offset = u.next, updated_at = now()
		  FROM unnest($3::int[], $4::bigint[]) AS u(partition, next)
		 WHERE c.group_id = $1 AND c.topic = $2 AND c.partition = u.partition`, group, topic, partitions, nexts)
}

// Millis formats d for a Postgres timeout setting.
func Millis(d time.Duration) string { return strconv.FormatInt(d.Milliseconds(), 10) }
