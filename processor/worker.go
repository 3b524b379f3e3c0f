package processor

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
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

	in       chan []*kgo.Record
	quit     chan struct{}
	quitOnce sync.Once
	done     chan struct{}
	next     atomic.Int64 // stored offset after the last commit
	// highWatermark is the partition's end offset as of the last fetch.
	highWatermark atomic.Int64
}

func newWorker(p *Processor, topic string, partition int32, epoch int64) *Worker {
	return &Worker{
		p:         p,
		topic:     topic,
		partition: partition,
		epoch:     epoch,
		in:        make(chan []*kgo.Record, p.cfg.MaxBufferedBatches),
		quit:      make(chan struct{}),
		done:      make(chan struct{}),
	}
}

// enqueue hands fetched records to the worker, waiting while its buffer is
// full: this is the backpressure that keeps memory bounded.
func (w *Worker) enqueue(ctx context.Context, recs []*kgo.Record) {
	select {
	case w.in <- recs:
	case <-w.done:
	case <-ctx.Done():
	}
}

// stop asks the worker to finish (its in-flight transaction commits or is
// abandoned) and waits for it.
func (w *Worker) stop() {
	w.quitOnce.Do(func() { close(w.quit) })
	<-w.done
}

func (w *Worker) run() {
	defer close(w.done)
	maxRecords := w.p.cfg.BatchMaxRecords
	var pending []*kgo.Record
	for {
		select {
		case <-w.quit:
			return
		case recs := <-w.in:
			pending = append(pending, recs...)
		}
		timer := time.NewTimer(w.p.cfg.BatchMaxWait)
	fill:
		for len(pending) < maxRecords {
			select {
			case recs := <-w.in:
				pending = append(pending, recs...)
			case <-timer.C:
				break fill
			case <-w.quit:
				timer.Stop()
				return
			}
		}
		timer.Stop()
		for len(pending) > 0 {
			n := min(len(pending), maxRecords)
			if !w.commit(pending[:n]) {
				return
			}
			pending = pending[n:]
		}
		pending = pending[:0]
	}
}

// commit applies one batch, retrying transient failures with backoff until
// it commits (true) or the worker is fenced or told to stop (false).
func (w *Worker) commit(batch []*kgo.Record) bool {
	m := w.p.metrics
	// Refetches happen before, never inside, the transaction.
	rctx, cancel := context.WithCancel(context.Background())
	go func() {
		select {
		case <-w.quit:
			cancel()
		case <-rctx.Done():
		}
	}()
	refetched := w.p.refetchBatch(rctx, batch)
	cancel()
	backoff := 50 * time.Millisecond
	for attempt := 0; ; attempt++ {
		start := time.Now()
		ctx, cancel := context.WithTimeout(context.Background(), commitTimeout)
		out, err := commitRefetched(ctx, w.p.pool, w.p.applier, w.p.cfg.Group, w.epoch, batch, refetched)
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
			if out.applied > 0 {
				w.next.Store(out.next)
			}
			// Lag from the offset stored in Postgres, the one that counts.
			m.lag.WithLabelValues(partitionLabel(w.partition)).Set(float64(max(w.highWatermark.Load()-out.next, 0)))
			return true
		}
		if errors.Is(err, ErrFenced) {
			m.fenced.Inc()
			w.p.log.Warn("partition fenced: a newer owner claimed it; stopping worker",
				"partition", w.partition, "epoch", w.epoch, "error", err)
			return false
		}
		m.batchRetries.Inc()
		w.p.log.Warn("batch failed, retrying", "partition", w.partition, "attempt", attempt+1,
			"records", len(batch), "error", err)
		select {
		case <-w.quit:
			return false
		case <-time.After(backoff):
		}
		backoff = min(backoff*2, w.p.cfg.RetryBackoffMax)
	}
}
