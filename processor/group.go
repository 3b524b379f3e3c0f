package processor

import (
	"context"
	"errors"
	"sync"
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
	b    *partitionBatch
	done chan commitAnswer
}

type commitAnswer struct {
	out batchOutcome
	err error
}

// errCommitAlone asks a worker to commit its batch in a transaction of its
// own (commitAlone): the shared one failed on a poisonous record, of this
// batch or another's.
var errCommitAlone = errors.New("batch to be committed alone")

func newCommitter(p *Processor, transactions int) *committer {
	return &committer{p: p, slots: make(chan struct{}, transactions)}
}

// commit commits b, one partition's batch, in a transaction alone or
// shared with other partitions' batches, and returns its outcome, or
// errCommitAlone. The goroutine that gets a free transaction runs it for
// every batch waiting at that moment, its own or not; the others wait for
// their answer.
func (c *committer) commit(ctx context.Context, b *partitionBatch) (batchOutcome, error) {
	req := &commitReq{ctx: ctx, b: b, done: make(chan commitAnswer, 1)}
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
			if seen[r.b.partition] {
				later = append(later, r)
				continue
			}
			seen[r.b.partition] = true
			round = append(round, r)
		}
		c.runRound(round)
		reqs = later
	}
}

// runRound commits reqs, batches of distinct partitions, in one
// transaction (commitBatches), or alone when that is all there is.
func (c *committer) runRound(reqs []*commitReq) {
	p := c.p
	var shared []*commitReq
	for _, r := range reqs {
		if len(reqs) > 1 && r.b.undecodable != nil {
			r.done <- commitAnswer{err: errCommitAlone} // its poison is isolated alone
			continue
		}
		shared = append(shared, r)
	}
	for len(shared) > 0 {
		if len(shared) == 1 {
			c.runAlone(shared[0])
			return
		}
		bs := make([]*partitionBatch, len(shared))
		for i, r := range shared {
			bs[i] = r.b
		}
		ctx, cancel := context.WithTimeout(context.Background(), commitTimeout)
		outs, refused, err := commitBatches(ctx, p.pool, p.applier, p.cfg.Group, bs)
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
	out, err := c.commitAlone(r.ctx, r.b)
	r.done <- commitAnswer{out, err}
}

// commitAlone commits b in a transaction of its own (commitAlone): for a
// batch alone in its round, and for one that commit answered with
// errCommitAlone.
func (c *committer) commitAlone(ctx context.Context, b *partitionBatch) (batchOutcome, error) {
	p := c.p
	out, err := commitAlone(ctx, p.pool, p.applier, p.cfg.Group, b)
	if err == nil {
		p.metrics.transactionBatches.Observe(1)
	}
	return out, err
}
