package processor

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// offsetCopyTimeout bounds one copy of offsets to Kafka and one read of
// end offsets.
const offsetCopyTimeout = 5 * time.Second

// partitionOffsets is what the processor knows of an assigned partition's
// offsets. It outlives the partition's worker: a stopped or fenced worker's
// last stored offset is still copied to Kafka.
type partitionOffsets struct {
	stored int64 // next offset stored in Postgres; -1 before the first
	copied int64 // last offset copied to Kafka; -1 before the first
	end    int64 // the broker's high watermark as last seen; -1 unknown
}

// stored records the offset a worker's commit stored in Postgres and
// updates the partition's lag.
func (p *Processor) stored(partition int32, next int64) {
	p.mu.Lock()
	defer p.mu.Unlock()
	o := p.offsets[partition]
	if o == nil {
		return
	}
	o.stored = max(o.stored, next)
	p.setLag(partition, o)
}

// setLag sets the lag gauge of an assigned partition: the records between
// the offset stored in Postgres, the one that counts, and the high
// watermark. p.mu must be held.
func (p *Processor) setLag(partition int32, o *partitionOffsets) {
	if o.end < 0 {
		return
	}
	p.metrics.lag.WithLabelValues(partitionLabel(partition)).Set(float64(max(o.end-max(o.stored, 0), 0)))
}

// copyOffsetsLoop copies stored offsets to Kafka and refreshes the lag
// gauge every OffsetCopyInterval, and copies right after an assignment.
func (p *Processor) copyOffsetsLoop(ctx context.Context, cl *kgo.Client) {
	adm := kadm.NewClient(cl)
	t := time.NewTicker(p.cfg.OffsetCopyInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			p.refreshLag(ctx, adm)
		case <-p.copyNow:
		}
		cctx, cancel := context.WithTimeout(ctx, offsetCopyTimeout)
		p.copyOffsets(cctx, cl, nil)
		cancel()
	}
}

// refreshLag reads the topic's end offsets from the broker, so the lag
// gauge keeps moving while nothing commits (the database is down) and
// nothing is fetched (the partition is paused), and checks the topic's
// partition count against the recorded one (checkPartitions).
func (p *Processor) refreshLag(ctx context.Context, adm *kadm.Client) {
	ctx, cancel := context.WithTimeout(ctx, offsetCopyTimeout)
	defer cancel()
	ends, err := adm.ListEndOffsets(ctx, p.cfg.Topic)
	if err != nil {
		if ctx.Err() == nil {
			p.log.Warn("list end offsets for lag failed", "topic", p.cfg.Topic, "error", err)
		}
		return
	}
	var live int32
	for partition := range ends[p.cfg.Topic] {
		if partition >= 0 {
			live++
		}
	}
	p.mu.Lock()
	ends.Each(func(lo kadm.ListedOffset) {
		if o := p.offsets[lo.Partition]; o != nil && lo.Err == nil {
			o.end = max(o.end, lo.Offset)
			p.setLag(lo.Partition, o)
		}
	})
	p.mu.Unlock()
	p.checkPartitions(ctx, live)
}

// copyOffsets copies the stored offsets of partitions (nil: every assigned
// partition) that changed since their last copy to the group's Kafka
// offsets, and waits for the broker's answer. A partition whose copy failed
// (the request, or its own error code in the response) is retried at the
// next copy.
func (p *Processor) copyOffsets(ctx context.Context, cl *kgo.Client, partitions []int32) {
	p.copyMu.Lock()
	defer p.copyMu.Unlock()
	todo := map[int32]kgo.EpochOffset{}
	p.mu.Lock()
	for partition, o := range p.offsets {
		if partitions != nil && !slices.Contains(partitions, partition) {
			continue
		}
		if o.stored >= 0 && o.stored != o.copied {
			todo[partition] = kgo.EpochOffset{Epoch: -1, Offset: o.stored}
		}
	}
	p.mu.Unlock()
	if len(todo) == 0 {
		return
	}
	var failed int
	var firstErr error
	fail := func(n int, err error) {
		failed += n
		if firstErr == nil {
			firstErr = err
		}
	}
	cl.CommitOffsetsSync(ctx, map[string]map[int32]kgo.EpochOffset{p.cfg.Topic: todo},
		func(_ *kgo.Client, _ *kmsg.OffsetCommitRequest, resp *kmsg.OffsetCommitResponse, err error) {
			if err != nil {
				fail(len(todo), err)
				return
			}
			answered := 0
			p.mu.Lock()
			defer p.mu.Unlock()
			for _, t := range resp.Topics {
				for _, rp := range t.Partitions {
					eo, asked := todo[rp.Partition]
					if t.Topic != p.cfg.Topic || !asked {
						continue
					}
					answered++
					if err := kerr.ErrorForCode(rp.ErrorCode); err != nil {
						fail(1, fmt.Errorf("partition %d: %w", rp.Partition, err))
						continue
					}
					if o := p.offsets[rp.Partition]; o != nil {
						o.copied = eo.Offset
					}
				}
			}
			if answered < len(todo) {
				fail(len(todo)-answered, errors.New("partitions missing from the response"))
			}
		})
	if failed > 0 {
		p.metrics.offsetCopyFailures.Add(float64(failed))
		p.log.Warn("copy offsets to kafka failed; lag tools see stale offsets until the next copy",
			"partitions", failed, "error", firstErr)
	}
}
