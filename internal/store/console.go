package store

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
)

// The read-only statements of `paystream console` (package console). They
// change nothing, and every list is a keyset page: a page costs the rows it
// shows (plus, for the waiting lists, the waiting rows, which the partial
// index deliveries_waiting holds), never a count or an OFFSET over the
// deliveries table.

// SearchHit is a payment a console search found, and how.
type SearchHit struct {
	PaymentKey string
	// By says what matched: "payment key", "state event id", "gateway
	// payment id" or "webhook event id".
	By string
}

// Search finds the payments that q names: a payment key, a state event id
// ("{payment key}:{version}"), a gateway's payment id or a webhook's event
// id, at most limit of them. Those are index lookups: the gateway id and
// the webhook event id are tried under every source that has dedup keys
// (the event id as a dedup key). Only when they find nothing does it scan:
// payments by payment_id (a payment of an account, or of a source idle past
// the dedup retention) and deliveries by event_id (an event id that is not
// its dedup key), bounded by the caller's deadline.
func Search(ctx context.Context, db DB, q string, limit int) ([]SearchHit, error) {
	q = strings.TrimSpace(q)
	if q == "" {
		return nil, nil
	}
	var hits []SearchHit
	seen := map[string]bool{}
	add := func(key, by string) {
		if !seen[key] && len(hits) < limit {
			seen[key] = true
			hits = append(hits, SearchHit{PaymentKey: key, By: by})
		}
	}
	var stateKey string
	var stateVersion int64 = -1
	if i := strings.LastIndexByte(q, ':'); i > 0 {
		if v, err := strconv.ParseInt(q[i+1:], 10, 64); err == nil && v > 0 {
			stateKey, stateVersion = q[:i], v
		}
	}
	// Sources, by a loose index scan of dedup_keys' primary key (one probe
	// per source, however many keys), then one primary key lookup per kind
	// of id. A webhook event id that is its dedup key (most gateways') names
	// its first delivery's id and day: that day's partition is the only one
	// read.
	rows, err := db.Query(ctx, `
		WITH RECURSIVE s AS (
			(SELECT source FROM dedup_keys ORDER BY source LIMIT 1)
			UNION ALL
			SELECT (SELECT d.source FROM dedup_keys d WHERE d.source > s.source ORDER BY d.source LIMIT 1) FROM s WHERE s.source IS NOT NULL
		), hits AS (
			SELECT 1 AS rank, payment_key, 'payment key' AS by FROM payments WHERE payment_key = $1
			UNION ALL
			SELECT 2, payment_key, 'state event id' FROM payments
			 WHERE payment_key = $2 AND EXISTS (SELECT 1 FROM payment_transitions t WHERE t.payment_key = $2 AND t.version = $3)
			UNION ALL
			SELECT 3, p.payment_key, 'gateway payment id' FROM s JOIN payments p ON p.payment_key = s.source || ':' || $1
			UNION ALL
			SELECT 4, d.payment_key, 'webhook event id'
			  FROM s JOIN dedup_keys k ON k.source = s.source AND k.dedup_key = $1
			  JOIN LATERAL (SELECT payment_key FROM deliveries d
			                 WHERE d.recorded_at = k.recorded_at AND d.id = k.delivery_id AND d.event_id = $1 LIMIT 1) d ON true
		)
		SELECT payment_key, by FROM hits WHERE payment_key <> '' ORDER BY rank, payment_key`, q, stateKey, stateVersion)
	if err != nil {
		return nil, fmt.Errorf("search payments: %w", err)
	}
	var key, by string
	if _, err := pgx.ForEachRow(rows, []any{&key, &by}, func() error { add(key, by); return nil }); err != nil {
		return nil, fmt.Errorf("search payments: %w", err)
	}
	if len(hits) > 0 {
		return hits, nil
	}
	rows, err = db.Query(ctx, `
		(SELECT payment_key, 'gateway payment id' FROM payments WHERE payment_id = $1 ORDER BY payment_key LIMIT $2)
		UNION ALL
		(SELECT DISTINCT payment_key, 'webhook event id' FROM deliveries WHERE event_id = $1 AND payment_key <> '' LIMIT $2)`, q, limit)
	if err != nil {
		return nil, fmt.Errorf("search payments by scan: %w", err)
	}
	if _, err := pgx.ForEachRow(rows, []any{&key, &by}, func() error { add(key, by); return nil }); err != nil {
		return nil, fmt.Errorf("search payments by scan: %w", err)
	}
	return hits, nil
}

// PaymentSummary is a payment's row as the console shows it.
type PaymentSummary struct {
	PaymentHead
	HeldReason  string
	LastEventAt *time.Time
	CreatedAt   time.Time
	UpdatedAt   time.Time
}

// LoadPaymentSummary reads one payment, or fails with ErrNotFound.
func LoadPaymentSummary(ctx context.Context, db DB, paymentKey string) (PaymentSummary, error) {
	var p PaymentSummary
	err := db.QueryRow(ctx, `
		SELECT `+paymentHeadColumns+`, COALESCE(held_reason, ''), last_event_at, created_at, updated_at
		  FROM payments WHERE payment_key = $1`, paymentKey).
		Scan(p.targets(&p.HeldReason, &p.LastEventAt, &p.CreatedAt, &p.UpdatedAt)...)
	if errors.Is(err, pgx.ErrNoRows) {
		return PaymentSummary{}, fmt.Errorf("payment %s: %w", paymentKey, ErrNotFound)
	}
	if err != nil {
		return PaymentSummary{}, fmt.Errorf("load payment: %w", err)
	}
	return p, nil
}

// LoadTransitions reads a payment's transitions in version order (one per
// real change: a handful per payment).
func LoadTransitions(ctx context.Context, db DB, paymentKey string) ([]Transition, error) {
	return queryRows(ctx, db, pgx.RowToStructByPos[Transition], "load transitions", `
		SELECT version, from_status, to_status, kind, amount_minor, currency, COALESCE(refund_id, ''), created_at
		  FROM payment_transitions WHERE payment_key = $1 ORDER BY version`, paymentKey)
}

// Movement is one ledger movement: amount moved from the credit account to
// the debit account by a transition.
type Movement struct {
	Version     int64
	Movement    int16
	Debit       string
	Credit      string
	AmountMinor int64
	Currency    string
}

// LoadMovements reads a payment's ledger movements in (version, movement)
// order.
func LoadMovements(ctx context.Context, db DB, paymentKey string) ([]Movement, error) {
	return queryRows(ctx, db, pgx.RowToStructByPos[Movement], "load ledger movements", `
		SELECT version, movement, debit_account, credit_account, amount_minor, currency
		  FROM ledger_movements WHERE payment_key = $1 ORDER BY version, movement`, paymentKey)
}

// ConsoleDelivery is one delivery as the console lists it.
type ConsoleDelivery struct {
	ID          int64
	PaymentKey  string
	Source      string
	EventID     string
	DedupKey    string
	Type        string
	Status      string
	Reason      string
	Attempts    int32
	DuplicateOf *int64
	Topic       string
	Partition   int32
	Offset      int64
	OccurredAt  *time.Time
	ReceivedAt  time.Time
	ProcessedAt time.Time
	// BodyBytes is the size of the kept webhook body, or of the kept Kafka
	// record for quarantined and migrated rows; 0 when neither is kept.
	BodyBytes int64
	// Body is the kept body (or record), read only when asked for.
	Body []byte
}

// consoleDeliveryColumns are the columns scanConsoleDelivery reads; $body
// is replaced by the body expression (or NULL).
const consoleDeliveryColumns = `id, payment_key, source, COALESCE(event_id, ''), dedup_key, event_type, status, COALESCE(reason, ''),
	attempts, duplicate_of, topic, partition, kafka_offset, occurred_at, received_at, processed_at,
	COALESCE(octet_length(body), octet_length(record), 0), $body`

func consoleDeliverySelect(withBody bool) string {
	body := "NULL::bytea"
	if withBody {
		body = "COALESCE(body, record)"
	}
	return strings.Replace(consoleDeliveryColumns, "$body", body, 1)
}

func scanConsoleDelivery(r pgx.CollectableRow) (ConsoleDelivery, error) {
	var d ConsoleDelivery
	err := r.Scan(&d.ID, &d.PaymentKey, &d.Source, &d.EventID, &d.DedupKey, &d.Type, &d.Status, &d.Reason,
		&d.Attempts, &d.DuplicateOf, &d.Topic, &d.Partition, &d.Offset, &d.OccurredAt, &d.ReceivedAt, &d.ProcessedAt,
		&d.BodyBytes, &d.Body)
	return d, err
}

// PaymentDeliveries returns up to limit of a payment's deliveries with ids
// above afterID, in arrival (id) order: a keyset page through the index
// deliveries_payment. withBody also reads each kept body.
func PaymentDeliveries(ctx context.Context, db DB, paymentKey string, afterID int64, limit int, withBody bool) ([]ConsoleDelivery, error) {
	return queryRows(ctx, db, scanConsoleDelivery, "load deliveries", `
		SELECT `+consoleDeliverySelect(withBody)+`
		  FROM deliveries WHERE payment_key = $1 AND id > $2 ORDER BY id LIMIT $3`, paymentKey, afterID, limit)
}

// WaitCursor is a position in a list of waiting deliveries, oldest first:
// the received time and id of the last row shown. The zero cursor starts
// the list.
type WaitCursor struct {
	ReceivedAt time.Time
	ID         int64
}

// WaitingDeliveries returns up to limit deliveries with status (deferred
// or quarantined) received after the cursor, oldest first, and, for
// deferred ones, only those with reason when it is not empty. It reads the
// partial index deliveries_waiting: its cost grows with the waiting rows,
// not with the deliveries table.
func WaitingDeliveries(ctx context.Context, db DB, status, reason string, after WaitCursor, limit int) ([]ConsoleDelivery, error) {
	if status != StatusDeferred && status != StatusQuarantined {
		return nil, fmt.Errorf("waiting deliveries: status %q is neither %s nor %s", status, StatusDeferred, StatusQuarantined)
	}
	return queryRows(ctx, db, scanConsoleDelivery, "list "+status+" deliveries", `
		SELECT `+consoleDeliverySelect(false)+`
		  FROM deliveries
		 WHERE status IN ('deferred', 'quarantined') AND status = $1 AND ($2 = '' OR reason = $2)
		   AND (received_at, id) > ($3, $4)
		 ORDER BY received_at, id LIMIT $5`, status, reason, after.ReceivedAt, after.ID, limit)
}

// HeldCursor is a position in the list of held payments, oldest hold
// first: the last row's updated_at and key. The zero cursor starts it.
type HeldCursor struct {
	Since      time.Time
	PaymentKey string
}

// HeldRow is a held payment with its waiting deliveries.
type HeldRow struct {
	PaymentKey  string
	Reason      string
	Since       time.Time
	Quarantined int64
	Waiting     int64
}

// HeldPayments returns up to limit held payments after the cursor, oldest
// hold (last update) first, each with its quarantined deliveries and those
// deferred behind the hold (counted on the partial index).
func HeldPayments(ctx context.Context, db DB, after HeldCursor, limit int) ([]HeldRow, error) {
	return queryRows(ctx, db, pgx.RowToStructByPos[HeldRow], "list held payments", `
		SELECT p.payment_key, COALESCE(p.held_reason, ''), p.updated_at,
		       (SELECT count(*) FROM deliveries d WHERE d.payment_key = p.payment_key AND d.status IN ('deferred', 'quarantined') AND d.status = 'quarantined'),
		       (SELECT count(*) FROM deliveries d WHERE d.payment_key = p.payment_key AND d.status IN ('deferred', 'quarantined') AND d.status = 'deferred' AND d.reason = $1)
		  FROM payments p
		 WHERE p.held AND (p.updated_at, p.payment_key) > ($2, $3)
		 ORDER BY p.updated_at, p.payment_key LIMIT $4`, ReasonPaymentHeld, after.Since, after.PaymentKey, limit)
}

// PartitionOffset is a consumer group's stored position in one partition
// of a topic, as the processor's batch transactions leave it.
type PartitionOffset struct {
	Partition  int32
	NextOffset int64
	OwnerEpoch int64
	// UpdatedAt is the time of the last commit that moved the offset (or
	// of the last claim).
	UpdatedAt time.Time
}

// PartitionOffsets returns group's stored offsets in topic, by partition.
func PartitionOffsets(ctx context.Context, db DB, group, topic string) ([]PartitionOffset, error) {
	return queryRows(ctx, db, pgx.RowToStructByPos[PartitionOffset], "read stored offsets", `
		SELECT partition, next_offset, owner_epoch, updated_at FROM consumer_offsets
		 WHERE group_id = $1 AND topic = $2 ORDER BY partition`, group, topic)
}

// SlotStatus is a replication slot as pg_replication_slots shows it.
type SlotStatus struct {
	Name   string
	Exists bool
	Active bool
	// WALStatus is reserved, extended, unreserved or lost.
	WALStatus string
	// LagBytes is the WAL between the server's current position and what
	// the slot's consumer confirmed.
	LagBytes int64
}

// ReadSlot reads the replication slot named name (the relay's: see
// sink.Slot). A missing slot is not an error: Exists is false.
func ReadSlot(ctx context.Context, db DB, name string) (SlotStatus, error) {
	s := SlotStatus{Name: name}
	err := db.QueryRow(ctx, `
		SELECT active, COALESCE(wal_status, ''),
		       COALESCE(pg_wal_lsn_diff(pg_current_wal_lsn(), confirmed_flush_lsn), 0)::bigint
		  FROM pg_replication_slots WHERE slot_name = $1`, name).Scan(&s.Active, &s.WALStatus, &s.LagBytes)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return s, nil
	case err != nil:
		return s, fmt.Errorf("read replication slot %s: %w", name, err)
	}
	s.Exists = true
	return s, nil
}

// RetentionView is what the database shows of retention's work: the daily
// partitions of deliveries (retention creates the coming days' and drops
// the expired ones) and the rows stuck in the default partition (which it
// moves out). Postgres keeps no creation time for a table, so this is the
// evidence of the last run, not its time.
type RetentionView struct {
	Partitions []Partition
	// DefaultRows is the planner's estimate of the rows in
	// deliveries_default (pg_class.reltuples, as of the last ANALYZE or
	// VACUUM; -1 when never analyzed): no count(*).
	DefaultRows int64
}

// ReadRetention reads the RetentionView.
func ReadRetention(ctx context.Context, db DB) (RetentionView, error) {
	var v RetentionView
	var err error
	if v.Partitions, err = ListPartitions(ctx, db); err != nil {
		return v, err
	}
	err = db.QueryRow(ctx, `
		SELECT COALESCE((SELECT reltuples::bigint FROM pg_class WHERE oid = to_regclass('deliveries_default')), -1)`).Scan(&v.DefaultRows)
	if err != nil {
		return v, fmt.Errorf("estimate default partition rows: %w", err)
	}
	return v, nil
}
