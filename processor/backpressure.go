package processor

import (
	"context"
	"maps"
	"slices"
	"time"
)

// stuckAfter is how long the poll loop waits for a worker whose queue is
// full before it pauses that worker's partition instead; see Worker.
const stuckAfter = 2 * time.Second

// waitForRoom is the poll loop's backpressure: while a worker's queue is
// full (and not yet stuck, see Worker.full) it waits, for at most
// maxPollWait, for room, and reports true; otherwise it reports false at
// once and the loop polls.
func (p *Processor) waitForRoom(ctx context.Context) bool {
	p.mu.Lock()
	workers := slices.Collect(maps.Values(p.workers))
	p.mu.Unlock()
	full := false
	for _, w := range workers {
		full = w.full(stuckAfter) || full
	}
	if !full {
		return false
	}
	t := time.NewTimer(maxPollWait)
	defer t.Stop()
	select {
	case <-p.room:
	case <-t.C:
	case <-ctx.Done():
	}
	return true
}

// roomMade wakes the poll loop waiting in waitForRoom.
func (p *Processor) roomMade() {
	select {
	case p.room <- struct{}{}:
	default:
	}
}

// pauseFetch stops fetching partition; see Worker.
func (p *Processor) pauseFetch(partition int32) {
	if cl := p.kcl.Load(); cl != nil {
		cl.PauseFetchPartitions(map[string][]int32{p.cfg.Topic: {partition}})
	}
}

// resumeFetch undoes pauseFetch.
func (p *Processor) resumeFetch(partition int32) {
	if cl := p.kcl.Load(); cl != nil {
		cl.ResumeFetchPartitions(map[string][]int32{p.cfg.Topic: {partition}})
	}
}
