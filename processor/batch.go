package processor

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/paystream/paystream/internal/payment"
	"github.com/paystream/paystream/internal/retry"
	"github.com/paystream/paystream/internal/store"
)

// claimLockTimeout bounds one attempt of a claim to wait for the partition's
// offset row, which the previous owner's open batch transaction locks.
const claimLockTimeout = time.Second

// claimed is what claiming a partition found.
type claimed struct {
	epoch int64 // the caller's owner epoch
	next  int64 // the offset to resume from
	// fresh is true when no offset was stored for the partition.
	fresh bool
	// reincarnated is true when the stored offsets belonged to an earlier
	// incarnation of the topic (deleted and recreated under the same name,
	// with another topic ID): they were discarded and next is 0.
	reincarnated bool
	// prevTopicID is the topic ID stored before, if any.
	prevTopicID string
}

// claim makes the caller the owner of a partition: it bumps the partition's
// owner_epoch and returns the epoch and the offset to resume from. fresh is
// true when paystream has never stored an offset for the partition.
func claim(ctx context.Context, db batcher, group, topic string, partition int32) (epoch, next int64, fresh bool, err error) {
	c, err := claimIncarnation(ctx, db, group, topic, partition, "")
	return c.epoch, c.next, c.fresh, err
}

// claimIncarnation is claim for the incarnation of topic whose Kafka topic
// ID is topicID ("" if unknown: the stored ID is then neither checked nor
// changed). When the stored ID differs, the stored offset belongs to a
// topic that no longer exists and the partition resumes from 0.
//
// One attempt waits at most claimLockTimeout for the offset row (a previous
// owner's open transaction locks it) and then fails with SQLSTATE 55P03;
// see Processor.claimPartition for the retries.
func claimIncarnation(ctx context.Context, db store.DB, group, topic string, partition int32, topicID string) (claimed, error) {
	sc, err := store.ClaimPartition(ctx, db, group, topic, partition, topicID, claimLockTimeout)
	if err != nil {
		return claimed{}, err
	}
	c := claimed{epoch: sc.Epoch, next: sc.Next, fresh: sc.Fresh, prevTopicID: sc.PrevTopicID}
	// The previous ID is read from the statement's snapshot, for the log
	// only: the UPDATE itself compared the row's latest version.
	c.reincarnated = !c.fresh && topicID != "" && c.prevTopicID != "" && c.prevTopicID != topicID && c.next == 0
	return c, nil
}

// claimPartition claims a partition for this processor, retrying until it
// succeeds or ctx ends. A previous owner that froze or lost its network in
// the middle of a batch transaction still holds the partition's offset row:
// its session is ended by Postgres after IdleInTransactionTimeout when it
// froze between statements, but nothing server-side ends one that froze in
// the middle of sending a statement (Postgres 15 has no
// transaction_timeout). So once a claim has waited IdleInTransactionTimeout
// plus claimLockTimeout, it terminates the backend that holds the row
// (pg_terminate_backend: the same database role, or pg_signal_backend). The
// holder's transaction rolls back, and its retry is fenced by the new epoch.
func (p *Processor) claimPartition(ctx context.Context, topic string, partition int32) (claimed, error) {
	topicID := p.topicID(ctx, topic)
	start := time.Now()
	backoff := retry.Policy{Initial: 50 * time.Millisecond, Max: p.cfg.RetryBackoffMax}.Backoff()
	for {
		c, err := claimIncarnation(ctx, p.pool, p.cfg.Group, topic, partition, topicID)
		if err == nil {
			if c.reincarnated {
				p.log.Warn("topic was recreated: offsets stored for its previous incarnation discarded, resuming the partition from its start",
					"topic", topic, "partition", partition, "topic_id", topicID, "previous_topic_id", c.prevTopicID)
			}
			return c, nil
		}
		var pgErr *pgconn.PgError
		waiting := errors.As(err, &pgErr) && pgErr.Code == "55P03"
		switch {
		case !waiting:
			p.log.Warn("claim partition failed, retrying", "partition", partition, "error", err)
		case time.Since(start) >= p.cfg.IdleInTransactionTimeout+claimLockTimeout && p.cfg.IdleInTransactionTimeout > 0:
			p.terminateHolder(ctx, topic, partition, time.Since(start))
		default:
			p.log.Info("partition still locked by its previous owner's transaction, waiting", "partition", partition, "waited", time.Since(start).Round(time.Millisecond))
		}
		wait := backoff.Again() // waiting for a lock its owner releases: poll, do not back off further
		if !waiting {
			wait = backoff.Next()
		}
		select {
		case <-ctx.Done():
			return claimed{}, errors.Join(ctx.Err(), err)
		case <-time.After(wait):
		}
	}
}

// terminateHolder ends the session whose transaction locks the partition's
// offset row: the transaction that last locked or updated the row (its
// xmax) holds a lock on its own transaction ID, which names its backend.
func (p *Processor) terminateHolder(ctx context.Context, topic string, partition int32, waited time.Duration) {
	pid, terminated, err := store.TerminateHolder(ctx, p.pool, p.cfg.Group, topic, partition)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		// Released meanwhile.
	case err != nil:
		p.log.Error("cannot end the session holding a partition: grant the processor's role pg_signal_backend, or end it by hand",
			"partition", partition, "waited", waited.Round(time.Millisecond), "error", err)
	default:
		p.log.Warn("ended the session of a previous owner that held the partition past the idle-in-transaction timeout",
			"partition", partition, "pid", pid, "terminated", terminated, "waited", waited.Round(time.Millisecond))
	}
}

// topicID returns the Kafka topic ID of topic, or "" if the broker does not
// tell (then claims neither check nor record it).
func (p *Processor) topicID(ctx context.Context, topic string) string {
	cl := p.kcl.Load()
	if cl == nil {
		return ""
	}
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	md, err := kadm.NewClient(cl).Metadata(ctx, topic)
	if err != nil {
		p.log.Warn("topic metadata unavailable; claiming without checking the topic ID", "topic", topic, "error", err)
		return ""
	}
	td, ok := md.Topics[topic]
	if !ok || td.Err != nil || td.ID == (kadm.TopicID{}) {
		return ""
	}
	return td.ID.String()
}

// batcher is what a claim needs from a pool or connection.
type batcher = store.DB

// beginner is what a batch needs from a pool: a transaction.
type beginner interface {
	Begin(ctx context.Context) (pgx.Tx, error)
}

// batchOutcome summarizes a committed batch.
type batchOutcome struct {
	next    int64 // the partition's next offset after the commit
	applied int   // records at or past the stored offset
	slow    bool  // the batch was applied record by record (it held poison)
	results []result
}

// commitBatch applies recs (one partition's, in offset order) in a single
// transaction that also advances the partition's stored offset. It locks the
// offset row first and fails with ErrFenced if another owner has claimed the
// partition since epoch was taken. Records below the stored offset were
// applied by an earlier transaction and are skipped.
//
// The batch is first applied whole, in four round trips whatever its size:
// BEGIN; the lock with the batch's reads; the batch's writes with the
// offset; COMMIT. If a record in it fails deterministically, the transaction is
// rolled back and run again record by record, each under a savepoint, so
// the poisonous record alone is quarantined and the rest apply. Any other
// failure aborts the transaction so the caller can retry it.
func commitBatch(ctx context.Context, db beginner, a *applier, group string, epoch int64, recs []*kgo.Record) (batchOutcome, error) {
	return commitRefetched(ctx, db, a, group, epoch, -1, recs, nil)
}

// commitRefetched is commitBatch for a batch some of whose records were
// refetched from their gateway beforehand: refetched holds, by offset, the
// facts the gateway's API asserted, applied instead of the webhook's.
//
// committed is the next offset the caller's last commit stored (-1: not
// known). A stored offset below it means Postgres lost that commit:
// ErrOffsetRolledBack. (A stored offset below the batch's first record is
// not enough to tell: a transactional producer's commit markers take
// offsets no consumer sees.)
func commitRefetched(ctx context.Context, db beginner, a *applier, group string, epoch, committed int64, recs []*kgo.Record, refetched map[int64][]payment.Fact) (batchOutcome, error) {
	out, err := runBatch(ctx, db, a, group, epoch, committed, recs, refetched, false)
	if err != nil && isPoison(err) {
		out, err = runBatch(ctx, db, a, group, epoch, committed, recs, refetched, true)
		out.slow = true
	}
	return out, err
}

func runBatch(ctx context.Context, db beginner, a *applier, group string, epoch, committed int64, recs []*kgo.Record, refetched map[int64][]payment.Fact, slow bool) (batchOutcome, error) {
	var out batchOutcome
	if len(recs) == 0 {
		return out, nil
	}
	topic, partition := recs[0].Topic, recs[0].Partition
	var ds []delivery
	if !slow {
		var err error
		if ds, err = decodeAll(recs, refetched); err != nil {
			return out, err
		}
	}
	err := pgx.BeginFunc(ctx, db, func(tx pgx.Tx) error {
		// Round trip 1: the partition's offset row lock, with server-side
		// bounds (a processor that freezes — SIGSTOP, a VM pause — between
		// statements has its session ended after idleTimeout, releasing
		// the row for the partition's next owner; a statement runs at most
		// as long as the worker waits for the whole transaction), and,
		// queued behind it so they run under it, the batch's reads.
		b := &pgx.Batch{}
		lock := store.QueueLockPartition(b, group, topic, partition,
			store.Bounds{IdleInTransaction: a.idleTimeout, Statement: commitTimeout})
		var load func() (map[string]*paymentRow, error)
		if !slow {
			load = a.queueLoad(b, ds)
		}
		if err := tx.SendBatch(ctx, b).Close(); err != nil {
			return fmt.Errorf("lock partition offset and load batch: %w", err)
		}
		next, owner, err := lock.Result()
		var skip int
		if out, skip, err = admit(topic, partition, epoch, committed, recs, next, owner, err); err != nil {
			return err
		}
		if skip == len(recs) {
			return nil
		}
		if slow {
			for _, rec := range recs[skip:] {
				rs, err := applyOne(ctx, tx, a, rec, refetched)
				if err != nil {
					return err
				}
				out.results = append(out.results, rs...)
			}
			b := &pgx.Batch{}
			store.QueueStoreOffset(b, group, topic, partition, out.next)
			if err := tx.SendBatch(ctx, b).Close(); err != nil {
				return fmt.Errorf("store offset: %w", err)
			}
			return nil
		}
		payments, err := load()
		if err != nil {
			return err
		}
		// Round trip 2: every row the batch decided on, and the offset.
		b = &pgx.Batch{}
		if out.results, err = a.decideQueued(ctx, b, ds[skip:], payments); err != nil {
			return err
		}
		store.QueueStoreOffset(b, group, topic, partition, out.next)
		if err := tx.SendBatch(ctx, b).Close(); err != nil {
			return fmt.Errorf("write batch: %w", err)
		}
		return nil
	})
	if err != nil {
		return batchOutcome{}, err
	}
	return out, nil
}

// admit checks a batch of recs (one partition's, in offset order) against
// its partition's offset row as the batch's transaction locked it (next,
// owner and err from the lock's Result): ErrFenced when the row is missing
// or another owner claimed the partition since epoch, ErrOffsetRolledBack
// when it holds less than committed, the next offset this worker last
// stored. Otherwise it returns how many of recs to skip and the batch's
// outcome once the rest apply.
//
// Records below the stored offset were applied by an earlier transaction
// (a retry after a commit whose answer was lost). What was read for them is
// read under the lock like the rest, so it stays valid for the others:
// their dedup keys are stored, their payments are as that transaction left
// them.
func admit(topic string, partition int32, epoch, committed int64, recs []*kgo.Record, next, owner int64, err error) (batchOutcome, int, error) {
	switch {
	case errors.Is(err, store.ErrNoOffsetRow):
		return batchOutcome{}, 0, fmt.Errorf("%w: %w", ErrFenced, err)
	case err != nil:
		return batchOutcome{}, 0, err
	case owner != epoch:
		return batchOutcome{}, 0, fmt.Errorf("%w: %s/%d epoch %d, ours %d", ErrFenced, topic, partition, owner, epoch)
	case next < committed:
		return batchOutcome{}, 0, fmt.Errorf("%w: %s/%d stored next offset %d, this worker committed up to %d", ErrOffsetRolledBack, topic, partition, next, committed)
	}
	skip := 0
	for skip < len(recs) && recs[skip].Offset < next {
		skip++
	}
	out := batchOutcome{next: next, applied: len(recs) - skip}
	if skip < len(recs) {
		out.next = recs[len(recs)-1].Offset + 1
	}
	return out, skip, nil
}

// applyOne applies one record under a savepoint, quarantining it if it fails
// deterministically.
func applyOne(ctx context.Context, tx pgx.Tx, a *applier, rec *kgo.Record, refetched map[int64][]payment.Fact) ([]result, error) {
	sp, err := tx.Begin(ctx)
	if err != nil {
		return nil, fmt.Errorf("savepoint: %w", err)
	}
	rs, err := a.applyBatch(ctx, sp, []*kgo.Record{rec}, refetched)
	if err == nil {
		if err := sp.Commit(ctx); err != nil {
			return nil, fmt.Errorf("release savepoint: %w", err)
		}
		return rs, nil
	}
	if !isPoison(err) {
		return nil, err
	}
	if rbErr := sp.Rollback(ctx); rbErr != nil {
		return nil, fmt.Errorf("rollback to savepoint: %w", rbErr)
	}
	r, qErr := quarantine(ctx, tx, a.now(), rec, err)
	if qErr != nil {
		return nil, qErr
	}
	return []result{r}, nil
}
