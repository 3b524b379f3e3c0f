package processor

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/paystream/paystream/internal/topics"
)

// maxPollWait bounds one poll, so the poll loop lets the group rebalance
// at least this often (BlockRebalanceOnPoll) however idle or paused the
// partitions are.
const maxPollWait = 500 * time.Millisecond

// Run joins the group and processes until ctx is canceled, then finishes
// in-flight batches, leaves the group and returns nil. It returns an error
// if it cannot run at all, or, after the same orderly stop, when a
// partition's stored offset went back (ErrOffsetRolledBack): restarting it
// then resumes every partition from Postgres.
func (p *Processor) Run(ctx context.Context) error {
	ctx, stop := context.WithCancelCause(ctx)
	defer stop(nil)
	p.stopRun = stop
	p.loadRecordedPartitions(ctx, true)
	opts := append([]kgo.Opt{
		kgo.SeedBrokers(p.cfg.Brokers...),
		kgo.ConsumerGroup(p.cfg.Group),
		kgo.ConsumeTopics(p.cfg.Topic),
		kgo.Balancers(kgo.CooperativeStickyBalancer()),
		kgo.SessionTimeout(p.cfg.SessionTimeout),
		kgo.DisableAutoCommit(),
		kgo.BlockRebalanceOnPoll(),
		// Offsets come from Postgres; a stored offset Kafka no longer has
		// must fail loudly, never silently skip or replay.
		kgo.ConsumeResetOffset(kgo.NoResetOffset()),
		kgo.AdjustFetchOffsetsFn(p.assign),
		kgo.OnPartitionsRevoked(p.revoked),
		kgo.OnPartitionsLost(p.lost),
		// Bounded buffering: one fetch in flight, a few MiB each, so memory
		// does not grow with the backlog (see MaxBufferedBatches).
		kgo.FetchMaxBytes(4 << 20),
		kgo.FetchMaxPartitionBytes(1 << 20),
		kgo.MaxConcurrentFetches(1),
		// Fewer, fuller fetches: the broker answers once 64 KiB are ready
		// or half the batch wait has passed, instead of at once with the
		// few records that arrived since the last answer. Under load that
		// is a fetch per ~40 records instead of one per few (bench-e2e:
		// processor CPU per delivery ≈ 85 → ≈ 70 µs); when quiet it adds
		// at most half of --batch-max-wait (but 10 ms, franz-go's least)
		// to a record's latency, and an idle processor fetches that often
		// instead of every 5 s. (Counting the batch wait from the
		// record's Kafka timestamp instead, so the two waits overlap, was
		// measured and not kept: batches halved, Postgres's CPU per
		// delivery rose by a quarter, p99 did not improve.)
		kgo.FetchMinBytes(64 << 10),
		kgo.FetchMaxWait(max(p.cfg.BatchMaxWait/2, 10*time.Millisecond)),
	}, p.cfg.KafkaOpts...)
	if p.cfg.InstanceID != "" {
		opts = append(opts, kgo.InstanceID(p.cfg.InstanceID))
	}
	cl, err := kgo.NewClient(opts...)
	if err != nil {
		return fmt.Errorf("kafka client: %w", err)
	}
	p.kcl.Store(cl)
	p.log.Info("processor started", "topic", p.cfg.Topic, "group", p.cfg.Group)

	copyCtx, stopCopy := context.WithCancel(context.Background())
	copyDone := make(chan struct{})
	go func() {
		defer close(copyDone)
		p.copyOffsetsLoop(copyCtx, cl)
	}()
	go p.metrics.observeLoop(copyCtx, p.pool, p.cfg.DeferredWindow)
	retentionDone := make(chan struct{})
	go func() {
		defer close(retentionDone)
		p.retentionLoop(copyCtx)
	}()

	for {
		if p.waitForRoom(ctx) {
			cl.AllowRebalance()
			continue
		}
		// A bounded wait, so that AllowRebalance runs at least every
		// maxPollWait even when every partition is paused or idle.
		pollCtx, cancelPoll := context.WithTimeout(ctx, maxPollWait)
		fetches := cl.PollRecords(pollCtx, p.cfg.BatchMaxRecords*p.cfg.MaxBufferedBatches)
		cancelPoll()
		if fetches.IsClientClosed() || ctx.Err() != nil {
			break
		}
		fetches.EachError(func(topic string, partition int32, err error) {
			if errors.Is(err, context.DeadlineExceeded) {
				return // the bounded wait ended
			}
			p.log.Error("fetch failed", "topic", topic, "partition", partition, "error", err)
			p.metrics.fetchErrors.Inc()
		})
		fetches.EachPartition(func(ftp kgo.FetchTopicPartition) {
			if len(ftp.Records) == 0 {
				return
			}
			p.mu.Lock()
			w := p.workers[ftp.Partition]
			if o := p.offsets[ftp.Partition]; o != nil {
				o.end = max(o.end, ftp.HighWatermark)
			}
			p.mu.Unlock()
			if w == nil {
				return // not ours any more; the new owner resumes from Postgres
			}
			w.enqueue(ftp.Records) // never waits; see waitForRoom
		})
		cl.AllowRebalance()
	}

	stopCopy()
	<-copyDone
	<-retentionDone
	p.stopWorkers(p.allPartitions())
	// The last copy happens before leaving the group, while the group still
	// accepts our commits.
	copyCtx, cancelCopy := context.WithTimeout(context.Background(), offsetCopyTimeout)
	p.copyOffsets(copyCtx, cl, nil)
	cancelCopy()
	// Leaving the group revokes our partitions, which BlockRebalanceOnPoll
	// holds back until the poll loop allows it.
	cl.AllowRebalance()
	cl.Close()
	if err := context.Cause(ctx); errors.Is(err, ErrOffsetRolledBack) {
		p.log.Error("processor stopped: restart it to resume from Postgres's offsets", "error", err)
		return err
	} else if errors.Is(err, topics.ErrPartitionsChanged) {
		return err
	}
	p.log.Info("processor stopped")
	return nil
}

func (p *Processor) stopWorkers(partitions []int32) {
	var wg sync.WaitGroup
	for _, partition := range partitions {
		p.mu.Lock()
		w := p.workers[partition]
		delete(p.workers, partition)
		p.mu.Unlock()
		if w == nil {
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			w.stop()
			p.log.Info("partition released", "partition", partition)
		}()
	}
	wg.Wait()
}

func (p *Processor) allPartitions() []int32 {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := make([]int32, 0, len(p.workers))
	for partition := range p.workers {
		out = append(out, partition)
	}
	return out
}
