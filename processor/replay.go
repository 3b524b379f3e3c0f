package processor

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/paystream/paystream/internal/envelope"
	"github.com/paystream/paystream/internal/payment"
)

// ErrNotHeld is returned by Replay for a payment that has nothing to replay.
var ErrNotHeld = errors.New("payment is not held and has no quarantined events")

// ErrOutcomeChanged is returned when an inbox row's outcome was about to be
// rewritten but the row no longer has the status it was read with: another
// writer (a partition's worker or sweeper, another replay) decided it
// meanwhile. The transaction is rolled back; nothing was written.
var ErrOutcomeChanged = errors.New("inbox event changed concurrently")

// ReplayReport says what a replay did.
type ReplayReport struct {
	PaymentKey string
	// Replayed counts the events re-driven, by outcome.
	Replayed map[string]int
	// Skipped are the inbox ids marked ignored on the operator's word.
	Skipped []int64
}

// ReplayOptions tune Replay.
type ReplayOptions struct {
	// Skip lists quarantined inbox ids to give up on (marked ignored with
	// reason skipped_by_operator) instead of re-driving, for events that
	// can never apply (an undecodable record).
	Skip []int64
	// Now is the clock. Defaults to time.Now.
	Now func() time.Time
}

// Replay re-drives a held payment after the cause of its quarantine was
// fixed: in one transaction it releases the hold and applies the payment's
// quarantined events and the events deferred while it was held, in arrival
// order, through the same machine and writes as the processor — so each
// applies exactly once. If an event still fails, nothing changes and the
// error names it.
//
// Replay runs outside the consumer group, so it holds no partition epoch:
// it locks the payment row (as every writer of a payment does) and writes
// each inbox outcome only if the row still has the status it was read
// with. If one changed meanwhile, Replay rolls back and returns
// ErrOutcomeChanged; running it again sees the new state.
func Replay(ctx context.Context, pool *pgxpool.Pool, paymentKey string, opts ReplayOptions) (ReplayReport, error) {
	if opts.Now == nil {
		opts.Now = time.Now
	}
	report := ReplayReport{PaymentKey: paymentKey, Replayed: map[string]int{}}
	skip := map[int64]bool{}
	for _, id := range opts.Skip {
		skip[id] = true
	}
	a := &applier{now: opts.Now}
	err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		payments := map[string]*paymentRow{paymentKey: {key: paymentKey}}
		b := &pgx.Batch{}
		queueLoadPayments(b, []string{paymentKey}, payments)
		type row struct {
			id          int64
			status      string
			duplicateOf *int64
			payload     []byte
		}
		var rows []row
		b.Queue(`
			SELECT id, status, duplicate_of, payload FROM inbox
			 WHERE payment_key = $1 AND (status = 'quarantined' OR (status = 'deferred' AND reason = $2))
			 ORDER BY id`, paymentKey, reasonPaymentHeld).Query(func(rs pgx.Rows) error {
			for rs.Next() {
				var r row
				if err := rs.Scan(&r.id, &r.status, &r.duplicateOf, &r.payload); err != nil {
					return err
				}
				rows = append(rows, r)
			}
			return rs.Err()
		})
		var found bool
		b.Queue(`SELECT true FROM payments WHERE payment_key = $1 AND held`, paymentKey).QueryRow(func(r pgx.Row) error {
			err := r.Scan(&found)
			if errors.Is(err, pgx.ErrNoRows) {
				return nil
			}
			return err
		})
		if err := tx.SendBatch(ctx, b).Close(); err != nil {
			return fmt.Errorf("load held payment: %w", err)
		}
		if !found && len(rows) == 0 {
			return ErrNotHeld
		}
		p := payments[paymentKey]
		if _, err := tx.Exec(ctx, `UPDATE payments SET held = false, held_reason = NULL, updated_at = now() WHERE payment_key = $1`, paymentKey); err != nil {
			return fmt.Errorf("release hold: %w", err)
		}
		p.held = false

		var ds []delivery
		for _, r := range rows {
			if skip[r.id] {
				if err := updateAsRead(ctx, tx, r.id, r.status, `status = 'ignored', reason = 'skipped_by_operator', processed_at = now()`); err != nil {
					return fmt.Errorf("skip inbox %d: %w", r.id, err)
				}
				report.Skipped = append(report.Skipped, r.id)
				continue
			}
			if r.duplicateOf != nil {
				// A redelivery of an event already in the inbox.
				if err := updateAsRead(ctx, tx, r.id, r.status, `status = 'ignored', reason = $3, processed_at = now()`, reasonDuplicateEvent); err != nil {
					return fmt.Errorf("settle duplicate inbox %d: %w", r.id, err)
				}
				report.Replayed[string(payment.OutcomeIgnored)]++
				continue
			}
			env, err := envelope.DecodeRaw(r.payload)
			if err != nil {
				return fmt.Errorf("inbox event %d still cannot be decoded (skip it with --skip %d): %w", r.id, r.id, err)
			}
			if env.PaymentKey != paymentKey {
				return fmt.Errorf("inbox event %d belongs to %s", r.id, env.PaymentKey)
			}
			if p.source == "" {
				p.source, p.paymentID = env.Source, env.Event.PaymentID
			}
			ds = append(ds, delivery{env: env, inboxID: r.id, status: r.status})
		}
		if len(ds) == 0 {
			return nil
		}
		// Quarantined rows were stored without their fact; store it now so
		// a later deferral can be re-offered.
		for _, d := range ds {
			if err := updateAsRead(ctx, tx, d.inboxID, d.status, `fact = $3, event_type = $4, event_id = NULLIF($5, ''), occurred_at = $6`,
				d.env.Event.Fact, d.env.Event.Type, d.env.Event.EventID, nullTime(d.env.Event.Fact.OccurredAt)); err != nil {
				if errors.Is(err, ErrOutcomeChanged) {
					return err
				}
				return fmt.Errorf("inbox event %d still fails: %w", d.inboxID, err)
			}
		}
		results, err := a.decide(ctx, tx, ds, payments)
		if errors.Is(err, ErrOutcomeChanged) {
			return err
		}
		if err != nil {
			return fmt.Errorf("replay still fails: %w", err)
		}
		for _, r := range results {
			report.Replayed[r.outcome]++
		}
		return nil
	})
	if err != nil {
		return ReplayReport{}, err
	}
	return report, nil
}

// updateAsRead applies set (an UPDATE's SET list, whose parameters start at
// $3) to inbox row id if it still has status, and fails with
// ErrOutcomeChanged if it does not.
func updateAsRead(ctx context.Context, tx pgx.Tx, id int64, status, set string, args ...any) error {
	ct, err := tx.Exec(ctx, `UPDATE inbox SET `+set+` WHERE id = $1 AND status = $2`, append([]any{id, status}, args...)...)
	if err != nil {
		return err
	}
	if ct.RowsAffected() != 1 {
		return fmt.Errorf("%w: inbox %d is no longer %s", ErrOutcomeChanged, id, status)
	}
	return nil
}

// HeldPayment is a payment waiting for a replay.
type HeldPayment struct {
	PaymentKey  string
	Reason      string
	Quarantined int
	Waiting     int
}

// ListHeld lists held payments, oldest hold first.
func ListHeld(ctx context.Context, pool *pgxpool.Pool) ([]HeldPayment, error) {
	rows, err := pool.Query(ctx, `
		SELECT p.payment_key, COALESCE(p.held_reason, ''),
		       (SELECT count(*) FROM inbox i WHERE i.payment_key = p.payment_key AND i.status = 'quarantined'),
		       (SELECT count(*) FROM inbox i WHERE i.payment_key = p.payment_key AND i.status = 'deferred' AND i.reason = $1)
		  FROM payments p WHERE p.held ORDER BY p.updated_at`, reasonPaymentHeld)
	if err != nil {
		return nil, fmt.Errorf("list held payments: %w", err)
	}
	return pgx.CollectRows(rows, pgx.RowToStructByPos[HeldPayment])
}
