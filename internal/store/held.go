package store

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
)

// Quarantined is a record that failed deterministically, as Quarantine
// stores it.
type Quarantined struct {
	RecordedAt time.Time
	Source     string
	DedupKey   string
	EventType  string
	PaymentKey string
	Reason     string
	// Record is the Kafka record value, kept byte-exact.
	Record     []byte
	Topic      string
	Partition  int32
	Offset     int64
	ReceivedAt time.Time
}

// Quarantine stores q as a quarantined delivery and, when it names a
// payment, holds the payment (creating it if needed) with q's reason. A
// record whose dedup key is free takes it, so its redeliveries are
// duplicates; else it is recorded against the first delivery.
func Quarantine(ctx context.Context, tx pgx.Tx, q Quarantined) error {
	_, err := tx.Exec(ctx, `
		WITH id AS (SELECT nextval('deliveries_id_seq') AS id),
		     k AS (INSERT INTO dedup_keys (source, dedup_key, delivery_id, recorded_at)
		           SELECT $1, $2, id, $11 FROM id ON CONFLICT DO NOTHING RETURNING delivery_id)
		INSERT INTO deliveries (id, recorded_at, source, dedup_key, event_type, payment_key, status, reason, record,
		                        topic, partition, kafka_offset, received_at, duplicate_of, attempts)
		SELECT id, $11, $1, $2, $3, $4, 'quarantined', $5, $6, $7, $8, $9, $10,
		       CASE WHEN EXISTS (SELECT 1 FROM k) THEN NULL
		            ELSE (SELECT delivery_id FROM dedup_keys WHERE source = $1 AND dedup_key = $2) END, 0
		  FROM id`,
		q.Source, q.DedupKey, q.EventType, q.PaymentKey, q.Reason, q.Record, q.Topic, q.Partition, q.Offset, q.ReceivedAt, q.RecordedAt)
	if err != nil {
		return fmt.Errorf("quarantine record: %w", err)
	}
	if q.PaymentKey == "" {
		return nil
	}
	_, err = tx.Exec(ctx, `
		INSERT INTO payments (payment_key, source, payment_id, status, version, state, held, held_reason)
		VALUES ($1, $2, '', '', 0, '{}', true, $3)
		ON CONFLICT (payment_key) DO UPDATE SET held = true, held_reason = EXCLUDED.held_reason, updated_at = now()`,
		q.PaymentKey, q.Source, q.Reason)
	if err != nil {
		return fmt.Errorf("hold payment: %w", err)
	}
	return nil
}

// ReleaseHold releases paymentKey's hold.
func (t *BatchTx) ReleaseHold(ctx context.Context, paymentKey string) error {
	if _, err := t.tx.Exec(ctx, `UPDATE payments SET held = false, held_reason = NULL, updated_at = now() WHERE payment_key = $1`, paymentKey); err != nil {
		return fmt.Errorf("release hold: %w", err)
	}
	return nil
}

// SetOutcome writes o now, and fails with ErrOutcomeChanged if the row no
// longer has status o.Expected.
func (t *BatchTx) SetOutcome(ctx context.Context, o Outcome) error {
	ct, err := t.tx.Exec(ctx, `
		UPDATE deliveries SET status = $4, reason = NULLIF($5, ''), processed_at = now()
		 WHERE payment_key = $1 AND id = $2 AND status IN ('deferred', 'quarantined') AND status = $3`,
		o.PaymentKey, o.ID, o.Expected, o.Status, o.Reason)
	if err != nil {
		return fmt.Errorf("set outcome of delivery %d: %w", o.ID, err)
	}
	if ct.RowsAffected() != 1 {
		return fmt.Errorf("%w: delivery %d is no longer %s", ErrOutcomeChanged, o.ID, o.Expected)
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
func ListHeld(ctx context.Context, db DB) ([]HeldPayment, error) {
	return queryRows(ctx, db, pgx.RowToStructByPos[HeldPayment], "list held payments", `
		SELECT p.payment_key, COALESCE(p.held_reason, ''),
		       (SELECT count(*) FROM deliveries d WHERE d.payment_key = p.payment_key AND d.status = 'quarantined'),
		       (SELECT count(*) FROM deliveries d WHERE d.payment_key = p.payment_key AND d.status = 'deferred' AND d.reason = $1)
		  FROM payments p WHERE p.held ORDER BY p.updated_at`, ReasonPaymentHeld)
}

// Gauges are the counts the processor exports as gauges.
type Gauges struct {
	Deferred, Overdue, Quarantined, Held int64
}

// ReadGauges counts the deferred deliveries (and those older than
// window), the quarantined ones and the held payments.
func ReadGauges(ctx context.Context, db DB, window time.Duration) (Gauges, error) {
	var g Gauges
	err := db.QueryRow(ctx, `
		SELECT count(*) FILTER (WHERE status = 'deferred'),
		       count(*) FILTER (WHERE status = 'deferred' AND received_at < now() - $1::interval),
		       count(*) FILTER (WHERE status = 'quarantined'),
		       (SELECT count(*) FROM payments WHERE held)
		  FROM deliveries WHERE status IN ('deferred', 'quarantined')`, window).Scan(&g.Deferred, &g.Overdue, &g.Quarantined, &g.Held)
	if err != nil {
		return Gauges{}, fmt.Errorf("read gauges: %w", err)
	}
	return g, nil
}
