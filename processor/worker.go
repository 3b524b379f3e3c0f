package processor

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
)

// commitTimeout bounds one batch transaction, so a hung connection turns
// into a retry instead of a stuck partition.
const commitTimeout = 30 * time.Second

// Worker applies one partition's records, in order, in batches, each batch
// in one transaction fenced by the partition's owner epoch.
type Worker struct {
	p         *Processor
	topic     string
	partition int32
	epoch     int64

	quit     chan struct{}
	quitOnce sync.Once
	done     chan struct{}

	// The records fetched and not yet taken into a batch, in offset order.
	// enqueue never waits. While a worker's queue is full (highWater
	// records) the poll loop stops polling, for at most stuckAfter: then
	// the worker counts as stuck (its database is slow or down) and its
	// partition's fetching is paused instead, so the other partitions flow
	// and the poll loop keeps polling. The worker resumes fetching once it
	// has taken its queue down to half of highWater. Records the client had
	// already fetched for a paused partition stay behind in the client and
	// are fetched again after the resume, so the worker still sees every
	// offset in order. The queue holds at most highWater plus one poll.
	mu        sync.Mutex
	queue     []*kgo.Record
	fullSince time.Time // when the queue reached highWater; zero below it
	paused    bool
	highWater int
	wake      chan struct{} // signaled (capacity 1) when records arrive
	// sweeper refetches the partition's events awaiting their gateway, off
	// the worker's path; nil when no source refetches.
	sweeper *sweeper
}

func newWorker(p *Processor, topic string, partition int32, epoch int64) *Worker {
	return &Worker{
		p:         p,
		topic:     topic,
		partition: partition,
		epoch:     epoch,
		quit:      make(chan struct{}),
		done:      make(chan struct{}),
		highWater: p.cfg.BatchMaxRecords * p.cfg.MaxBufferedBatches,
		wake:      make(chan struct{}, 1),
	}
}

// enqueue hands fetched records to the worker without ever waiting.
func (w *Worker) enqueue(recs []*kgo.Record) {
	w.mu.Lock()
	w.queue = append(w.queue, recs...)
	if len(w.queue) >= w.highWater && w.fullSince.IsZero() {
		w.fullSince = time.Now()
	}
	w.mu.Unlock()
	select {
	case w.wake <- struct{}{}:
	default:
	}
}

// full reports whether the poll loop should wait for this worker: its
// queue is full, and has been for less than stuckAfter. A worker full for
// longer is stuck: fetching its partition is paused instead, and full
// reports false.
func (w *Worker) full(stuckAfter time.Duration) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.paused || w.fullSince.IsZero() {
		return false
	}
	if time.Since(w.fullSince) < stuckAfter {
		return true
	}
	w.paused = true
	w.p.pauseFetch(w.partition)
	w.p.log.Info("worker stuck: fetching of its partition paused until it catches up",
		"partition", w.partition, "queued", len(w.queue))
	return false
}

// take removes up to n records from the head of the queue, tells the poll
// loop when the queue is no longer full, and resumes fetching a paused
// partition once the queue is down to half of highWater.
func (w *Worker) take(n int) []*kgo.Record {
	w.mu.Lock()
	defer w.mu.Unlock()
	n = min(n, len(w.queue))
	out := w.queue[:n:n]
	w.queue = w.queue[n:]
	if len(w.queue) == 0 {
		w.queue = nil // let the taken records' array go with them
	}
	if !w.fullSince.IsZero() && len(w.queue) < w.highWater {
		w.fullSince = time.Time{}
		w.p.roomMade()
	}
	if w.paused && len(w.queue) <= w.highWater/2 {
		w.paused = false
		w.p.resumeFetch(w.partition)
		w.p.log.Info("worker caught up: fetching of its partition resumed", "partition", w.partition)
	}
	return out
}

func (w *Worker) queued() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return len(w.queue)
}

// stop asks the worker to finish (its in-flight transaction commits or is
// abandoned) and waits for it.
func (w *Worker) stop() {
	w.quitOnce.Do(func() { close(w.quit) })
	<-w.done
}

func (w *Worker) run() {
	defer close(w.done)
	w.sweeper = w.startSweeper()
	defer w.sweeper.stop()
	maxRecords := w.p.cfg.BatchMaxRecords
	for {
		// Wait for a first record, then up to BatchMaxWait for a full batch.
		for w.queued() == 0 {
			select {
			case <-w.quit:
				return
			case <-w.wake:
			}
		}
		if w.queued() < maxRecords {
			timer := time.NewTimer(w.p.cfg.BatchMaxWait)
		fill:
			for w.queued() < maxRecords {
				select {
				case <-w.wake:
				case <-timer.C:
					break fill
				case <-w.quit:
					timer.Stop()
					return
				}
			}
			timer.Stop()
		}
		if !w.commit(w.take(maxRecords)) {
			return
		}
	}
}

// commit applies one batch, retrying transient failures with backoff until
// it commits (true) or the worker is fenced or told to stop (false).
func (w *Worker) commit(batch []*kgo.Record) bool {
	m := w.p.metrics
	// Events that need a refetch are recorded as awaiting_refetch; the
	// partition's sweeper refetches them, so a slow gateway never holds
	// the worker.
	backoff := 50 * time.Millisecond
	for attempt := 0; ; attempt++ {
		start := time.Now()
		ctx, cancel := context.WithTimeout(context.Background(), commitTimeout)
		out, err := commitBatch(ctx, w.p.pool, w.p.applier, w.p.cfg.Group, w.epoch, batch)
		cancel()
		if err == nil {
			m.txSeconds.Observe(time.Since(start).Seconds())
			m.batchRecords.Observe(float64(len(batch)))
			if out.slow {
				m.slowBatches.Inc()
			}
			for _, r := range out.results {
				m.events.WithLabelValues(r.source, r.outcome, r.reason).Inc()
			}
			w.sweeper.kickIfAwaiting(out.results)
			w.p.stored(w.partition, out.next)
			return true
		}
		if errors.Is(err, ErrFenced) {
			m.fenced.Inc()
			w.p.log.Warn("partition fenced: a newer owner claimed it; stopping its worker and fetching",
				"partition", w.partition, "epoch", w.epoch, "error", err)
			w.p.fenced(w)
			return false
		}
		w.p.batchFailed(w.partition, attempt+1, len(batch), err)
		select {
		case <-w.quit:
			return false
		case <-time.After(backoff):
		}
		backoff = min(backoff*2, w.p.cfg.RetryBackoffMax)
	}
}
