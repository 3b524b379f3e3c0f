package processor

import (
	"context"
	"errors"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/paystream/paystream/internal/retry"
	"github.com/paystream/paystream/internal/store"
)

// assign is called after the group assigned partitions and before fetching
// starts: it claims each partition in Postgres (bumping its epoch), starts a
// worker for it and points fetching at the stored offset.
func (p *Processor) assign(ctx context.Context, offsets map[string]map[int32]kgo.Offset) (map[string]map[int32]kgo.Offset, error) {
	for topic, parts := range offsets {
		if topic != p.cfg.Topic {
			continue
		}
		for partition := range parts {
			if p.beyondRecorded(partition) {
				continue // the processor stops; a partition added since is never claimed
			}
			c, err := p.claimPartition(ctx, topic, partition)
			if err != nil {
				return nil, err
			}
			epoch, next, fresh := c.epoch, c.next, c.fresh
			if fresh {
				parts[partition] = kgo.NewOffset().AtStart()
			} else {
				parts[partition] = kgo.NewOffset().At(next).WithEpoch(-1)
			}
			w := newWorker(p, topic, partition, epoch, next)
			p.mu.Lock()
			if old := p.workers[partition]; old != nil {
				p.mu.Unlock()
				old.stop()
				p.mu.Lock()
			}
			p.workers[partition] = w
			// Seeded from the claim: after a restart with nothing new to
			// consume, the stored offset is still copied to Kafka.
			stored := next
			if fresh {
				stored = -1
			}
			p.offsets[partition] = &partitionOffsets{stored: stored, copied: -1, end: -1}
			p.mu.Unlock()
			go w.run()
			p.metrics.partitionEvents.WithLabelValues("assigned").Inc()
			p.log.Info("partition assigned", "partition", partition, "epoch", epoch, "resume_offset", next, "fresh", fresh)
		}
	}
	select {
	case p.copyNow <- struct{}{}:
	default:
	}
	return offsets, nil
}

// revoked stops the workers of partitions the group is taking away: each
// goes on committing the full batches it has queued (its queue is bounded,
// so this is bounded too), abandons a commit that is fenced, and drops a
// last partial batch; the next owner resumes from the stored offset. Their stored offsets are copied to Kafka one last time
// before the partitions are given up.
func (p *Processor) revoked(ctx context.Context, cl *kgo.Client, revoked map[string][]int32) {
	partitions := revoked[p.cfg.Topic]
	p.stopWorkers(partitions)
	ctx, cancel := context.WithTimeout(ctx, offsetCopyTimeout)
	p.copyOffsets(ctx, cl, partitions)
	cancel()
	p.release(cl, partitions, "revoked")
}

// lost stops the workers of partitions the group gave to others without a
// revoke (this member was evicted): no offset is copied, the group no
// longer takes our commits.
func (p *Processor) lost(_ context.Context, cl *kgo.Client, lost map[string][]int32) {
	partitions := lost[p.cfg.Topic]
	p.stopWorkers(partitions)
	p.copyMu.Lock() // no periodic copy of these partitions is in flight after this
	p.release(cl, partitions, "lost")
	p.copyMu.Unlock()
}

// release forgets partitions whose workers are stopped and resumes their
// fetching, in case a full or fenced worker paused it: pausing outlives an
// assignment, and the partition may come back.
func (p *Processor) release(cl *kgo.Client, partitions []int32, event string) {
	p.mu.Lock()
	for _, partition := range partitions {
		delete(p.offsets, partition)
		p.metrics.lag.DeleteLabelValues(partitionLabel(partition))
	}
	p.mu.Unlock()
	if len(partitions) > 0 {
		cl.ResumeFetchPartitions(map[string][]int32{p.cfg.Topic: partitions})
		p.metrics.partitionEvents.WithLabelValues(event).Add(float64(len(partitions)))
	}
}

// fenced takes a fenced worker out of the worker set at once: a newer owner
// claimed its partition in Postgres, so fetching it stops (records already
// fetched are dropped; a later assignment resumes from the stored offset)
// and its offsets are no longer copied. Kafka revokes the partition later.
func (p *Processor) fenced(w *Worker) {
	p.mu.Lock()
	if p.workers[w.partition] != w {
		p.mu.Unlock()
		return
	}
	delete(p.workers, w.partition)
	delete(p.offsets, w.partition)
	p.metrics.lag.DeleteLabelValues(partitionLabel(w.partition))
	p.mu.Unlock()
	p.pauseFetch(w.partition)
}

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
