package store

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
)

// RecordedTransition is a payment transition as stored, with what its state
// event carries besides: the payment's source, id and current state, and
// the event id and time of the delivery that caused it (when the delivery
// is still kept).
type RecordedTransition struct {
	PaymentKey  string
	Version     int64
	From, To    string
	Kind        string
	AmountMinor int64
	Currency    string
	RefundID    string
	RecordedAt  time.Time
	Source      string
	PaymentID   string
	// State is the payment's state now (payments.state), as JSON.
	State []byte
	// SourceEventID and OccurredAt are the causing delivery's; empty and
	// nil when retention dropped it or it did not record them.
	SourceEventID string
	OccurredAt    *time.Time
}

// TransitionsSince returns the transitions recorded at or after since, by
// payment and version. `paystream republish` runs it in the snapshot its
// new replication slot exported, to publish again what a lost slot may not
// have relayed. It reads payment_transitions whole (no index on the time):
// a recovery, not a hot path.
func TransitionsSince(ctx context.Context, db DB, since time.Time) ([]RecordedTransition, error) {
	return queryRows(ctx, db, scanRecorded, "read transitions since "+since.Format(time.RFC3339), `
		SELECT t.payment_key, t.version, t.from_status, t.to_status, t.kind, t.amount_minor, t.currency,
		       coalesce(t.refund_id, ''), t.created_at, p.source, p.payment_id, p.state::text,
		       coalesce(d.event_id, ''), d.occurred_at
		  FROM payment_transitions t
		  JOIN payments p USING (payment_key)
		  LEFT JOIN LATERAL (
		       SELECT event_id, occurred_at FROM deliveries d
		        WHERE d.payment_key = t.payment_key AND d.id = t.delivery_id LIMIT 1) d ON true
		 WHERE t.created_at >= $1
		 ORDER BY t.payment_key, t.version`, since)
}

// scanRecorded scans a row of RecordedTransition's columns.
func scanRecorded(row pgx.CollectableRow) (RecordedTransition, error) {
	var r RecordedTransition
	var state string
	err := row.Scan(&r.PaymentKey, &r.Version, &r.From, &r.To, &r.Kind, &r.AmountMinor, &r.Currency,
		&r.RefundID, &r.RecordedAt, &r.Source, &r.PaymentID, &state, &r.SourceEventID, &r.OccurredAt)
	r.State = []byte(state)
	return r, err
}

// NewestTransitions returns, by payment key after after, at most limit
// payments' newest transitions (the one of payments.version), with what
// their state events carry: a page of `paystream backfill`, which rebuilds
// the latest-state topic from them in one snapshot.
func NewestTransitions(ctx context.Context, db DB, after string, limit int) ([]RecordedTransition, error) {
	return queryRows(ctx, db, scanRecorded, fmt.Sprintf("read newest transitions after %q", after), `
		SELECT t.payment_key, t.version, t.from_status, t.to_status, t.kind, t.amount_minor, t.currency,
		       coalesce(t.refund_id, ''), t.created_at, p.source, p.payment_id, p.state::text,
		       coalesce(d.event_id, ''), d.occurred_at
		  FROM payments p
		  JOIN payment_transitions t ON t.payment_key = p.payment_key AND t.version = p.version
		  LEFT JOIN LATERAL (
		       SELECT event_id, occurred_at FROM deliveries d
		        WHERE d.payment_key = t.payment_key AND d.id = t.delivery_id LIMIT 1) d ON true
		 WHERE p.payment_key > $1
		 ORDER BY p.payment_key
		 LIMIT $2`, after, limit)
}

// CountPayments counts the payments with a transition.
func CountPayments(ctx context.Context, db DB) (int64, error) {
	var n int64
	if err := db.QueryRow(ctx, `SELECT count(*) FROM payments WHERE version > 0`).Scan(&n); err != nil {
		return 0, fmt.Errorf("count payments: %w", err)
	}
	return n, nil
}
