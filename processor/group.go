package processor

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/paystream/paystream/internal/store"
	"github.com/paystream/paystream/internal/tracing"
)

// Batches of several partitions share a Postgres transaction.
//
// A batch transaction has a fixed cost in Postgres, whatever its size:
// BEGIN, the statements' executor start, the offset row locks, COMMIT's
// WAL flush, the relay's decoding of it. With one transaction per
// partition's batch, that cost was most of Postgres's CPU per delivery
// (bench-e2e over 6 partitions: ≈ 28 deliveries a transaction; the same
// load over 2 partitions, ≈ 100 a transaction, cost a third less in
// Postgres and half in the processor). So a processor runs at most
// Config.Transactions batch transactions at once, and a batch that is
// ready while they are all busy waits for the next one, which takes every
// batch waiting then, of any of the processor's partitions: under load
// each transaction carries several partitions' batches, and when quiet a
// batch starts at once, alone.
//
// A shared transaction keeps each batch's guarantees: it locks every
// partition's offset row (in partition order, in one statement) and checks
// each one's owner epoch and stored offset as a batch alone would; it
// stores each partition's next offset. Payments never span partitions (a
// payment's records all land on one), so the batches' payments are
// disjoint and each payment's events are still decided in offset order.
// What one batch alone would answer differently is handled by running
// again without it: a fenced or rolled-back partition gets its error and
// the others commit without it; a record that fails deterministically
// (poison) sends every batch of the transaction back to be committed
// alone, where the record is isolated as before.
type committer struct {
	p     *Processor
	slots chan struct{} // one per transaction that may run at once

	mu      sync.Mutex
	pending []*commitReq
}

// commitReq is a batch waiting for a transaction.
type commitReq struct {
	ctx  context.Context // the batch's own: its span, its deadline
	w    *Worker
	recs []*kgo.Record
	ds   []delivery // decoded by the transaction that takes it
	done chan commitAnswer
}

type commitAnswer struct {
	out batchOutcome
	err error
}

// errCommitAlone asks a worker to commit its batch in a transaction of its
// own (commitRefetched): the shared one failed on a poisonous record, of
// this batch or another's.
var errCommitAlone = errors.New("batch to be committed alone")

func newCommitter(p *Processor, transactions int) *committer {
	return &committer{p: p, slots: make(chan struct{}, transactions)}
}

// commit commits recs, one batch of w's partition, in a transaction alone
// or shared with other partitions' batches, and returns its outcome, or
// errCommitAlone. The goroutine that gets a free transaction runs it for
// every batch waiting at that moment, its own or not; the others wait for
// their answer.
func (c *committer) commit(ctx context.Context, w *Worker, recs []*kgo.Record) (batchOutcome, error) {
	req := &commitReq{ctx: ctx, w: w, recs: recs, done: make(chan commitAnswer, 1)}
	c.mu.Lock()
	c.pending = append(c.pending, req)
	c.mu.Unlock()
	select {
	case r := <-req.done:
		return r.out, r.err
	case c.slots <- struct{}{}:
		c.mu.Lock()
		reqs := c.pending
		c.pending = nil
		c.mu.Unlock()
		c.run(reqs)
		<-c.slots
		// req was among reqs, answered by now, or taken earlier by another
		// transaction, which answers it.
		r := <-req.done
		return r.out, r.err
	}
}

// run commits reqs and answers each of them.
func (c *committer) run(reqs []*commitReq) {
	// A partition's worker waits for its batch's answer before the next,
	// but a revoked partition's new worker could meet its old one here:
	// such a second batch of one partition waits for the next round.
	for len(reqs) > 0 {
		var round, later []*commitReq
		seen := map[int32]bool{}
		for _, r := range reqs {
			if seen[r.w.partition] {
				later = append(later, r)
				continue
			}
			seen[r.w.partition] = true
			round = append(round, r)
		}
		c.runRound(round)
		reqs = later
	}
}

// runRound commits reqs, batches of distinct partitions, in one
// transaction, or alone when that is all there is.
func (c *committer) runRound(reqs []*commitReq) {
	p := c.p
	if len(reqs) == 1 {
		c.runAlone(reqs[0])
		return
	}
	var shared []*commitReq
	for _, r := range reqs {
		ds, err := decodeAll(r.recs, nil)
		if err != nil {
			r.done <- commitAnswer{err: errCommitAlone} // its poison is isolated alone
			continue
		}
		if h := tracing.StateHeaders(r.ctx); h != nil {
			for i := range ds {
				ds[i].headers = h
			}
		}
		r.ds = ds
		shared = append(shared, r)
	}
	for len(shared) > 0 {
		if len(shared) == 1 {
			c.runAlone(shared[0])
			return
		}
		ctx, cancel := context.WithTimeout(context.Background(), commitTimeout)
		outs, refused, err := runShared(ctx, p.pool, p.applier, p.cfg.Group, shared)
		cancel()
		if len(refused) > 0 {
			// Fenced or rolled back: those batches get their error, the
			// others are committed again without them.
			var rest []*commitReq
			for i, r := range shared {
				if e, ok := refused[i]; ok {
					r.done <- commitAnswer{err: e}
				} else {
					rest = append(rest, r)
				}
			}
			shared = rest
			continue
		}
		if err != nil && isPoison(err) {
			err = errCommitAlone
		}
		if err == nil {
			p.metrics.transactionBatches.Observe(float64(len(shared)))
		}
		for i, r := range shared {
			if err != nil {
				r.done <- commitAnswer{err: err}
			} else {
				r.done <- commitAnswer{out: outs[i]}
			}
		}
		return
	}
}

// runAlone commits r's batch in a transaction of its own.
func (c *committer) runAlone(r *commitReq) {
	out, err := c.commitAlone(r.ctx, r.w, r.recs)
	r.done <- commitAnswer{out, err}
}

// commitAlone commits recs, one batch of w's partition, in a transaction
// of its own (commitRefetched): for a batch alone in its round, and for
// one that commit answered with errCommitAlone.
func (c *committer) commitAlone(ctx context.Context, w *Worker, recs []*kgo.Record) (batchOutcome, error) {
	p := c.p
	out, err := commitRefetched(ctx, p.pool, p.applier, p.cfg.Group, w.epoch, w.committed, recs, nil)
	if err == nil {
		p.metrics.transactionBatches.Observe(1)
	}
	return out, err
}

// errRefused rolls back a shared transaction one of whose partitions was
// refused (runShared's refused says which).
var errRefused = errors.New("a partition of the shared transaction was refused")

// runShared applies the batches of reqs (each one partition's records, in
// offset order, decoded; partitions distinct) in one transaction that also
// stores each partition's next offset, with the round trips of a single
// batch (see commitBatch). A partition whose stored owner epoch or offset
// refuses its batch fails the transaction with its error in refused, by
// index in reqs; nothing is then written.
func runShared(ctx context.Context, db beginner, a *applier, group string, reqs []*commitReq) (outs []batchOutcome, refused map[int]error, err error) {
	topic := reqs[0].recs[0].Topic
	partitions := make([]int32, len(reqs))
	var all []delivery
	starts := make([]int, len(reqs))
	for i, r := range reqs {
		partitions[i] = r.w.partition
		starts[i] = len(all)
		all = append(all, r.ds...)
	}
	err = pgx.BeginFunc(ctx, db, func(tx pgx.Tx) error {
		outs, refused = make([]batchOutcome, len(reqs)), nil
		b := &pgx.Batch{}
		locks := store.QueueLockPartitions(b, group, topic, partitions,
			store.Bounds{IdleInTransaction: a.idleTimeout, Statement: commitTimeout})
		load := a.queueLoad(b, all)
		if err := tx.SendBatch(ctx, b).Close(); err != nil {
			return fmt.Errorf("lock partition offsets and load batches: %w", err)
		}
		// Fills all in (ids, redeliveries) before its batches are taken.
		payments, err := load()
		if err != nil {
			return err
		}
		var decide []delivery
		nexts := make([]int64, len(reqs))
		for i, r := range reqs {
			next, owner, err := locks.Result(r.w.partition)
			out, skip, err := admit(topic, r.w.partition, r.w.epoch, r.w.committed, r.recs, next, owner, err)
			if err != nil {
				if refused == nil {
					refused = map[int]error{}
				}
				refused[i] = err
				continue
			}
			outs[i] = out
			ds := all[starts[i] : starts[i]+len(r.ds)]
			decide = append(decide, ds[skip:]...)
			nexts[i] = outs[i].next
		}
		if refused != nil {
			return errRefused
		}
		if len(decide) == 0 {
			return nil
		}
		b = &pgx.Batch{}
		results, err := a.decideQueued(ctx, b, decide, payments)
		if err != nil {
			return err
		}
		store.QueueStoreOffsets(b, group, topic, partitions, nexts)
		if err := tx.SendBatch(ctx, b).Close(); err != nil {
			return fmt.Errorf("write batches: %w", err)
		}
		at := make(map[int32]int, len(reqs))
		for i, r := range reqs {
			at[r.w.partition] = i
		}
		for _, res := range results {
			i := at[res.partition]
			outs[i].results = append(outs[i].results, res)
		}
		return nil
	})
	if refused != nil {
		return nil, refused, nil
	}
	if err != nil {
		return nil, nil, err
	}
	return outs, nil, nil
}
