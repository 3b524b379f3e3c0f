package store

import (
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/paystream/paystream/internal/payment"
)

// Reads is what a batch transaction reads under its lock, in one round
// trip: what deciding its events needs.
//
// Nothing here locks a payment (no FOR UPDATE: it cost a WAL record and a
// buffer write per payment and batch). The caller holds the offset row
// lock of the partition the payments' records are consumed from
// (BatchLock), which every writer of a payment takes first and keeps until
// it commits:
//
//   - a partition's worker and its sweeper lock that partition's row and
//     check their owner epoch;
//   - replay, which runs outside the consumer group, locks every offset row
//     (BatchLock.AllPartitions), whatever partition the payment maps to;
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
type Reads struct {
	// IDs is how many fresh delivery ids to allocate (Loaded.IDs), so the
	// rows that reference a new delivery are written in the same round
	// trip as it.
	IDs int
	// Keys are dedup keys to look up (Loaded.Known).
	Keys []DedupKey
	// Payments are the payments to read, with their waiting deliveries
	// (Loaded.Payments).
	Payments []string
	// StillDeferred asks which of a payment's deliveries are still
	// deferred (Loaded.StillDeferred): the sweeper's, listed before its
	// refetch.
	StillDeferred DeliveryIDs
	// Held is a payment whose quarantined deliveries, and those deferred
	// while it was held, are read (Loaded.Held), with whether it is held
	// (Loaded.IsHeld): replay's.
	Held string
}

// DedupKey identifies an event: its source and dedup key.
type DedupKey struct {
	Source string
	Key    string
}

// DeliveryIDs are deliveries of one payment.
type DeliveryIDs struct {
	PaymentKey string
	IDs        []int64
}

// LoadedPayment is a payment as read.
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

// Loaded is what Reads read.
type Loaded struct {
	// IDs are fresh delivery ids, in allocation order.
	IDs []int64
	// Known are the dedup keys already stored, of those asked, with the id
	// of the first delivery of each.
	Known map[DedupKey]int64
	// Payments are the payments asked, by key.
	Payments map[string]*LoadedPayment
	// StillDeferred are the asked deliveries still deferred.
	StillDeferred map[int64]bool
	// Held are the held payment's quarantined deliveries and those
	// deferred while it was held, oldest first; IsHeld says whether it is
	// held.
	Held   []StoredDelivery
	IsHeld bool

	ids int // asked for
}

// queueReads queues r's statements on b; the result is filled once b is
// sent.
func queueReads(b *pgx.Batch, r Reads) *Loaded {
	out := &Loaded{Known: map[DedupKey]int64{}, Payments: map[string]*LoadedPayment{}, StillDeferred: map[int64]bool{}, ids: r.IDs}
	if r.IDs > 0 {
		b.Queue(`SELECT nextval('deliveries_id_seq') FROM generate_series(1, $1::int)`, r.IDs).Query(func(rows pgx.Rows) error {
			var id int64
			_, err := pgx.ForEachRow(rows, []any{&id}, func() error { out.IDs = append(out.IDs, id); return nil })
			return err
		})
	}
	if len(r.Keys) > 0 || len(r.Payments) > 0 {
		queueKeyLookups(b, true)
		if len(r.Keys) > 0 {
			queueKnownKeys(b, r.Keys, out.Known)
		}
		queuePayments(b, r.Payments, out.Payments) // turns key lookups off
	}
	if len(r.StillDeferred.IDs) > 0 {
		b.Queue(`SELECT id FROM deliveries WHERE payment_key = $1 AND id = ANY($2) AND status = 'deferred'`,
			r.StillDeferred.PaymentKey, r.StillDeferred.IDs).
			Query(func(rows pgx.Rows) error {
				var id int64
				_, err := pgx.ForEachRow(rows, []any{&id}, func() error { out.StillDeferred[id] = true; return nil })
				return err
			})
	}
	if r.Held != "" {
		queueHeld(b, r.Held, out)
	}
	return out
}

// check reports whether the sent statements returned what was asked.
func (l *Loaded) check() error {
	if len(l.IDs) != l.ids {
		return fmt.Errorf("allocate delivery ids: got %d, want %d", len(l.IDs), l.ids)
	}
	return nil
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

// queueKnownKeys queues the read of which of keys are stored, with their
// first delivery, into into. Key lookups must be on.
func queueKnownKeys(b *pgx.Batch, keys []DedupKey, into map[DedupKey]int64) {
	b.Queue(`
		SELECT k.source, k.dedup_key, k.delivery_id FROM dedup_keys k
		  JOIN unnest($1::text[], $2::text[]) AS u(source, dedup_key) ON k.source = u.source AND k.dedup_key = u.dedup_key`,
		arrays(keys,
			col(func(k DedupKey) string { return k.Source }),
			col(func(k DedupKey) string { return k.Key }))...).
		Query(func(rows pgx.Rows) error {
			var k DedupKey
			var first int64
			_, err := pgx.ForEachRow(rows, []any{&k.Source, &k.Key, &first}, func() error { into[k] = first; return nil })
			return err
		})
}

// queuePayments queues the read of the payments keys and of their waiting
// deliveries into into (an entry per key). Key lookups must be on; it
// turns them off.
func queuePayments(b *pgx.Batch, keys []string, into map[string]*LoadedPayment) {
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

// queueHeld queues the read of paymentKey's quarantined deliveries and
// those deferred while it was held, oldest first, and whether the payment
// is held.
func queueHeld(b *pgx.Batch, paymentKey string, into *Loaded) {
	b.Queue(`
		SELECT `+deliveryColumns+` FROM deliveries
		 WHERE payment_key = $1 AND status IN ('deferred', 'quarantined') AND (status = 'quarantined' OR reason = $2)
		 ORDER BY id`, paymentKey, ReasonPaymentHeld).Query(func(rows pgx.Rows) error {
		for rows.Next() {
			var d StoredDelivery
			if err := rows.Scan(d.scanTargets()...); err != nil {
				return err
			}
			into.Held = append(into.Held, d)
		}
		return rows.Err()
	})
	b.Queue(`SELECT true FROM payments WHERE payment_key = $1 AND held`, paymentKey).QueryRow(func(r pgx.Row) error {
		err := r.Scan(&into.IsHeld)
		if errors.Is(err, pgx.ErrNoRows) {
			return nil
		}
		return err
	})
}
