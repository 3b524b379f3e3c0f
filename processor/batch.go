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

	"github.com/paystream/paystream/internal/retry"
	"github.com/paystream/paystream/internal/statelog"
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
func claim(ctx context.Context, db store.DB, group, topic string, partition int32) (epoch, next int64, fresh bool, err error) {
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

// batchOutcome summarizes a committed batch.
type batchOutcome struct {
	next    int64 // the partition's next offset after the commit
	applied int   // records at or past the stored offset
	slow    bool  // the batch was applied record by record (it held poison)
	results []result
}

// partitionBatch is one partition's batch: records in offset order,
// decoded, and what its worker knows of the partition.
type partitionBatch struct {
	partition int32
	epoch     int64 // the worker's owner epoch
	// committed is the next offset the worker's last commit stored (-1:
	// not known). A stored offset below it means Postgres lost that
	// commit: ErrOffsetRolledBack. (A stored offset below the batch's
	// first record is not enough to tell: a transactional producer's
	// commit markers take offsets no consumer sees.)
	committed int64
	recs      []*kgo.Record
	// headers are the trace context of the batch's span, carried by the
	// state events it causes.
	headers []statelog.Header
	// ds are recs decoded; nil when one does not decode (undecodable
	// says why): the batch is then committed record by record.
	ds          []delivery
	undecodable error
}

// newPartitionBatch decodes recs, one partition's records in offset
// order, into a batch.
func newPartitionBatch(partition int32, epoch, committed int64, recs []*kgo.Record, headers []statelog.Header) *partitionBatch {
	b := &partitionBatch{partition: partition, epoch: epoch, committed: committed, recs: recs, headers: headers}
	b.ds, b.undecodable = decodeAll(recs)
	for i := range b.ds {
		b.ds[i].headers = headers
	}
	return b
}

// commitBatches is the batch path: it applies bs (decoded batches of
// distinct partitions of one topic) in one transaction that also advances
// each partition's stored offset, in four round trips whatever their
// number and size: BEGIN; the lock of their offset rows with the reads
// queued behind it (store.BeginBatch); the writes with the offsets
// (BatchTx.Write); COMMIT. A single partition's batch is the case of one.
//
// Each batch keeps its own checks (admit): a partition whose stored owner
// epoch or offset refuses its batch fails the transaction with its error
// in refused, by index in bs, and nothing is written; the caller runs the
// others again without it. Records below the stored offset were applied
// by an earlier transaction and are skipped. A record that fails
// deterministically fails the transaction with a poison error: the caller
// then commits each batch alone, record by record (commitAlone).
func commitBatches(ctx context.Context, db store.Beginner, a *applier, group string, bs []*partitionBatch) (outs []batchOutcome, refused map[int]error, err error) {
	topic := bs[0].recs[0].Topic
	partitions := make([]int32, len(bs))
	var all []delivery
	starts := make([]int, len(bs))
	for i, b := range bs {
		partitions[i] = b.partition
		starts[i] = len(all)
		all = append(all, b.ds...)
	}
	// Round trip 1: the partitions' offset row locks, with server-side
	// bounds (a processor that freezes — SIGSTOP, a VM pause — between
	// statements has its session ended after idleTimeout, releasing the
	// rows for the partitions' next owners; a statement runs at most as
	// long as the worker waits for the whole transaction), and, queued
	// behind them so they run under them, the batches' reads.
	lock := a.lock(group, topic, partitions...)
	r, payments := reads(all)
	tx, err := store.BeginBatch(ctx, db, lock, r)
	if err != nil {
		return nil, nil, err
	}
	defer tx.Rollback(ctx) //nolint:errcheck // after Commit, or on the way out of a failure
	loaded(all, tx.Loaded, payments)

	outs = make([]batchOutcome, len(bs))
	var decide []delivery
	offsets := make([]store.Offset, 0, len(bs))
	for i, b := range bs {
		next, owner, err := tx.Offset(b.partition)
		out, skip, err := admit(topic, b, next, owner, err)
		if err != nil {
			if refused == nil {
				refused = map[int]error{}
			}
			refused[i] = err
			continue
		}
		outs[i] = out
		decide = append(decide, all[starts[i]+skip:starts[i]+len(b.ds)]...)
		offsets = append(offsets, store.Offset{Partition: b.partition, Next: out.next})
	}
	if refused != nil {
		return nil, refused, nil
	}
	if len(decide) > 0 {
		// Round trip 2: every row the batches decided on, and the offsets.
		w, results, err := a.decide(decide, payments)
		if err != nil {
			return nil, nil, err
		}
		w.Offsets = offsets
		if err := tx.Write(ctx, w); err != nil {
			return nil, nil, err
		}
		at := make(map[int32]int, len(bs))
		for i, b := range bs {
			at[b.partition] = i
		}
		for _, res := range results {
			i := at[res.partition]
			outs[i].results = append(outs[i].results, res)
		}
	}
	if err := tx.Commit(ctx); err != nil {
		return nil, nil, err
	}
	return outs, nil, nil
}

// commitAlone commits one partition's batch in a transaction of its own:
// commitBatches with one batch and, if a record in it fails
// deterministically, again record by record, each under a savepoint, so
// the poisonous record alone is quarantined and the rest apply. Any other
// failure is returned for the caller to retry.
func commitAlone(ctx context.Context, db store.Beginner, a *applier, group string, b *partitionBatch) (batchOutcome, error) {
	if len(b.recs) == 0 {
		return batchOutcome{}, nil
	}
	if b.undecodable == nil {
		outs, refused, err := commitBatches(ctx, db, a, group, []*partitionBatch{b})
		switch {
		case refused != nil:
			return batchOutcome{}, refused[0]
		case err == nil:
			return outs[0], nil
		case !isPoison(err):
			return batchOutcome{}, err
		}
	}
	out, err := commitRecordByRecord(ctx, db, a, group, b)
	out.slow = true
	return out, err
}

// commitRecordByRecord commits b in one transaction, each record under a
// savepoint: one that fails deterministically is rolled back to its
// savepoint and quarantined instead.
func commitRecordByRecord(ctx context.Context, db store.Beginner, a *applier, group string, b *partitionBatch) (batchOutcome, error) {
	topic := b.recs[0].Topic
	lock := a.lock(group, topic, b.partition)
	tx, err := store.BeginBatch(ctx, db, lock, store.Reads{})
	if err != nil {
		return batchOutcome{}, err
	}
	defer tx.Rollback(ctx) //nolint:errcheck // after Commit, or on the way out of a failure
	next, owner, err := tx.Offset(b.partition)
	out, skip, err := admit(topic, b, next, owner, err)
	if err != nil {
		return batchOutcome{}, err
	}
	if skip < len(b.recs) {
		for _, rec := range b.recs[skip:] {
			rs, err := applyOne(ctx, tx, a, rec, b.headers)
			if err != nil {
				return batchOutcome{}, err
			}
			out.results = append(out.results, rs...)
		}
		if err := tx.Write(ctx, store.Writes{Offsets: []store.Offset{{Partition: b.partition, Next: out.next}}}); err != nil {
			return batchOutcome{}, err
		}
	}
	if err := tx.Commit(ctx); err != nil {
		return batchOutcome{}, err
	}
	return out, nil
}

// applyOne applies one record under a savepoint, quarantining it if it fails
// deterministically.
func applyOne(ctx context.Context, tx *store.BatchTx, a *applier, rec *kgo.Record, headers []statelog.Header) ([]result, error) {
	sp, err := tx.Savepoint(ctx)
	if err != nil {
		return nil, err
	}
	rs, err := applyRecord(ctx, sp, a, rec, headers)
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
	q, r := quarantined(a.now(), rec, err)
	if err := tx.Quarantine(ctx, q); err != nil {
		return nil, err
	}
	return []result{r}, nil
}

// applyRecord applies rec alone in tx: a round trip of reads, the
// decision, a round trip of writes.
func applyRecord(ctx context.Context, tx *store.BatchTx, a *applier, rec *kgo.Record, headers []statelog.Header) ([]result, error) {
	ds, err := decodeAll([]*kgo.Record{rec})
	if err != nil {
		return nil, err
	}
	ds[0].headers = headers
	r, payments := reads(ds)
	l, err := tx.Read(ctx, r)
	if err != nil {
		return nil, err
	}
	loaded(ds, l, payments)
	w, results, err := a.decide(ds, payments)
	if err != nil {
		return nil, err
	}
	if err := tx.Write(ctx, w); err != nil {
		return nil, err
	}
	return results, nil
}

// admit checks b against its partition's offset row as the batch's
// transaction locked it (next, owner and err from BatchTx.Offset):
// ErrFenced when the row is missing or another owner claimed the partition
// since b's epoch, ErrOffsetRolledBack when it holds less than b's
// committed. Otherwise it returns how many of b's records to skip and the
// batch's outcome once the rest apply.
//
// Records below the stored offset were applied by an earlier transaction
// (a retry after a commit whose answer was lost). What was read for them is
// read under the lock like the rest, so it stays valid for the others:
// their dedup keys are stored, their payments are as that transaction left
// them.
func admit(topic string, b *partitionBatch, next, owner int64, err error) (batchOutcome, int, error) {
	if err := fence(topic, b.partition, b.epoch, owner, err); err != nil {
		return batchOutcome{}, 0, err
	}
	if next < b.committed {
		return batchOutcome{}, 0, fmt.Errorf("%w: %s/%d stored next offset %d, this worker committed up to %d", ErrOffsetRolledBack, topic, b.partition, next, b.committed)
	}
	recs := b.recs
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

// fence fails with ErrFenced unless epoch is still the partition's owner
// epoch (owner and err from BatchTx.Offset): the check every write on a
// partition's behalf goes through.
func fence(topic string, partition int32, epoch, owner int64, err error) error {
	switch {
	case errors.Is(err, store.ErrNoOffsetRow):
		return fmt.Errorf("%w: %w", ErrFenced, err)
	case err != nil:
		return err
	case owner != epoch:
		return fmt.Errorf("%w: %s/%d epoch %d, ours %d", ErrFenced, topic, partition, owner, epoch)
	}
	return nil
}

// lock is the lock of a batch transaction on partitions of topic, with the
// batch transactions' bounds.
func (a *applier) lock(group, topic string, partitions ...int32) store.BatchLock {
	return store.BatchLock{Group: group, Topic: topic, Partitions: partitions,
		Bounds: store.Bounds{IdleInTransaction: a.idleTimeout, Statement: commitTimeout}}
}
