package processor

import (
	"context"
	"errors"
	"fmt"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/paystream/paystream/internal/statelog"
	"github.com/paystream/paystream/internal/store"
)

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
