package store

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/paystream/paystream/internal/envelope"
	"github.com/paystream/paystream/internal/payment"
	"github.com/paystream/paystream/internal/provider"
)

// StoredDelivery is a delivery as stored, with what rebuilds its envelope.
type StoredDelivery struct {
	ID          int64
	PaymentKey  string
	Status      string
	Reason      string
	DuplicateOf *int64
	Attempts    int
	RecordedAt  time.Time

	// The columns the envelope is rebuilt from (see Envelope).
	source, dedupKey, eventType, driver, paymentID, factStatus, currency string
	eventID, refundID                                                    *string
	amountMinor                                                          *int64
	needsRefetch                                                         bool
	occurredAt                                                           *time.Time
	receivedAt                                                           time.Time
	body, record                                                         []byte
}

// deliveryColumns are the columns scanDelivery reads, in its order.
const deliveryColumns = `id, payment_key, status, COALESCE(reason, ''), duplicate_of, attempts, recorded_at,
	source, dedup_key, event_type, COALESCE(driver, ''), COALESCE(payment_id, ''), COALESCE(fact_status, ''), COALESCE(currency, ''),
	event_id, refund_id, amount_minor, needs_refetch, occurred_at, received_at, body, record`

// scanTargets returns the scan destinations of deliveryColumns.
func (d *StoredDelivery) scanTargets() []any {
	return []any{&d.ID, &d.PaymentKey, &d.Status, &d.Reason, &d.DuplicateOf, &d.Attempts, &d.RecordedAt,
		&d.source, &d.dedupKey, &d.eventType, &d.driver, &d.paymentID, &d.factStatus, &d.currency,
		&d.eventID, &d.refundID, &d.amountMinor, &d.needsRefetch, &d.occurredAt, &d.receivedAt, &d.body, &d.record}
}

// scanStoredDelivery scans a row of deliveryColumns.
func scanStoredDelivery(row pgx.CollectableRow) (StoredDelivery, error) {
	var d StoredDelivery
	err := row.Scan(d.scanTargets()...)
	return d, err
}

// Envelope returns the raw envelope the delivery was consumed as: the
// stored record value decoded, for rows that keep it (quarantined, and
// migrated from the inbox), else rebuilt from the body and the normalized
// event's columns. It fails, wrapping envelope.ErrUndecodable, for a
// record that does not decode.
func (d *StoredDelivery) Envelope() (envelope.Raw, error) {
	if d.record != nil {
		return envelope.DecodeRaw(d.record)
	}
	ev := provider.Event{
		DedupKey:     d.dedupKey,
		PaymentID:    d.paymentID,
		Type:         d.eventType,
		NeedsRefetch: d.needsRefetch,
		Fact:         payment.Fact{Status: payment.Status(d.factStatus), Currency: d.currency},
	}
	if d.eventID != nil {
		ev.EventID = *d.eventID
	}
	if d.refundID != nil {
		ev.Fact.RefundID = *d.refundID
	}
	if d.amountMinor != nil {
		ev.Fact.AmountMinor = *d.amountMinor
	}
	if d.occurredAt != nil {
		ev.Fact.OccurredAt = d.occurredAt.UTC()
	}
	return envelope.Raw{
		V: envelope.RawVersion, Source: d.source, Driver: d.driver, PaymentKey: d.PaymentKey,
		Event: ev, ReceivedAt: d.receivedAt.UTC(), Body: d.body,
	}, nil
}

func nullTime(t time.Time) *time.Time {
	if t.IsZero() {
		return nil
	}
	return &t
}

// LoadDelivery reads one stored delivery by id. It is for operators and
// tests: no index leads with the id, so it looks into every partition.
func LoadDelivery(ctx context.Context, db DB, id int64) (StoredDelivery, error) {
	var d StoredDelivery
	err := db.QueryRow(ctx, `SELECT `+deliveryColumns+` FROM deliveries WHERE id = $1`, id).Scan(d.scanTargets()...)
	if errors.Is(err, pgx.ErrNoRows) {
		return StoredDelivery{}, fmt.Errorf("delivery %d: %w", id, ErrNotFound)
	}
	if err != nil {
		return StoredDelivery{}, fmt.Errorf("load delivery %d: %w", id, err)
	}
	return d, nil
}
