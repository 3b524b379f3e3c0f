package store

import (
	"encoding/json"
	"fmt"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/paystream/paystream/internal/envelope"
	"github.com/paystream/paystream/internal/ledger"
	"github.com/paystream/paystream/internal/payment"
	"github.com/paystream/paystream/internal/statelog"
)

// Writes is every row a batch transaction writes once its decisions are
// made. BatchTx.Write sends them in one round trip, in this order: dedup
// keys of first deliveries (the unique key is the deduplication: a key
// another transaction stored since the batch read them fails the batch
// with a unique violation, and its retry sees a redelivery), deliveries,
// outcomes (ErrOutcomeChanged if a row was decided meanwhile), payment
// states, transitions, their ledger movements, the state message and the
// offsets.
type Writes struct {
	Deliveries  []Delivery
	Outcomes    []Outcome
	Payments    []PaymentWrite
	Transitions []TransitionWrite
	// Events are the state events, per payment in version order: emitted
	// as one state message (statelog.EncodeMessage).
	Events []statelog.Event
	// Offsets are the partitions' next offsets, of the lock's group and
	// topic.
	Offsets []Offset
}

// Delivery is a record consumed from the raw topic, to be stored once with
// its outcome. The deliveries of one Writes are of one topic.
type Delivery struct {
	ID         int64
	RecordedAt time.Time // the processor's clock: picks the partition
	Topic      string
	Partition  int32
	Offset     int64
	Envelope   envelope.Raw
	// Duplicate marks a redelivery: stored as ignored duplicate_event,
	// pointing at the first delivery (DuplicateOf, from Loaded.Known or
	// the batch itself), without its body. Status and Reason are then
	// ignored.
	Duplicate   bool
	DuplicateOf int64
	Status      string
	Reason      string
}

// Outcome is a new outcome for a stored delivery, written only if the row
// still has status Expected.
type Outcome struct {
	ID         int64
	PaymentKey string
	Status     string
	Reason     string
	Expected   string
}

// PaymentWrite is a payment's new state.
type PaymentWrite struct {
	// New is true for a payment not stored yet (LoadedPayment.Found false).
	New         bool
	Key         string
	Source      string
	PaymentID   string
	State       payment.State
	LastEventAt time.Time
}

// TransitionWrite is a payment's transition (with its ledger movements),
// caused by a delivery.
type TransitionWrite struct {
	PaymentKey string
	DeliveryID int64
	payment.Transition
}

// Offset is a partition's next offset.
type Offset struct {
	Partition int32
	Next      int64
}

// queueWrites queues w's statements on b.
func (t *BatchTx) queueWrites(b *pgx.Batch, w Writes) error {
	queueDeliveries(b, w.Deliveries)
	queueOutcomes(b, w.Outcomes)
	if err := queuePaymentWrites(b, w.Payments); err != nil {
		return err
	}
	queueTransitions(b, w.Transitions)
	if len(w.Events) > 0 {
		// One message, compressed, for all of the transaction's events.
		frame, err := statelog.EncodeMessage(w.Events)
		if err != nil {
			return err
		}
		b.Queue(statelog.EmitMessageSQL, frame)
	}
	if len(w.Offsets) > 0 {
		b.Queue(`
			UPDATE consumer_offsets c SET next_offset = u.next, updated_at = now()
			  FROM unnest($1::int[], $2::bigint[]) AS u(partition, next)
			 WHERE c.group_id = $3 AND c.topic = $4 AND c.partition = u.partition`,
			append(arrays(w.Offsets,
				col(func(o Offset) int32 { return o.Partition }),
				col(func(o Offset) int64 { return o.Next })),
				t.lock.Group, t.lock.Topic)...)
	}
	return nil
}

// deliveryHead and deliveryTail are the columns both inserts of deliveries
// (first deliveries and duplicates) start and end with, in their order:
// id .. payment_key, then partition .. received_at.
var (
	deliveryHead = []column[*Delivery]{
		col(func(d *Delivery) int64 { return d.ID }),
		col(func(d *Delivery) time.Time { return d.RecordedAt }),
		col(func(d *Delivery) string { return d.Envelope.Source }),
		col(func(d *Delivery) string { return d.Envelope.Event.DedupKey }),
		col(func(d *Delivery) string { return d.Envelope.Event.EventID }),
		col(func(d *Delivery) string { return d.Envelope.Event.Type }),
		col(func(d *Delivery) string { return d.Envelope.PaymentKey }),
	}
	deliveryTail = []column[*Delivery]{
		col(func(d *Delivery) int32 { return d.Partition }),
		col(func(d *Delivery) int64 { return d.Offset }),
		col(func(d *Delivery) *time.Time { return nullTime(d.Envelope.Event.Fact.OccurredAt) }),
		col(func(d *Delivery) time.Time { return d.Envelope.ReceivedAt }),
	}
)

func queueDeliveries(b *pgx.Batch, ds []Delivery) {
	var firsts, dups []*Delivery
	for i := range ds {
		if ds[i].Duplicate {
			dups = append(dups, &ds[i])
		} else {
			firsts = append(firsts, &ds[i])
		}
	}
	if len(firsts) > 0 {
		// A plain INSERT, not ON CONFLICT DO NOTHING: the batch read which
		// keys are stored, so a conflict here is a first delivery another
		// transaction committed meanwhile; its unique violation (23505)
		// fails the batch, whose retry sees a duplicate. A speculative
		// insert would cost a confirmation WAL record per row.
		b.Queue(`
			INSERT INTO dedup_keys (source, dedup_key, delivery_id, recorded_at)
			SELECT * FROM unnest($1::text[], $2::text[], $3::bigint[], $4::timestamptz[])`,
			arrays(firsts,
				col(func(d *Delivery) string { return d.Envelope.Source }),
				col(func(d *Delivery) string { return d.Envelope.Event.DedupKey }),
				col(func(d *Delivery) int64 { return d.ID }),
				col(func(d *Delivery) time.Time { return d.RecordedAt }))...)
		// The normalized event is read back only for a deferred delivery
		// (a waiting event, the sweeper, replay): a delivery decided at
		// once keeps its body, and those columns stay NULL.
		deferred := func(d *Delivery, v string) string {
			if d.Status != StatusDeferred {
				return ""
			}
			return v
		}
		b.Queue(`
			INSERT INTO deliveries (id, recorded_at, source, dedup_key, event_id, event_type, payment_key, status, reason,
			                        driver, payment_id, fact_status, amount_minor, currency, refund_id, needs_refetch, body,
			                        topic, partition, kafka_offset, occurred_at, received_at)
			SELECT u.id, u.recorded_at, u.source, u.dedup_key, NULLIF(u.event_id, ''), u.event_type, u.payment_key, u.status, NULLIF(u.reason, ''),
			       NULLIF(u.driver, ''), NULLIF(u.payment_id, ''), NULLIF(u.fact_status, ''), u.amount_minor, NULLIF(u.currency, ''), NULLIF(u.refund_id, ''), u.refetch, u.body,
			       $22, u.partition, u.kafka_offset, u.occurred_at, u.received_at
			  FROM unnest($1::bigint[], $2::timestamptz[], $3::text[], $4::text[], $5::text[], $6::text[], $7::text[], $8::text[], $9::text[],
			              $10::text[], $11::text[], $12::text[], $13::bigint[], $14::text[], $15::text[], $16::bool[], $17::bytea[],
			              $18::int[], $19::bigint[], $20::timestamptz[], $21::timestamptz[])
			       AS u(id, recorded_at, source, dedup_key, event_id, event_type, payment_key, status, reason,
			            driver, payment_id, fact_status, amount_minor, currency, refund_id, refetch, body, partition, kafka_offset, occurred_at, received_at)`,
			append(arrays(firsts, slices.Concat(deliveryHead, []column[*Delivery]{
				col(func(d *Delivery) string { return d.Status }),
				col(func(d *Delivery) string { return d.Reason }),
				col(func(d *Delivery) string { return deferred(d, d.Envelope.Driver) }),
				col(func(d *Delivery) string { return deferred(d, d.Envelope.Event.PaymentID) }),
				col(func(d *Delivery) string { return deferred(d, string(d.Envelope.Event.Fact.Status)) }),
				col(func(d *Delivery) *int64 {
					if d.Status != StatusDeferred {
						return nil
					}
					return &d.Envelope.Event.Fact.AmountMinor
				}),
				col(func(d *Delivery) string { return deferred(d, d.Envelope.Event.Fact.Currency) }),
				col(func(d *Delivery) string { return deferred(d, d.Envelope.Event.Fact.RefundID) }),
				col(func(d *Delivery) bool { return d.Envelope.Event.NeedsRefetch }),
				col(func(d *Delivery) []byte { return d.Envelope.Body }),
			}, deliveryTail)...),
				firsts[0].Topic)...)
	}
	if len(dups) > 0 {
		b.Queue(`
			INSERT INTO deliveries (id, recorded_at, source, dedup_key, event_id, event_type, payment_key, status, reason, duplicate_of,
			                        topic, partition, kafka_offset, occurred_at, received_at)
			SELECT u.id, u.recorded_at, u.source, u.dedup_key, NULLIF(u.event_id, ''), u.event_type, u.payment_key, 'ignored', $13, u.duplicate_of,
			       $14, u.partition, u.kafka_offset, u.occurred_at, u.received_at
			  FROM unnest($1::bigint[], $2::timestamptz[], $3::text[], $4::text[], $5::text[], $6::text[], $7::text[], $8::bigint[],
			              $9::int[], $10::bigint[], $11::timestamptz[], $12::timestamptz[])
			       AS u(id, recorded_at, source, dedup_key, event_id, event_type, payment_key, duplicate_of, partition, kafka_offset, occurred_at, received_at)`,
			append(arrays(dups, slices.Concat(deliveryHead,
				[]column[*Delivery]{col(func(d *Delivery) int64 { return d.DuplicateOf })},
				deliveryTail)...),
				ReasonDuplicateEvent, dups[0].Topic)...)
	}
}

func queueOutcomes(b *pgx.Batch, os []Outcome) {
	if len(os) == 0 {
		return
	}
	b.Queue(`
		UPDATE deliveries d SET status = u.status, reason = NULLIF(u.reason, ''), attempts = d.attempts + 1, processed_at = now()
		  FROM unnest($1::bigint[], $2::text[], $3::text[], $4::text[], $5::text[]) AS u(id, payment_key, status, reason, expected)
		 WHERE d.payment_key = u.payment_key AND d.id = u.id AND d.status IN ('deferred', 'quarantined') AND d.status = u.expected`,
		arrays(os,
			col(func(o Outcome) int64 { return o.ID }),
			col(func(o Outcome) string { return o.PaymentKey }),
			col(func(o Outcome) string { return o.Status }),
			col(func(o Outcome) string { return o.Reason }),
			col(func(o Outcome) string { return o.Expected }))...).
		Exec(func(ct pgconn.CommandTag) error {
			if n := int(ct.RowsAffected()); n != len(os) {
				return fmt.Errorf("%w: %d of %d deliveries still as read", ErrOutcomeChanged, n, len(os))
			}
			return nil
		})
}

// paymentRow is a PaymentWrite with its state encoded.
type paymentRow struct {
	*PaymentWrite
	state string
}

// queuePaymentWrites queues the insert of new payments and the update of
// stored ones, which looks them up by key (queueKeyLookups).
func queuePaymentWrites(b *pgx.Batch, ps []PaymentWrite) error {
	if len(ps) == 0 {
		return nil
	}
	rows := make([]paymentRow, len(ps))
	news := 0
	for i := range ps {
		st, err := json.Marshal(ps[i].State)
		if err != nil {
			return fmt.Errorf("encode payment state: %w", err)
		}
		rows[i] = paymentRow{&ps[i], string(st)}
		if ps[i].New {
			news++
		}
	}
	var (
		key     = col(func(p paymentRow) string { return p.Key })
		status  = col(func(p paymentRow) string { return string(p.State.Status) })
		version = col(func(p paymentRow) int64 { return p.State.Version })
		amount  = col(func(p paymentRow) int64 { return p.State.AmountMinor })
		curr    = col(func(p paymentRow) string { return p.State.Currency })
		state   = col(func(p paymentRow) string { return p.state })
		last    = col(func(p paymentRow) *time.Time { return nullTime(p.LastEventAt) })
		isNew   = col(func(p paymentRow) bool { return p.New })
	)
	// New payments are inserted, stored ones updated in place (HOT: no
	// indexed column changes, and the table leaves room on each page): no
	// speculative insert. A payment created meanwhile by another writer
	// fails the insert (23505) and the batch is retried.
	if news > 0 {
		b.Queue(`
		INSERT INTO payments (payment_key, source, payment_id, status, version, amount_minor, currency, state, last_event_at)
		SELECT k, s, i, st, v, a, c, j, l
		  FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::bigint[], $6::bigint[], $7::text[], $8::json[], $9::timestamptz[], $10::bool[])
		       AS u(k, s, i, st, v, a, c, j, l, new)
		 WHERE new`,
			arrays(rows, key,
				col(func(p paymentRow) string { return p.Source }),
				col(func(p paymentRow) string { return p.PaymentID }),
				status, version, amount, curr, state, last, isNew)...)
	}
	if news == len(rows) {
		return nil
	}
	queueKeyLookups(b, true)
	b.Queue(`
		UPDATE payments p SET status = u.st, version = u.v, amount_minor = u.a, currency = u.c, state = u.j,
		       last_event_at = GREATEST(p.last_event_at, u.l), updated_at = now()
		  FROM unnest($1::text[], $2::text[], $3::bigint[], $4::bigint[], $5::text[], $6::json[], $7::timestamptz[], $8::bool[])
		       AS u(k, st, v, a, c, j, l, new)
		 WHERE p.payment_key = u.k AND NOT u.new`,
		arrays(rows, key, status, version, amount, curr, state, last, isNew)...)
	queueKeyLookups(b, false)
	return nil
}

// movementRow is a ledger movement of a transition.
type movementRow struct {
	t       *TransitionWrite
	ordinal int16
	ledger.Movement
}

func queueTransitions(b *pgx.Batch, ts []TransitionWrite) {
	if len(ts) == 0 {
		return
	}
	b.Queue(`
		INSERT INTO payment_transitions (payment_key, version, from_status, to_status, kind, amount_minor, currency, refund_id, delivery_id)
		SELECT k, v, f, t, kind, amt, cur, NULLIF(ref, ''), d
		  FROM unnest($1::text[], $2::bigint[], $3::text[], $4::text[], $5::text[], $6::bigint[], $7::text[], $8::text[], $9::bigint[])
		       AS u(k, v, f, t, kind, amt, cur, ref, d)`,
		arrays(ts,
			col(func(t TransitionWrite) string { return t.PaymentKey }),
			col(func(t TransitionWrite) int64 { return t.Version }),
			col(func(t TransitionWrite) string { return string(t.From) }),
			col(func(t TransitionWrite) string { return string(t.To) }),
			col(func(t TransitionWrite) string { return t.Kind }),
			col(func(t TransitionWrite) int64 { return t.AmountMinor }),
			col(func(t TransitionWrite) string { return t.Currency }),
			col(func(t TransitionWrite) string { return t.RefundID }),
			col(func(t TransitionWrite) int64 { return t.DeliveryID }))...)
	var ms []movementRow
	for i := range ts {
		for j, m := range ts[i].Movements {
			ms = append(ms, movementRow{&ts[i], int16(j), m})
		}
	}
	if len(ms) > 0 {
		b.Queue(`
			INSERT INTO ledger_movements (payment_key, version, movement, debit_account, credit_account, amount_minor, currency)
			SELECT * FROM unnest($1::text[], $2::bigint[], $3::smallint[], $4::text[], $5::text[], $6::bigint[], $7::text[])`,
			arrays(ms,
				col(func(m movementRow) string { return m.t.PaymentKey }),
				col(func(m movementRow) int64 { return m.t.Version }),
				col(func(m movementRow) int16 { return m.ordinal }),
				col(func(m movementRow) string { return m.Debit }),
				col(func(m movementRow) string { return m.Credit }),
				col(func(m movementRow) int64 { return m.AmountMinor }),
				col(func(m movementRow) string { return m.Currency }))...)
	}
}
