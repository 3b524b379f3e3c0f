package processor

import (
	"context"
	"errors"
	"maps"
	"slices"
	"time"

	"github.com/paystream/paystream/internal/envelope"
	"github.com/paystream/paystream/internal/payment"
	"github.com/paystream/paystream/internal/store"
	"github.com/paystream/paystream/internal/tracing"
)

// sweepLimit bounds the deferred events one sweep round lists.
const sweepLimit = 500

// sweeper refetches, off the worker's path, the deferred events of one
// partition that wait for their gateway: events recorded as
// deferred:awaiting_refetch (thin or unsigned webhooks) and events whose
// predecessor did not come within DeferredWindow. It runs beside the
// partition's Worker, is started and stopped with it and holds its owner
// epoch: each payment's answer is applied in a transaction that locks the
// partition's offset row and checks the epoch, exactly like a batch, so a
// sweeper whose partition moved to another owner writes nothing.
//
// The worker kicks it when a batch left events awaiting a refetch; a
// refetch that failed is retried after RefetchRetry.
type sweeper struct {
	p         *Processor
	topic     string
	partition int32
	epoch     int64

	kicks chan struct{} // capacity 1: a pending kick is enough
	quit  chan struct{}
	done  chan struct{}
}

func newSweeper(p *Processor, topic string, partition int32, epoch int64) *sweeper {
	return &sweeper{
		p: p, topic: topic, partition: partition, epoch: epoch,
		kicks: make(chan struct{}, 1),
		quit:  make(chan struct{}),
		done:  make(chan struct{}),
	}
}

// startSweeper starts the sweeper of w's partition, or returns nil when no
// source refetches.
func (w *Worker) startSweeper() *sweeper {
	if w.p.refetch == nil {
		return nil
	}
	s := newSweeper(w.p, w.topic, w.partition, w.epoch)
	go s.run()
	return s
}

// kickIfAwaiting kicks s when a committed batch left events waiting for a
// refetch their source can do. s may be nil.
func (s *sweeper) kickIfAwaiting(results []result) {
	if s == nil {
		return
	}
	for _, r := range results {
		if r.reason == reasonAwaitingRefetch && s.p.refetch.can(r.source) {
			s.kick()
			return
		}
	}
}

// kick asks for a sweep round now.
func (s *sweeper) kick() {
	select {
	case s.kicks <- struct{}{}:
	default:
	}
}

// stop cancels the sweeper's refetch or transaction in flight and waits for
// it to end. s may be nil.
func (s *sweeper) stop() {
	if s == nil {
		return
	}
	close(s.quit)
	<-s.done
}

func (s *sweeper) run() {
	defer close(s.done)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() {
		select {
		case <-s.quit:
			cancel()
		case <-ctx.Done():
		}
	}()
	// A new owner looks at once: events may have waited for the old one.
	idle := time.NewTimer(0)
	defer idle.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-s.kicks:
		case <-idle.C:
		}
		full, err := s.sweep(ctx)
		switch {
		case ctx.Err() != nil:
			return
		case errors.Is(err, ErrFenced):
			s.p.metrics.fenced.Inc()
			s.p.log.Warn("refetch sweeper fenced: a newer owner claimed the partition; stopping",
				"partition", s.partition, "epoch", s.epoch, "error", err)
			return
		case err != nil:
			s.p.log.Warn("refetch sweep failed", "partition", s.partition, "error", err)
		}
		if full {
			s.kick() // more due events than one round takes
		}
		// Failed refetches are due again after RefetchRetry; looking twice
		// as often bounds the extra wait to half of it.
		idle.Reset(s.p.cfg.RefetchRetry / 2)
	}
}

// dueEvent is a deferred delivery the sweeper refetches.
type dueEvent struct {
	id  int64
	env envelope.Raw
}

// sweep runs one round: it lists the partition's due deferred events and,
// payment by payment, refetches the payment (outside any transaction) and
// applies the answer. It reports whether the list was full.
func (s *sweeper) sweep(ctx context.Context) (full bool, err error) {
	due, full, err := s.listDue(ctx)
	if err != nil {
		return false, err
	}
	byPayment := map[string][]dueEvent{}
	var order []string
	for _, d := range due {
		if byPayment[d.env.PaymentKey] == nil {
			order = append(order, d.env.PaymentKey)
		}
		byPayment[d.env.PaymentKey] = append(byPayment[d.env.PaymentKey], d)
	}
	for _, key := range order {
		if err := s.settle(ctx, byPayment[key]); err != nil {
			return false, err
		}
	}
	return full, nil
}

// listDue lists, oldest first, the partition's due deferred events (see
// store.ListDue).
func (s *sweeper) listDue(ctx context.Context) ([]dueEvent, bool, error) {
	rows, err := store.ListDue(ctx, s.p.pool, store.DueQuery{
		Topic: s.topic, Partition: s.partition, Sources: slices.Collect(maps.Keys(s.p.refetch.sources)),
		Retry: s.p.cfg.RefetchRetry, Window: s.p.cfg.DeferredWindow, Limit: sweepLimit,
	})
	if err != nil {
		return nil, false, err
	}
	var out []dueEvent
	for i := range rows {
		env, err := rows[i].Envelope()
		if err != nil {
			continue // replay's business, not the sweeper's
		}
		out = append(out, dueEvent{id: rows[i].ID, env: env})
	}
	return out, len(rows) == sweepLimit, nil
}

// settle refetches one payment and applies the answer to its due events. A
// failed refetch postpones them by RefetchRetry. Events another transaction
// decided meanwhile are left as they are.
func (s *sweeper) settle(ctx context.Context, due []dueEvent) error {
	env := due[0].env
	ids := make([]int64, len(due))
	for i, d := range due {
		ids[i] = d.id
	}
	facts, err := s.p.refetch.fetch(ctx, env.Source, env.Event.PaymentID)
	if err != nil {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		return s.postpone(ctx, env.PaymentKey, ids)
	}
	// The same bounds as a batch: a sweeper that freezes (or loses its
	// network) inside the transaction has its session ended by Postgres
	// after IdleInTransactionTimeout, releasing the partition's offset row
	// for the worker and the partition's next owner.
	txCtx, cancel := context.WithTimeout(ctx, commitTimeout)
	defer cancel()
	results, err := s.apply(txCtx, due, facts)
	if errors.Is(err, ErrFenced) || ctx.Err() != nil {
		return err
	}
	if err != nil {
		// The answer does not apply (yet): try again after RefetchRetry
		// rather than on every round.
		s.p.log.Warn("apply refetched payment failed", "partition", s.partition, "source", env.Source, "error", err)
		return s.postpone(ctx, env.PaymentKey, ids)
	}
	for _, r := range results {
		s.p.metrics.events.WithLabelValues(r.source, r.outcome, r.reason).Inc()
	}
	return nil
}

// apply applies the refetched facts to the payment's due events still
// deferred, in one transaction fenced like a batch: it locks the
// partition's offset row with the reads queued behind it (only events
// still deferred are decided; the update of each is guarded by that
// status too), checks the owner epoch, and writes what was decided.
func (s *sweeper) apply(ctx context.Context, due []dueEvent, facts []payment.Fact) ([]result, error) {
	env := due[0].env
	key := env.PaymentKey
	ids := make([]int64, len(due))
	for i, d := range due {
		ids[i] = d.id
	}
	a := s.p.applier
	tx, err := store.BeginBatch(ctx, s.p.pool, a.lock(s.p.cfg.Group, s.topic, s.partition),
		store.Reads{Payments: []string{key}, StillDeferred: store.DeliveryIDs{PaymentKey: key, IDs: ids}})
	if err != nil {
		return nil, err
	}
	defer tx.Rollback(ctx) //nolint:errcheck // after Commit, or on the way out of a failure
	_, owner, err := tx.Offset(s.partition)
	if err := fence(s.topic, s.partition, s.epoch, owner, err); err != nil {
		return nil, err
	}
	payments := map[string]*paymentRow{key: {key: key, source: env.Source, paymentID: env.Event.PaymentID}}
	loadedPayments(tx.Loaded.Payments, payments)
	still := tx.Loaded.StillDeferred
	headers := tracing.StateHeaders(ctx)
	var ds []delivery
	for _, d := range due {
		if still[d.id] {
			ds = append(ds, delivery{env: d.env, inboxID: d.id, status: store.StatusDeferred, refetched: facts, headers: headers})
		}
	}
	if len(ds) == 0 {
		return nil, nil
	}
	// The swept events are decided here, not re-offered as waiting.
	pr := payments[key]
	pr.waiting = slices.DeleteFunc(pr.waiting, func(w waiting) bool { return still[w.inboxID] })
	w, results, err := a.decide(ds, payments)
	if err != nil {
		return nil, err
	}
	if err := tx.Write(ctx, w); err != nil {
		return nil, err
	}
	if err := tx.Commit(ctx); err != nil {
		return nil, err
	}
	return results, nil
}

// postpone makes the events due again after RefetchRetry. It records no
// outcome: they stay deferred.
func (s *sweeper) postpone(ctx context.Context, paymentKey string, ids []int64) error {
	return store.Postpone(ctx, s.p.pool, paymentKey, ids)
}
