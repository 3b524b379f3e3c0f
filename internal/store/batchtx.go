package store

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
)

// Beginner starts transactions: a pool or a connection.
type Beginner interface {
	Begin(ctx context.Context) (pgx.Tx, error)
}

// BatchLock is what a batch transaction locks before anything else: the
// offset rows of its partitions, which every writer of a payment locks
// first and keeps until it commits (see Reads), so two transactions that
// write one payment never overlap.
type BatchLock struct {
	// Group and Topic name the offset rows of Partitions.
	Group, Topic string
	// Partitions are the partitions whose offset rows are locked, in one
	// statement in partition order (every writer that locks more than one
	// row does so in key order, so none deadlocks). A missing row is not
	// an error of the transaction: BatchTx.Offset reports it.
	Partitions []int32
	// AllPartitions locks every offset row of the schema instead (every
	// group, topic and partition), in key order: a writer outside the
	// consumer group (replay) then excludes every worker and sweeper until
	// it commits, whatever partition its payment's records are consumed
	// from.
	AllPartitions bool
	// LockTimeout bounds every lock wait of the transaction (SQLSTATE
	// 55P03 after). Defaults to the server's setting.
	LockTimeout time.Duration
	// Bounds are the transaction's server-side limits, set before the
	// lock.
	Bounds Bounds
}

// Bounds are server-side limits for a batch transaction (0: the server's).
type Bounds struct {
	// IdleInTransaction ends the session of a transaction whose client
	// sends nothing for this long (a frozen processor), releasing its
	// locks.
	IdleInTransaction time.Duration
	// Statement bounds each statement.
	Statement time.Duration
}

// BatchTx is a batch transaction: the transaction in which paystream
// writes payments, for a batch of records, a refetch or a replay. The
// caller decides; BatchTx turns what it decided into round trips:
// BeginBatch locks and reads (one round trip after BEGIN), Write writes
// (one), Commit commits.
//
// A BatchTx is not safe for concurrent use.
type BatchTx struct {
	tx      pgx.Tx
	lock    BatchLock
	offsets map[int32]offsetRow
	// Loaded is what BeginBatch's reads read, under the lock.
	Loaded *Loaded
}

type offsetRow struct{ next, owner int64 }

// BeginBatch begins a batch transaction on db and, in one round trip,
// sets its bounds, takes lock and runs reads under it. On error nothing
// is left open.
func BeginBatch(ctx context.Context, db Beginner, lock BatchLock, reads Reads) (*BatchTx, error) {
	tx, err := db.Begin(ctx)
	if err != nil {
		return nil, fmt.Errorf("begin batch: %w", err)
	}
	t := &BatchTx{tx: tx, lock: lock, offsets: make(map[int32]offsetRow, len(lock.Partitions))}
	b := &pgx.Batch{}
	t.queueLock(b)
	t.Loaded = queueReads(b, reads)
	if b.Len() > 0 {
		err = tx.SendBatch(ctx, b).Close()
	}
	if err == nil {
		err = t.Loaded.check()
	}
	if err != nil {
		_ = tx.Rollback(ctx)
		return nil, fmt.Errorf("lock partition offsets and load batch: %w", err)
	}
	return t, nil
}

// queueLock queues the transaction's bounds and its lock on b.
func (t *BatchTx) queueLock(b *pgx.Batch) {
	l := t.lock
	if l.Bounds.IdleInTransaction > 0 {
		b.Queue(`SELECT set_config('idle_in_transaction_session_timeout', $1, true), set_config('statement_timeout', $2, true)`,
			Millis(l.Bounds.IdleInTransaction), Millis(l.Bounds.Statement))
	}
	if l.LockTimeout > 0 {
		b.Queue(`SELECT set_config('lock_timeout', $1, true)`, Millis(l.LockTimeout))
	}
	switch {
	case l.AllPartitions:
		b.Queue(`SELECT count(*) FROM (SELECT 1 FROM consumer_offsets ORDER BY group_id, topic, partition FOR UPDATE) AS locked`)
	case len(l.Partitions) > 0:
		b.Queue(`
			SELECT partition, next_offset, owner_epoch FROM consumer_offsets
			 WHERE group_id = $1 AND topic = $2 AND partition = ANY($3)
			 ORDER BY partition FOR UPDATE`, l.Group, l.Topic, l.Partitions).
			Query(func(rows pgx.Rows) error {
				var r offsetRow
				var partition int32
				_, err := pgx.ForEachRow(rows, []any{&partition, &r.next, &r.owner}, func() error {
					t.offsets[partition] = r
					return nil
				})
				return err
			})
	}
}

// Offset returns the next offset and owner epoch of a locked partition's
// row, or ErrNoOffsetRow when the row does not exist (the partition was
// never claimed in the group).
func (t *BatchTx) Offset(partition int32) (next, owner int64, err error) {
	r, ok := t.offsets[partition]
	if !ok {
		return 0, 0, fmt.Errorf("%w for %s/%d", ErrNoOffsetRow, t.lock.Topic, partition)
	}
	return r.next, r.owner, nil
}

// Read runs reads in one round trip (BeginBatch's reads come with the
// lock; Read is for more, such as a record read under its own savepoint).
func (t *BatchTx) Read(ctx context.Context, reads Reads) (*Loaded, error) {
	b := &pgx.Batch{}
	l := queueReads(b, reads)
	if b.Len() == 0 {
		return l, nil
	}
	if err := t.tx.SendBatch(ctx, b).Close(); err != nil {
		return nil, fmt.Errorf("load batch: %w", err)
	}
	return l, l.check()
}

// Write writes w in one round trip (none when w is empty); see Writes.
func (t *BatchTx) Write(ctx context.Context, w Writes) error {
	b := &pgx.Batch{}
	if err := t.queueWrites(b, w); err != nil {
		return err
	}
	if b.Len() == 0 {
		return nil
	}
	if err := t.tx.SendBatch(ctx, b).Close(); err != nil {
		return fmt.Errorf("write batch: %w", err)
	}
	return nil
}

// Savepoint starts a savepoint: the returned BatchTx's Commit releases it
// and its Rollback rolls back to it, leaving t open.
func (t *BatchTx) Savepoint(ctx context.Context) (*BatchTx, error) {
	sp, err := t.tx.Begin(ctx)
	if err != nil {
		return nil, fmt.Errorf("savepoint: %w", err)
	}
	return &BatchTx{tx: sp, lock: t.lock, offsets: t.offsets, Loaded: &Loaded{}}, nil
}

// Quarantine stores q (see Quarantine).
func (t *BatchTx) Quarantine(ctx context.Context, q Quarantined) error {
	return Quarantine(ctx, t.tx, q)
}

// Commit commits the transaction (or releases the savepoint).
func (t *BatchTx) Commit(ctx context.Context) error {
	return t.tx.Commit(ctx)
}

// Rollback rolls the transaction back (or to the savepoint). After Commit
// it only returns pgx.ErrTxClosed, so it can be deferred.
func (t *BatchTx) Rollback(ctx context.Context) error {
	return t.tx.Rollback(ctx)
}
