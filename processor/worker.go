package processor

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/paystream/paystream/internal/retry"
	"github.com/paystream/paystream/internal/tracing"
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
	// committed is the partition's next offset as this worker last stored
	// it (or found it when claiming the partition); only its goroutine
	// uses it. Postgres holding less means it lost a commit.
	committed int64

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
	mu    sync.Mutex
	queue []*kgo.Record
	// arrivals stamps the queue's records with when they were enqueued,
	// one entry per enqueue call, oldest first: a batch's wait is counted
	// from its oldest record's arrival, not from when the worker got to it.
	arrivals  []arrival
	fullSince time.Time // when the queue reached highWater; zero below it
	paused    bool
	highWater int
	wake      chan struct{} // signaled (capacity 1) when records arrive
	// sweeper refetches the partition's events awaiting their gateway, off
	// the worker's path; nil when no source refetches.
	sweeper *sweeper
}

func newWorker(p *Processor, topic string, partition int32, epoch, next int64) *Worker {
	return &Worker{
		p:         p,
		topic:     topic,
		partition: partition,
		epoch:     epoch,
		committed: next,
		quit:      make(chan struct{}),
		done:      make(chan struct{}),
		highWater: p.cfg.BatchMaxRecords * p.cfg.MaxBufferedBatches,
		wake:      make(chan struct{}, 1),
	}
}

// arrival is when n consecutive records of a worker's queue were enqueued.
type arrival struct {
	n  int
	at time.Time
}

// enqueue hands fetched records to the worker without ever waiting.
func (w *Worker) enqueue(recs []*kgo.Record) {
	if len(recs) == 0 {
		return
	}
	w.mu.Lock()
	w.queue = append(w.queue, recs...)
	w.arrivals = append(w.arrivals, arrival{n: len(recs), at: time.Now()})
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
	for left := n; left > 0; {
		if w.arrivals[0].n > left {
			w.arrivals[0].n -= left
			break
		}
		left -= w.arrivals[0].n
		w.arrivals = w.arrivals[1:]
	}
	if len(w.queue) == 0 {
		w.queue, w.arrivals = nil, nil // let the taken records' array go with them
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

// head returns how many records are queued and when the oldest of them
// arrived (zero when none is).
func (w *Worker) head() (n int, oldest time.Time) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if len(w.arrivals) > 0 {
		oldest = w.arrivals[0].at
	}
	return len(w.queue), oldest
}

// stop asks the worker to finish and waits for it: batches already full
// (or already past BatchMaxWait) are still committed, a fenced commit is
// abandoned, and the rest of the queue is dropped.
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
		if !w.fill(maxRecords) {
			return
		}
		if !w.commit(w.take(maxRecords)) {
			return
		}
	}
}

// fill waits until a batch is worth starting, and reports false when the
// worker is told to stop meanwhile. A batch starts once maxRecords are
// queued, or once the oldest queued record has waited BatchMaxWait since
// it arrived. Records that arrived while the previous batch was being
// committed have been waiting all that time: when the database is the
// bottleneck, each transaction takes everything queued during the one
// before, at once, and batches grow with the load instead of adding a
// wait on top of a slow commit.
func (w *Worker) fill(maxRecords int) bool {
	var timer *time.Timer
	defer func() {
		if timer != nil {
			timer.Stop()
		}
	}()
	for {
		n, oldest := w.head()
		var wait <-chan time.Time
		if n > 0 {
			left := w.p.cfg.BatchMaxWait - time.Since(oldest)
			if n >= maxRecords || left <= 0 {
				return true
			}
			if timer == nil {
				timer = time.NewTimer(left)
			} else {
				timer.Reset(left)
			}
			wait = timer.C
		}
		select {
		case <-w.quit:
			return false
		case <-w.wake:
		case <-wait:
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
	backoff := retry.Policy{Initial: 50 * time.Millisecond, Max: w.p.cfg.RetryBackoffMax}.Backoff()
	for attempt := 0; ; attempt++ {
		start := time.Now()
		ctx, cancel := context.WithTimeout(context.Background(), commitTimeout)
		ctx, span := w.p.startBatchSpan(ctx, batch)
		b := newPartitionBatch(w.partition, w.epoch, w.committed, batch, tracing.StateHeaders(ctx))
		out, err := w.p.commits.commit(ctx, b)
		if errors.Is(err, errCommitAlone) {
			out, err = w.p.commits.commitAlone(ctx, b)
		}
		endBatchSpan(span, out, err)
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
			w.committed = out.next
			w.p.stored(w.partition, out.next)
			return true
		}
		if errors.Is(err, ErrOffsetRolledBack) {
			w.p.log.Error("Postgres's stored offset went back: it lost committed transactions (a failover to a replica that lagged, a restore from a backup); stopping, so that a restart resumes every partition from Postgres's offsets and applies the lost records again",
				"partition", w.partition, "error", err)
			w.p.fenced(w)
			w.p.stopRun(err)
			return false
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
		case <-time.After(backoff.Next()):
		}
	}
}
