package processor

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/paystream/paystream/internal/envelope"
	"github.com/paystream/paystream/internal/payment"
)

// refetchBatch asks the gateways, before the batch's transaction, for the
// current facts of every payment in recs whose events need a refetch (one
// request per payment). It returns them by record offset; a payment whose
// refetch failed is absent, and its events wait as deferred:awaiting_refetch
// for the sweeper.
func (p *Processor) refetchBatch(ctx context.Context, recs []*kgo.Record) map[int64][]payment.Fact {
	if p.refetch == nil {
		return nil
	}
	var out map[int64][]payment.Fact
	done := map[string][]payment.Fact{}
	for _, rec := range recs {
		env, err := envelope.DecodeRaw(rec.Value)
		if err != nil || !env.Event.NeedsRefetch || !p.refetch.can(env.Source) {
			continue
		}
		facts, seen := done[env.PaymentKey]
		if !seen {
			facts, err = p.refetch.fetch(ctx, env.Source, env.Event.PaymentID)
			if err != nil {
				facts = nil
			}
			done[env.PaymentKey] = facts
		}
		if facts != nil {
			if out == nil {
				out = map[int64][]payment.Fact{}
			}
			out[rec.Offset] = facts
		}
	}
	return out
}

// sweepLoop retries the refetches that failed (events deferred as
// awaiting_refetch) and refetches the payments whose deferred events are
// overdue (their predecessor never came within DeferredWindow), for the
// sources that can refetch. It runs until ctx ends.
func (p *Processor) sweepLoop(ctx context.Context) {
	if p.refetch == nil {
		return
	}
	t := time.NewTicker(p.cfg.RefetchRetry / 2)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if n, err := p.sweep(ctx); err != nil && ctx.Err() == nil {
			p.log.Warn("refetch sweep failed", "error", err)
		} else if n > 0 {
			p.log.Info("refetch sweep", "payments", n)
		}
	}
}

// sweep handles one round of due deferred events and returns how many
// payments it refetched.
func (p *Processor) sweep(ctx context.Context) (int, error) {
	sources := slices.Collect(maps.Keys(p.refetch.sources))
	rows, err := p.pool.Query(ctx, `
		SELECT id, payment_key, source, payload FROM inbox
		 WHERE status = 'deferred' AND source = ANY($1) AND payload IS NOT NULL
		   AND ((reason = $2 AND processed_at < now() - $3::interval)
		     OR (reason NOT IN ($2, $4) AND received_at < now() - $5::interval))
		 ORDER BY id LIMIT 500`,
		sources, reasonAwaitingRefetch, p.cfg.RefetchRetry, reasonPaymentHeld, p.cfg.DeferredWindow)
	if err != nil {
		return 0, fmt.Errorf("list due deferred events: %w", err)
	}
	type due struct {
		ID      int64
		Key     string
		Source  string
		Payload []byte
	}
	list, err := pgx.CollectRows(rows, pgx.RowToStructByPos[due])
	if err != nil {
		return 0, fmt.Errorf("list due deferred events: %w", err)
	}
	byPayment := map[string][]delivery{}
	var order []string
	for _, d := range list {
		env, err := envelope.DecodeRaw(d.Payload)
		if err != nil {
			continue // replay's business, not the sweeper's
		}
		if byPayment[d.Key] == nil {
			order = append(order, d.Key)
		}
		byPayment[d.Key] = append(byPayment[d.Key], delivery{env: env, inboxID: d.ID})
	}
	swept := 0
	for _, key := range order {
		ds := byPayment[key]
		facts, err := p.refetch.fetch(ctx, ds[0].env.Source, ds[0].env.Event.PaymentID)
		if err != nil {
			ids := make([]int64, len(ds))
			for i, d := range ds {
				ids[i] = d.inboxID
			}
			// Try again after RefetchRetry.
			if _, err := p.pool.Exec(ctx, `UPDATE inbox SET processed_at = now(), attempts = attempts + 1 WHERE id = ANY($1)`, ids); err != nil {
				return swept, fmt.Errorf("postpone refetch: %w", err)
			}
			continue
		}
		for i := range ds {
			ds[i].refetched = facts
		}
		err = pgx.BeginFunc(ctx, p.pool, func(tx pgx.Tx) error {
			env := ds[0].env
			payments := map[string]*paymentRow{key: {key: key, source: env.Source, paymentID: env.Event.PaymentID}}
			b := &pgx.Batch{}
			queueLoadPayments(b, []string{key}, payments)
			if err := tx.SendBatch(ctx, b).Close(); err != nil {
				return fmt.Errorf("load payment: %w", err)
			}
			// The swept events are decided here, not re-offered.
			pr := payments[key]
			pr.waiting = slices.DeleteFunc(pr.waiting, func(w waiting) bool {
				return slices.ContainsFunc(ds, func(d delivery) bool { return d.inboxID == w.inboxID })
			})
			results, err := p.applier.decide(ctx, tx, ds, payments)
			if err != nil {
				return err
			}
			for _, r := range results {
				p.metrics.events.WithLabelValues(r.source, r.outcome, r.reason).Inc()
			}
			return nil
		})
		if err != nil {
			return swept, fmt.Errorf("apply refetched payment: %w", err)
		}
		swept++
	}
	return swept, nil
}
