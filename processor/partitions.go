package processor

import (
	"context"
	"fmt"

	"github.com/paystream/paystream/internal/store"
	"github.com/paystream/paystream/internal/topics"
)

// The raw topic's partition count is checked while the processor runs, not
// only when it starts (paystream processor checks it then): Kafka maps a
// payment's key to a partition by the count, so once partitions are added
// a payment's new events land on another partition than its old ones, and
// the two would be applied in no particular order. The processor compares
// the count of every end-offset listing (each OffsetCopyInterval, see
// refreshLag) with the one paystream migrate recorded, never claims a
// partition beyond the recorded count, and on a difference stops: Run
// returns an error wrapping topics.ErrPartitionsChanged, and a restart
// refuses to start until the README's procedure was followed.

// Values of Processor.recordedPartitions besides a count.
const (
	partitionsUnknown     = 0  // not read yet (or the read failed): read at the next check
	partitionsNotRecorded = -1 // migrate never recorded a count: nothing to check
)

// loadRecordedPartitions reads the count paystream migrate recorded for
// the raw topic, unless known, and returns it (or partitionsNotRecorded,
// or partitionsUnknown when the read failed).
func (p *Processor) loadRecordedPartitions(ctx context.Context, force bool) int32 {
	if n := p.recordedPartitions.Load(); n != partitionsUnknown && !force {
		return n
	}
	n, ok, err := store.TopicPartitions(ctx, p.pool, p.cfg.Topic)
	switch {
	case err != nil:
		p.log.Warn("read the raw topic's recorded partition count failed; checking it later", "topic", p.cfg.Topic, "error", err)
		return partitionsUnknown
	case !ok:
		n = partitionsNotRecorded
	}
	p.recordedPartitions.Store(n)
	return n
}

// checkPartitions stops the processor when live, the raw topic's partition
// count the broker reports, differs from the recorded one, read again
// first in case an operator recorded the new count meanwhile.
func (p *Processor) checkPartitions(ctx context.Context, live int32) {
	recorded := p.loadRecordedPartitions(ctx, false)
	if live <= 0 || recorded == live || recorded == partitionsNotRecorded || recorded == partitionsUnknown {
		return
	}
	if recorded = p.loadRecordedPartitions(ctx, true); recorded <= 0 || recorded == live {
		return
	}
	p.partitionsChanged(live, recorded)
}

// beyondRecorded reports whether partition is past the recorded count: a
// partition added since, which must not be claimed. It stops the
// processor when so.
func (p *Processor) beyondRecorded(partition int32) bool {
	recorded := p.recordedPartitions.Load()
	if recorded <= 0 || partition < recorded {
		return false
	}
	p.partitionsChanged(partition+1, recorded)
	return true
}

// partitionsChanged stops the processor: Run ends as on cancel, returning
// an error wrapping topics.ErrPartitionsChanged.
func (p *Processor) partitionsChanged(live, recorded int32) {
	err := fmt.Errorf("topic %s: %w while the processor ran: it has %d partitions (at least), %d were recorded; "+
		"adding partitions moves payments to other partitions and breaks their order: follow the README's procedure for changing partition counts, "+
		"then run paystream migrate --accept-partition-change", p.cfg.Topic, topics.ErrPartitionsChanged, live, recorded)
	p.log.Error("raw topic partition count changed: stopping the processor", "topic", p.cfg.Topic, "partitions", live, "recorded", recorded)
	p.stopRun(err)
}
