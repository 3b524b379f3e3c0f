package store

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/paystream/paystream/internal/envelope"
	"github.com/paystream/paystream/internal/payment"
	"github.com/paystream/paystream/internal/statelog"
)

// DedupKey identifies an event: its source and dedup key.
type DedupKey struct {
	Source string
	Key    string
}

// LoadedPayment is a payment as Load read it.
type LoadedPayment struct {
	Key string
	// Found is false for a payment not stored yet.
	Found bool
	State payment.State
	Held  bool
	// Waiting are its deferred deliveries that a transition may resume,
	// oldest first: not those of a held payment's hold (replay's) nor those
	// awaiting a refetch (the sweeper's).
	Waiting []StoredDelivery
}

// Loaded is what Load read. Its fields are filled when the pgx.Batch it
// was queued on is sent; then call Check.
type Loaded struct {
	// IDs are fresh delivery ids, in allocation order.
	IDs []int64
	// Known are the dedup keys already stored, of those asked, with the id
	// of the first delivery of each.
	Known map[DedupKey]int64
	// Payments are the payments asked, by key.
	Payments map[string]*LoadedPayment

	ids int // asked for
}

// Load reads what a batch decides on, in one round trip: it allocates ids
// for new deliveries, finds which of keys are stored already, and reads
// the payments with their waiting deliveries.
//
// Nothing here locks a payment: every writer of a payment holds its
// partition's offset row lock for its whole transaction (LockPartition,
// or LockAllPartitions for replay), which serializes them. See
// QueueLoadPayments.
func Load(ctx context.Context, tx pgx.Tx, ids int, keys []DedupKey, payments []string) (Loaded, error) {
	b := &pgx.Batch{}
	out := QueueLoad(b, ids, keys, payments)
	if err := tx.SendBatch(ctx, b).Close(); err != nil {
		return Loaded{}, fmt.Errorf("load batch: %w", err)
	}
	return *out, out.Check()
}

// QueueLoad queues Load's statements on b, so they can share a round trip
// with others (the partition's lock, queued before them). The result is
// filled once b is sent.
func QueueLoad(b *pgx.Batch, ids int, keys []DedupKey, payments []string) *Loaded {
	out := &Loaded{Known: map[DedupKey]int64{}, Payments: map[string]*LoadedPayment{}, ids: ids}
	if ids > 0 {
		b.Queue(`SELECT nextval('deliveries_id_seq') FROM generate_series(1, $1::int)`, ids).Query(func(rows pgx.Rows) error {
			var id int64
			_, err := pgx.ForEachRow(rows, []any{&id}, func() error { out.IDs = append(out.IDs, id); return nil })
			return err
		})
	}
	queueKeyLookups(b, true)
	if len(keys) > 0 {
		sources, dedups := make([]string, len(keys)), make([]string, len(keys))
		for i, k := range keys {
			sources[i], dedups[i] = k.Source, k.Key
		}
		b.Queue(`
			SELECT k.source, k.dedup_key, k.delivery_id FROM dedup_keys k
			  JOIN unnest($1::text[], $2::text[]) AS u(source, dedup_key) ON k.source = u.source AND k.dedup_key = u.dedup_key`,
			sources, dedups).Query(func(rows pgx.Rows) error {
			var k DedupKey
			var first int64
			_, err := pgx.ForEachRow(rows, []any{&k.Source, &k.Key, &first}, func() error { out.Known[k] = first; return nil })
			return err
		})
	}
	queueLoadPayments(b, payments, out.Payments)
	return out
}

// Lookups by key in dedup_keys and payments run with sequential scans off
// (enable_seqscan, switched off and on around them in the batch's
// pipeline), so the planner always takes the primary key. Without it:
//
//   - the plan cache's generic plan, made while those tables were nearly
//     empty (a new schema, a deployment's first minutes), kept a sequential
//     scan until autovacuum's next ANALYZE, and every batch compared its
//     keys with every row: in bench-e2e, 780 dedup_keys rows read per
//     delivery, half of Postgres's CPU;
//   - custom plans (plan_cache_mode force_custom_plan, tried next) planned
//     100 keys against some thousands of rows as a hash join over a
//     sequential scan, since the planner prices an index probe as a random
//     read from disk (random_page_cost) while the pages are in memory: 412
//     scans of dedup_keys in a bench-e2e run, 6 million rows, until the
//     table passed about 40,000 rows; 2 ms a batch where the key takes 0.5.
//     And they planned every batch again.
//
// With sequential scans off, the generic plan is the index lookup from the
// first batch on, at every size, and planned once per connection. A key
// lookup is an index lookup. The other statements keep the defaults.
func queueKeyLookups(b *pgx.Batch, on bool) {
	seqscan := "on"
	if on {
		seqscan = "off"
	}
	b.Queue(`SELECT set_config('enable_seqscan', $1, true)`, seqscan)
}

// Check reports whether the sent statements of l returned what was asked.
func (l *Loaded) Check() error {
	if len(l.IDs) != l.ids {
		return fmt.Errorf("allocate delivery ids: got %d, want %d", len(l.IDs), l.ids)
	}
	return nil
}

// QueueLoadPayments queues, on b, the read of the payments keys and of
// their waiting deliveries into into (an entry per key, created if
// missing).
//
// The read takes no row lock (no FOR UPDATE: it cost a WAL record and a
// buffer write per payment and batch). The caller must hold the offset row
// lock of the partition the payments' records are consumed from, which
// every writer of a payment takes first and keeps until it commits:
//
//   - a partition's worker and its sweeper lock that partition's row
//     (LockPartition) and check their owner epoch;
//   - replay, which runs outside the consumer group, locks every offset row
//     (LockAllPartitions), whatever partition the payment maps to;
//   - a payment's records all land on one partition (the key partitioner),
//     and the processor refuses to run when the partition count changed.
//
// So two transactions that write one payment never overlap, and each reads
// the payment, its hold and its waiting deliveries as the previous one
// committed them (each statement of a read-committed transaction takes a
// new snapshot, after the lock was granted). Were two writers ever to
// race anyway (two consumer groups on one schema), the barriers remain:
// both would write the same next (payment_key, version) transition, or the
// same new payment, or the same dedup key, and the second fails with a
// unique violation and is retried against the first one's result.
func QueueLoadPayments(b *pgx.Batch, keys []string, into map[string]*LoadedPayment) {
	queueKeyLookups(b, true)
	queueLoadPayments(b, keys, into)
}

// queueLoadPayments is QueueLoadPayments with key lookups already on.
func queueLoadPayments(b *pgx.Batch, keys []string, into map[string]*LoadedPayment) {
	for _, k := range keys {
		if into[k] == nil {
			into[k] = &LoadedPayment{Key: k}
		}
	}
	b.Queue(`SELECT payment_key, state, held FROM payments WHERE payment_key = ANY($1)`, keys).
		Query(func(rows pgx.Rows) error {
			var key string
			var st payment.State
			var held bool
			_, err := pgx.ForEachRow(rows, []any{&key, &st, &held}, func() error {
				p := into[key]
				p.Found, p.State, p.Held = true, st, held
				return nil
			})
			return err
		})
	queueKeyLookups(b, false)
	b.Queue(`
		SELECT `+deliveryColumns+` FROM deliveries
		 WHERE payment_key = ANY($1) AND status = 'deferred'
		   AND reason IS DISTINCT FROM $2 AND reason IS DISTINCT FROM $3
		 ORDER BY id`, keys, ReasonPaymentHeld, ReasonAwaitingRefetch).
		Query(func(rows pgx.Rows) error {
			for rows.Next() {
				var d StoredDelivery
				if err := rows.Scan(d.scanTargets()...); err != nil {
					return err
				}
				into[d.PaymentKey].Waiting = append(into[d.PaymentKey].Waiting, d)
			}
			return rows.Err()
		})
}

// Delivery is a record consumed from the raw topic, to be stored once with
// its outcome.
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

// Batch is every row a batch transaction writes once its decisions are
// made. Write sends them in one round trip.
type Batch struct {
	Deliveries  []Delivery
	Outcomes    []Outcome
	Payments    []PaymentWrite
	Transitions []TransitionWrite
	// Events are the state events, per payment in version order: emitted
	// as one state message (statelog.EncodeMessage).
	Events []statelog.Event
}

// Write writes b in tx in one round trip: dedup keys of first deliveries
// (the unique key is the deduplication: a key another transaction stored
// since Load read them fails the batch with a unique violation, and its
// retry sees a redelivery), deliveries, outcomes (ErrOutcomeChanged if a
// row was decided meanwhile), payment states, transitions, their ledger
// movements and the state events.
func Write(ctx context.Context, tx pgx.Tx, b *Batch) error {
	pb := &pgx.Batch{}
	if err := QueueWrite(pb, b); err != nil {
		return err
	}
	if pb.Len() == 0 {
		return nil
	}
	if err := tx.SendBatch(ctx, pb).Close(); err != nil {
		return fmt.Errorf("write batch: %w", err)
	}
	return nil
}

// QueueWrite queues Write's statements on pb, so they can share a round
// trip with others (the move of the partition's offset, queued after them).
func QueueWrite(pb *pgx.Batch, b *Batch) error {
	queueDeliveries(pb, b.Deliveries)
	queueOutcomes(pb, b.Outcomes)
	if err := queuePayments(pb, b.Payments); err != nil {
		return err
	}
	queueTransitions(pb, b.Transitions)
	if len(b.Events) > 0 {
		// One message, compressed, for all of the transaction's events.
		frame, err := statelog.EncodeMessage(b.Events)
		if err != nil {
			return err
		}
		pb.Queue(statelog.EmitMessageSQL, frame)
	}
	return nil
}

func queueDeliveries(b *pgx.Batch, ds []Delivery) {
	var (
		ids, offsets, dupIDs, dupOffsets, dupOf                   []int64
		recorded, received, dupRecorded, dupReceived              []time.Time
		sources, dedups, eventIDs, types, keys, statuses, reasons []string
		drivers, paymentIDs, factStatuses, currencies, refundIDs  []string
		amounts                                                   []*int64
		refetch                                                   []bool
		bodies                                                    [][]byte
		occurred, dupOccurred                                     []*time.Time
		dupSources, dupDedups, dupEventIDs, dupTypes, dupKeys     []string
		partitions, dupPartitions                                 []int32
		topic                                                     string
	)
	for _, d := range ds {
		// One topic (the raw topic), the partitions of the transaction's
		// batches.
		topic = d.Topic
		ev := d.Envelope.Event
		if d.Duplicate {
			dupIDs, dupOffsets, dupRecorded, dupReceived = append(dupIDs, d.ID), append(dupOffsets, d.Offset), append(dupRecorded, d.RecordedAt), append(dupReceived, d.Envelope.ReceivedAt)
			dupPartitions = append(dupPartitions, d.Partition)
			dupOf = append(dupOf, d.DuplicateOf)
			dupSources, dupDedups, dupEventIDs, dupTypes, dupKeys = append(dupSources, d.Envelope.Source), append(dupDedups, ev.DedupKey),
				append(dupEventIDs, ev.EventID), append(dupTypes, ev.Type), append(dupKeys, d.Envelope.PaymentKey)
			dupOccurred = append(dupOccurred, nullTime(ev.Fact.OccurredAt))
			continue
		}
		ids, offsets, recorded, received = append(ids, d.ID), append(offsets, d.Offset), append(recorded, d.RecordedAt), append(received, d.Envelope.ReceivedAt)
		partitions = append(partitions, d.Partition)
		sources, dedups, eventIDs, types, keys = append(sources, d.Envelope.Source), append(dedups, ev.DedupKey), append(eventIDs, ev.EventID),
			append(types, ev.Type), append(keys, d.Envelope.PaymentKey)
		statuses, reasons = append(statuses, d.Status), append(reasons, d.Reason)
		refetch, bodies, occurred = append(refetch, ev.NeedsRefetch), append(bodies, d.Envelope.Body), append(occurred, nullTime(ev.Fact.OccurredAt))
		// The normalized event is read back only for a deferred delivery
		// (a waiting event, the sweeper, replay): a delivery decided at
		// once keeps its body, and these columns stay NULL.
		if d.Status == StatusDeferred {
			amount := ev.Fact.AmountMinor
			drivers, paymentIDs, factStatuses, currencies, refundIDs = append(drivers, d.Envelope.Driver), append(paymentIDs, ev.PaymentID),
				append(factStatuses, string(ev.Fact.Status)), append(currencies, ev.Fact.Currency), append(refundIDs, ev.Fact.RefundID)
			amounts = append(amounts, &amount)
		} else {
			drivers, paymentIDs, factStatuses, currencies, refundIDs = append(drivers, ""), append(paymentIDs, ""), append(factStatuses, ""), append(currencies, ""), append(refundIDs, "")
			amounts = append(amounts, nil)
		}
	}
	if len(ids) > 0 {
		// A plain INSERT, not ON CONFLICT DO NOTHING: Load read which keys
		// are stored, so a conflict here is a first delivery another
		// transaction committed meanwhile; its unique violation (23505)
		// fails the batch, whose retry sees a duplicate. A speculative
		// insert would cost a confirmation WAL record per row.
		b.Queue(`
			INSERT INTO dedup_keys (source, dedup_key, delivery_id, recorded_at)
			SELECT * FROM unnest($1::text[], $2::text[], $3::bigint[], $4::timestamptz[])`, sources, dedups, ids, recorded)
		b.Queue(`
			INSERT INTO deliveries (id, recorded_at, source, dedup_key, event_id, event_type, payment_key, status, reason,
			                        driver, payment_id, fact_status, amount_minor, currency, refund_id, needs_refetch, body,
			                        topic, partition, kafka_offset, occurred_at, received_at)
			SELECT u.id, u.recorded_at, u.source, u.dedup_key, NULLIF(u.event_id, ''), u.event_type, u.payment_key, u.status, NULLIF(u.reason, ''),
			       NULLIF(u.driver, ''), NULLIF(u.payment_id, ''), NULLIF(u.fact_status, ''), u.amount_minor, NULLIF(u.currency, ''), NULLIF(u.refund_id, ''), u.refetch, u.body,
			       $1, u.partition, u.kafka_offset, u.occurred_at, u.received_at
			  FROM unnest($3::bigint[], $4::timestamptz[], $5::text[], $6::text[], $7::text[], $8::text[], $9::text[], $10::text[], $11::text[],
			              $12::text[], $13::text[], $14::text[], $15::bigint[], $16::text[], $17::text[], $18::bool[], $19::bytea[],
			              $2::int[], $20::bigint[], $21::timestamptz[], $22::timestamptz[])
			       AS u(id, recorded_at, source, dedup_key, event_id, event_type, payment_key, status, reason,
			            driver, payment_id, fact_status, amount_minor, currency, refund_id, refetch, body, partition, kafka_offset, occurred_at, received_at)`,
			topic, partitions, ids, recorded, sources, dedups, eventIDs, types, keys, statuses, reasons,
			drivers, paymentIDs, factStatuses, amounts, currencies, refundIDs, refetch, bodies, offsets, occurred, received)
	}
	if len(dupIDs) > 0 {
		b.Queue(`
			INSERT INTO deliveries (id, recorded_at, source, dedup_key, event_id, event_type, payment_key, status, reason, duplicate_of,
			                        topic, partition, kafka_offset, occurred_at, received_at)
			SELECT u.id, u.recorded_at, u.source, u.dedup_key, NULLIF(u.event_id, ''), u.event_type, u.payment_key, 'ignored', $3, u.duplicate_of,
			       $1, u.partition, u.kafka_offset, u.occurred_at, u.received_at
			  FROM unnest($4::bigint[], $5::timestamptz[], $6::text[], $7::text[], $8::text[], $9::text[], $10::text[], $11::bigint[],
			              $2::int[], $12::bigint[], $13::timestamptz[], $14::timestamptz[])
			       AS u(id, recorded_at, source, dedup_key, event_id, event_type, payment_key, duplicate_of, partition, kafka_offset, occurred_at, received_at)`,
			topic, dupPartitions, ReasonDuplicateEvent, dupIDs, dupRecorded, dupSources, dupDedups, dupEventIDs, dupTypes, dupKeys, dupOf, dupOffsets,
			dupOccurred, dupReceived)
	}
}

func queueOutcomes(b *pgx.Batch, os []Outcome) {
	if len(os) == 0 {
		return
	}
	ids, keys, statuses, reasons, expected := make([]int64, len(os)), make([]string, len(os)), make([]string, len(os)), make([]string, len(os)), make([]string, len(os))
	for i, o := range os {
		ids[i], keys[i], statuses[i], reasons[i], expected[i] = o.ID, o.PaymentKey, o.Status, o.Reason, o.Expected
	}
	b.Queue(`
		UPDATE deliveries d SET status = u.status, reason = NULLIF(u.reason, ''), attempts = d.attempts + 1, processed_at = now()
		  FROM unnest($1::bigint[], $2::text[], $3::text[], $4::text[], $5::text[]) AS u(id, payment_key, status, reason, expected)
		 WHERE d.payment_key = u.payment_key AND d.id = u.id AND d.status IN ('deferred', 'quarantined') AND d.status = u.expected`,
		ids, keys, statuses, reasons, expected).
		Exec(func(ct pgconn.CommandTag) error {
			if n := int(ct.RowsAffected()); n != len(os) {
				return fmt.Errorf("%w: %d of %d deliveries still as read", ErrOutcomeChanged, n, len(os))
			}
			return nil
		})
}

// queuePayments queues the insert of new payments and the update of
// stored ones, which looks them up by key (queueKeyLookups).
func queuePayments(b *pgx.Batch, ps []PaymentWrite) error {
	var (
		keys, sources, ids, statuses, currencies, states []string
		versions, amounts                                []int64
		lastEvents                                       []*time.Time
		fresh                                            []bool
	)
	for _, p := range ps {
		st, err := json.Marshal(p.State)
		if err != nil {
			return fmt.Errorf("encode payment state: %w", err)
		}
		keys, sources, ids, statuses, currencies, states = append(keys, p.Key), append(sources, p.Source), append(ids, p.PaymentID),
			append(statuses, string(p.State.Status)), append(currencies, p.State.Currency), append(states, string(st))
		versions, amounts, lastEvents, fresh = append(versions, p.State.Version), append(amounts, p.State.AmountMinor), append(lastEvents, nullTime(p.LastEventAt)), append(fresh, p.New)
	}
	if len(keys) == 0 {
		return nil
	}
	// New payments are inserted, stored ones updated in place (HOT: no
	// indexed column changes, and the table leaves room on each page): no
	// speculative insert. A payment created meanwhile by another writer
	// fails the insert (23505) and the batch is retried.
	news := 0
	for _, f := range fresh {
		if f {
			news++
		}
	}
	if news > 0 {
		b.Queue(`
		INSERT INTO payments (payment_key, source, payment_id, status, version, amount_minor, currency, state, last_event_at)
		SELECT k, s, i, st, v, a, c, j, l
		  FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::bigint[], $6::bigint[], $7::text[], $8::json[], $9::timestamptz[], $10::bool[])
		       AS u(k, s, i, st, v, a, c, j, l, new)
		 WHERE new`,
			keys, sources, ids, statuses, versions, amounts, currencies, states, lastEvents, fresh)
	}
	if news == len(keys) {
		return nil
	}
	queueKeyLookups(b, true)
	b.Queue(`
		UPDATE payments p SET status = u.st, version = u.v, amount_minor = u.a, currency = u.c, state = u.j,
		       last_event_at = GREATEST(p.last_event_at, u.l), updated_at = now()
		  FROM unnest($1::text[], $2::text[], $3::bigint[], $4::bigint[], $5::text[], $6::json[], $7::timestamptz[], $8::bool[])
		       AS u(k, st, v, a, c, j, l, new)
		 WHERE p.payment_key = u.k AND NOT u.new`,
		keys, statuses, versions, amounts, currencies, states, lastEvents, fresh)
	queueKeyLookups(b, false)
	return nil
}

func queueTransitions(b *pgx.Batch, ts []TransitionWrite) {
	if len(ts) == 0 {
		return
	}
	n := len(ts)
	keys, froms, tos, kinds, currencies, refunds := make([]string, n), make([]string, n), make([]string, n), make([]string, n), make([]string, n), make([]string, n)
	versions, amounts, deliveries := make([]int64, n), make([]int64, n), make([]int64, n)
	var (
		mKeys, mDebits, mCredits, mCurrencies []string
		mVersions, mAmounts                   []int64
		mOrdinals                             []int16
	)
	for i, t := range ts {
		keys[i], froms[i], tos[i], kinds[i], currencies[i], refunds[i] = t.PaymentKey, string(t.From), string(t.To), t.Kind, t.Currency, t.RefundID
		versions[i], amounts[i], deliveries[i] = t.Version, t.AmountMinor, t.DeliveryID
		for j, m := range t.Movements {
			mKeys, mDebits, mCredits, mCurrencies = append(mKeys, t.PaymentKey), append(mDebits, m.Debit), append(mCredits, m.Credit), append(mCurrencies, m.Currency)
			mVersions, mAmounts, mOrdinals = append(mVersions, t.Version), append(mAmounts, m.AmountMinor), append(mOrdinals, int16(j))
		}
	}
	b.Queue(`
		INSERT INTO payment_transitions (payment_key, version, from_status, to_status, kind, amount_minor, currency, refund_id, delivery_id)
		SELECT k, v, f, t, kind, amt, cur, NULLIF(ref, ''), d
		  FROM unnest($1::text[], $2::bigint[], $3::text[], $4::text[], $5::text[], $6::bigint[], $7::text[], $8::text[], $9::bigint[])
		       AS u(k, v, f, t, kind, amt, cur, ref, d)`,
		keys, versions, froms, tos, kinds, amounts, currencies, refunds, deliveries)
	if len(mKeys) > 0 {
		b.Queue(`
			INSERT INTO ledger_movements (payment_key, version, movement, debit_account, credit_account, amount_minor, currency)
			SELECT * FROM unnest($1::text[], $2::bigint[], $3::smallint[], $4::text[], $5::text[], $6::bigint[], $7::text[])`,
			mKeys, mVersions, mOrdinals, mDebits, mCredits, mAmounts, mCurrencies)
	}
}
