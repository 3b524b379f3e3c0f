package processor

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/paystream/paystream/internal/envelope"
	"github.com/paystream/paystream/internal/payment"
)

// Inbox reasons the processor itself assigns (the machine assigns the rest).
const (
	reasonDuplicateEvent  = "duplicate_event"
	reasonPaymentHeld     = "payment_held"
	reasonAwaitingRefetch = "awaiting_refetch"
)

// outcomeQuarantined is the inbox status of a record that failed deterministically.
const outcomeQuarantined = "quarantined"

// result is what applying one record did, for metrics.
type result struct {
	source  string
	outcome string
	reason  string
}

// applier turns records into their effects inside a batch transaction.
type applier struct {
	machine payment.Machine
	now     func() time.Time
	// idleTimeout is the batch transactions' idle_in_transaction_session_timeout
	// (0: the server's setting).
	idleTimeout time.Duration
}

// delivery is one decoded record and what became of it.
type delivery struct {
	rec *kgo.Record
	env envelope.Raw
	// inboxID is the inbox row's id. A record's row is inserted with an id
	// allocated beforehand (loadDeliveries), so the rows that reference it
	// are written in the same pipeline.
	inboxID int64
	// duplicate marks a redelivery of an event already in the inbox.
	duplicate bool
	// refetched, when not nil, are the facts the gateway's API asserted
	// for the payment: applied instead of the webhook's own fact.
	refetched []payment.Fact
	// status is, for an inbox row already (replay, sweeper), its status as
	// the caller read it: the row's new outcome is written only if it still
	// has it (see ErrOutcomeChanged).
	status string
}

// waiting is a deferred inbox event that may apply after a transition.
type waiting struct {
	inboxID int64
	eventID string
	fact    payment.Fact
}

// paymentRow is a payment read FOR UPDATE, then advanced in memory.
type paymentRow struct {
	key       string
	source    string
	paymentID string
	held      bool
	state     payment.State
	changed   bool
	lastEvent time.Time
	waiting   []waiting
}

// writes are the rows a batch writes once its decisions are made.
type writes struct {
	inboxAt      map[int64]int // index of an inbox id in inboxIDs
	inboxIDs     []int64       // inbox ids decided, of new rows and existing ones
	inboxStatus  []string
	inboxReason  []string
	trKey        []string
	trVersion    []int64
	trFrom       []string
	trTo         []string
	trKind       []string
	trAmount     []int64
	trCurrency   []string
	trRefundID   []string
	trInboxID    []int64
	postKey      []string
	postVersion  []int64
	postAccount  []string
	postAmount   []int64
	postCurrency []string
	outKey       []string
	outVersion   []int64
	outEventID   []string
	outPayload   []string
}

// applyBatch applies recs (one partition's, in offset order, all at or past
// the stored offset) inside tx with a fixed number of round trips whatever
// the batch size: one pipeline allocates the inbox ids of the records, finds
// which deliveries are redeliveries, locks the payments involved and loads
// their deferred events; the machine then decides every event in memory, in
// offset order; a second pipeline
// inserts the inbox rows with their final outcome — the unique key on
// (source, dedup_key) is the deduplication: a first delivery that conflicts
// fails the batch, which is retried — and writes the transitions, ledger
// postings, outbox events and payment states. Each inbox row is written
// once, never inserted and then updated.
//
// A record that cannot be applied deterministically (undecodable, an
// invalid fact, a value Postgres refuses) fails the call with a poison
// error; the caller then retries record by record under savepoints to
// quarantine just that record.
func (a *applier) applyBatch(ctx context.Context, tx pgx.Tx, recs []*kgo.Record, refetched map[int64][]payment.Fact) ([]result, error) {
	ds := make([]delivery, len(recs))
	for i, rec := range recs {
		env, err := envelope.DecodeRaw(rec.Value)
		if err != nil {
			return nil, poison("decode record at offset %d: %w", rec.Offset, err)
		}
		ds[i] = delivery{rec: rec, env: env, refetched: refetched[rec.Offset]}
	}
	payments, err := a.loadDeliveries(ctx, tx, ds)
	if err != nil {
		return nil, err
	}
	return a.decide(ctx, tx, ds, payments)
}

// decide runs the machine over deliveries, in order, against their locked
// payments, and writes what it decided. It is shared by batches, replays and
// the refetch sweeper (whose deliveries are inbox rows already).
func (a *applier) decide(ctx context.Context, tx pgx.Tx, ds []delivery, payments map[string]*paymentRow) ([]result, error) {
	var w writes
	results := make([]result, 0, len(ds))
	for i := range ds {
		d := &ds[i]
		if d.duplicate {
			results = append(results, result{d.env.Source, string(payment.OutcomeIgnored), reasonDuplicateEvent})
			continue
		}
		p := payments[d.env.PaymentKey]
		ev := d.env.Event
		if p.held {
			w.inbox(d.inboxID, payment.OutcomeDeferred, reasonPaymentHeld)
			results = append(results, result{d.env.Source, string(payment.OutcomeDeferred), reasonPaymentHeld})
			continue
		}
		if ev.NeedsRefetch && d.refetched == nil {
			// The body is thin or unsigned: no money moves on it until the
			// payment's state is refetched from the gateway.
			w.inbox(d.inboxID, payment.OutcomeDeferred, reasonAwaitingRefetch)
			results = append(results, result{d.env.Source, string(payment.OutcomeDeferred), reasonAwaitingRefetch})
			continue
		}
		facts := []payment.Fact{ev.Fact}
		if d.refetched != nil {
			facts = d.refetched
		}
		// The inbox outcome is the first applied decision's, else the
		// first one's (a refetch asserting nothing new is a duplicate).
		var first *payment.Decision
		applied := false
		for _, f := range facts {
			dec := a.machine.Apply(p.state, f)
			if dec.Outcome == payment.OutcomeIgnored && dec.Reason == payment.ReasonInvalidFact {
				return nil, poison("event %s (%s): invalid fact", ev.EventID, ev.Type)
			}
			if first == nil || (dec.Outcome == payment.OutcomeApplied && !applied) {
				first = &dec
			}
			if dec.Outcome != payment.OutcomeApplied {
				continue
			}
			applied = true
			if err := a.transition(&w, p, d.inboxID, ev.EventID, f, dec); err != nil {
				return nil, err
			}
		}
		if first == nil {
			first = &payment.Decision{Outcome: payment.OutcomeIgnored, Reason: payment.ReasonDuplicateFact}
		}
		w.inbox(d.inboxID, first.Outcome, first.Reason)
		results = append(results, result{d.env.Source, string(first.Outcome), first.Reason})
		if !applied {
			if first.Outcome == payment.OutcomeDeferred && d.refetched == nil {
				p.waiting = append(p.waiting, waiting{d.inboxID, ev.EventID, ev.Fact})
			}
			continue
		}
		// Deferred events whose predecessor just arrived apply now, in
		// this same transaction.
		if len(p.waiting) == 0 {
			continue
		}
		waitingFacts := make([]payment.Fact, len(p.waiting))
		for j, wt := range p.waiting {
			waitingFacts[j] = wt.fact
		}
		settled := a.machine.Resume(p.state, waitingFacts)
		done := make([]bool, len(p.waiting))
		for _, r := range settled.Resumed {
			wt := p.waiting[r.Index]
			done[r.Index] = true
			w.inbox(wt.inboxID, r.Decision.Outcome, r.Decision.Reason)
			results = append(results, result{d.env.Source, string(r.Decision.Outcome), r.Decision.Reason})
			if r.Decision.Outcome == payment.OutcomeApplied {
				if err := a.transition(&w, p, wt.inboxID, wt.eventID, wt.fact, r.Decision); err != nil {
					return nil, err
				}
			}
		}
		kept := p.waiting[:0]
		for j, wt := range p.waiting {
			if !done[j] {
				kept = append(kept, wt)
			}
		}
		p.waiting = kept
	}
	if err := a.write(ctx, tx, &w, ds, payments); err != nil {
		return nil, err
	}
	return results, nil
}

// loadDeliveries allocates an inbox id for each of ds, marks the
// redeliveries among them (their (source, dedup_key) is in the inbox
// already, or earlier in the batch) and returns the payments of ds, locked,
// with their deferred events. One round trip.
//
// The ids come from the inbox's own sequence, in offset order, so inbox id
// order stays arrival order. Rows never refer to an inbox row by its Kafka
// position, which is not unique: a second consumer group reads the same
// records, and a recreated topic reuses offsets.
func (a *applier) loadDeliveries(ctx context.Context, tx pgx.Tx, ds []delivery) (map[string]*paymentRow, error) {
	n := len(ds)
	sources, dedups := make([]string, n), make([]string, n)
	var paymentKeys []string
	payments := map[string]*paymentRow{}
	for i := range ds {
		d := &ds[i]
		sources[i], dedups[i] = d.env.Source, d.env.Event.DedupKey
		if payments[d.env.PaymentKey] == nil {
			payments[d.env.PaymentKey] = &paymentRow{key: d.env.PaymentKey, source: d.env.Source, paymentID: d.env.Event.PaymentID}
			paymentKeys = append(paymentKeys, d.env.PaymentKey)
		}
	}
	type dedupKey struct{ source, key string }
	known := map[dedupKey]bool{}
	ids := make([]int64, 0, n)
	b := &pgx.Batch{}
	b.Queue(`SELECT nextval(pg_get_serial_sequence('inbox', 'id')) FROM generate_series(1, $1::int)`, n).
		Query(func(rows pgx.Rows) error {
			for rows.Next() {
				var id int64
				if err := rows.Scan(&id); err != nil {
					return err
				}
				ids = append(ids, id)
			}
			return rows.Err()
		})
	b.Queue(`
		SELECT f.source, f.dedup_key FROM inbox f
		  JOIN unnest($1::text[], $2::text[]) AS u(source, dedup_key) ON f.source = u.source AND f.dedup_key = u.dedup_key
		 WHERE f.duplicate_of IS NULL`, sources, dedups).Query(func(rows pgx.Rows) error {
		for rows.Next() {
			var k dedupKey
			if err := rows.Scan(&k.source, &k.key); err != nil {
				return err
			}
			known[k] = true
		}
		return rows.Err()
	})
	queueLoadPayments(b, paymentKeys, payments)
	if err := tx.SendBatch(ctx, b).Close(); err != nil {
		return nil, fmt.Errorf("load deliveries: %w", err)
	}
	if len(ids) != n {
		return nil, fmt.Errorf("allocate inbox ids: got %d, want %d", len(ids), n)
	}
	for i := range ds {
		d := &ds[i]
		k := dedupKey{d.env.Source, d.env.Event.DedupKey}
		d.duplicate = known[k]
		known[k] = true
		d.inboxID = ids[i]
	}
	return payments, nil
}

// errDedupRace fails a batch whose pre-read missed a first delivery that
// another transaction inserted meanwhile; the retry sees it as a duplicate.
var errDedupRace = errors.New("inbox: a first delivery was inserted concurrently; retrying the batch")

// queueNewDeliveries queues the inserts of the batch's deliveries: first
// deliveries with the outcome decide gave them, then redeliveries as
// ignored duplicates pointing at the first. The unique key decides: if a
// first delivery conflicts, the batch fails with errDedupRace.
func queueNewDeliveries(b *pgx.Batch, w *writes, ds []delivery) error {
	var (
		sources, dedups, eventIDs, types, keys, facts, statuses, reasons []string
		payloads                                                         [][]byte
		ids, offsets                                                     []int64
		occurred                                                         []*time.Time
		received                                                         []time.Time
		dupSources, dupDedups, dupEventIDs, dupTypes, dupKeys            []string
		dupIDs, dupOffsets                                               []int64
		dupOccurred                                                      []*time.Time
		dupReceived                                                      []time.Time
	)
	for i := range ds {
		d := &ds[i]
		if d.rec == nil {
			continue // an inbox row already (replay, sweeper)
		}
		ev := d.env.Event
		if d.duplicate {
			dupSources, dupDedups, dupEventIDs, dupTypes, dupKeys = append(dupSources, d.env.Source), append(dupDedups, ev.DedupKey),
				append(dupEventIDs, ev.EventID), append(dupTypes, ev.Type), append(dupKeys, d.env.PaymentKey)
			dupIDs, dupOffsets, dupOccurred, dupReceived = append(dupIDs, d.inboxID), append(dupOffsets, d.rec.Offset), append(dupOccurred, nullTime(ev.Fact.OccurredAt)), append(dupReceived, d.env.ReceivedAt)
			continue
		}
		at, ok := w.inboxAt[d.inboxID]
		if !ok {
			return fmt.Errorf("inbox event at offset %d has no outcome", d.rec.Offset)
		}
		fact, err := json.Marshal(ev.Fact)
		if err != nil {
			return poison("encode fact: %w", err)
		}
		sources, dedups, eventIDs, types, keys = append(sources, d.env.Source), append(dedups, ev.DedupKey), append(eventIDs, ev.EventID),
			append(types, ev.Type), append(keys, d.env.PaymentKey)
		facts, statuses, reasons = append(facts, string(fact)), append(statuses, w.inboxStatus[at]), append(reasons, w.inboxReason[at])
		ids, payloads, offsets, occurred, received = append(ids, d.inboxID), append(payloads, d.rec.Value), append(offsets, d.rec.Offset), append(occurred, nullTime(ev.Fact.OccurredAt)), append(received, d.env.ReceivedAt)
	}
	topic, partition := topicOf(ds), partitionOf(ds)
	if len(offsets) > 0 {
		want := len(offsets)
		b.Queue(`
			INSERT INTO inbox (id, source, dedup_key, event_id, event_type, payment_key, status, reason, attempts, fact, payload,
			                   topic, partition, kafka_offset, occurred_at, received_at)
			SELECT u.id, u.source, u.dedup_key, NULLIF(u.event_id, ''), u.event_type, u.payment_key, u.status, NULLIF(u.reason, ''), 1,
			       u.fact::jsonb, u.payload, $1, $2, u.kafka_offset, u.occurred_at, u.received_at
			  FROM unnest($3::text[], $4::text[], $5::text[], $6::text[], $7::text[], $8::text[], $9::text[], $10::text[], $11::bytea[],
			              $12::bigint[], $13::timestamptz[], $14::timestamptz[], $15::bigint[])
			       AS u(source, dedup_key, event_id, event_type, payment_key, status, reason, fact, payload, kafka_offset, occurred_at, received_at, id)
			 ORDER BY u.kafka_offset
			ON CONFLICT (source, dedup_key) WHERE duplicate_of IS NULL DO NOTHING`,
			topic, partition, sources, dedups, eventIDs, types, keys, statuses, reasons, facts, payloads, offsets, occurred, received, ids,
		).Exec(func(ct pgconn.CommandTag) error {
			if int(ct.RowsAffected()) != want {
				return errDedupRace
			}
			return nil
		})
	}
	if len(dupOffsets) > 0 {
		b.Queue(`
			INSERT INTO inbox (id, source, dedup_key, event_id, event_type, payment_key, status, reason, duplicate_of,
			                   topic, partition, kafka_offset, occurred_at, received_at)
			SELECT u.id, u.source, u.dedup_key, NULLIF(u.event_id, ''), u.event_type, u.payment_key, 'ignored', $11, f.id,
			       $1, $2, u.kafka_offset, u.occurred_at, u.received_at
			  FROM unnest($3::text[], $4::text[], $5::text[], $6::text[], $7::text[], $8::bigint[], $9::timestamptz[], $10::timestamptz[], $12::bigint[])
			       AS u(source, dedup_key, event_id, event_type, payment_key, kafka_offset, occurred_at, received_at, id)
			  JOIN inbox f ON f.source = u.source AND f.dedup_key = u.dedup_key AND f.duplicate_of IS NULL
			 ORDER BY u.kafka_offset`,
			topic, partition, dupSources, dupDedups, dupEventIDs, dupTypes, dupKeys, dupOffsets, dupOccurred, dupReceived, reasonDuplicateEvent, dupIDs).
			Exec(func(ct pgconn.CommandTag) error {
				// A first delivery this pipeline did not see (it was
				// not committed when the batch looked) is missing.
				if int(ct.RowsAffected()) != len(dupIDs) {
					return errDedupRace
				}
				return nil
			})
	}
	return nil
}

func topicOf(ds []delivery) string {
	for _, d := range ds {
		if d.rec != nil {
			return d.rec.Topic
		}
	}
	return ""
}

func partitionOf(ds []delivery) int32 {
	for _, d := range ds {
		if d.rec != nil {
			return d.rec.Partition
		}
	}
	return 0
}

// queueLoadPayments queues, on b, the locking read of the payments in keys
// (entries of payments, which must exist) and of their deferred events.
// Events of a held payment wait for replay, and events awaiting a refetch
// for the sweeper: neither is re-offered here (a thin event's own fact must
// never apply).
func queueLoadPayments(b *pgx.Batch, keys []string, payments map[string]*paymentRow) {
	b.Queue(`SELECT payment_key, state, held FROM payments WHERE payment_key = ANY($1) ORDER BY payment_key FOR UPDATE`, keys).
		Query(func(rows pgx.Rows) error {
			for rows.Next() {
				var key string
				var st payment.State
				var held bool
				if err := rows.Scan(&key, &st, &held); err != nil {
					return err
				}
				p := payments[key]
				p.state, p.held = st, held
			}
			return rows.Err()
		})
	b.Queue(`
		SELECT id, payment_key, COALESCE(event_id, ''), fact FROM inbox
		 WHERE payment_key = ANY($1) AND status = 'deferred' AND reason IS DISTINCT FROM $2 AND reason IS DISTINCT FROM $3
		 ORDER BY id`, keys, reasonPaymentHeld, reasonAwaitingRefetch).
		Query(func(rows pgx.Rows) error {
			for rows.Next() {
				var wt waiting
				var key string
				if err := rows.Scan(&wt.inboxID, &key, &wt.eventID, &wt.fact); err != nil {
					return err
				}
				payments[key].waiting = append(payments[key].waiting, wt)
			}
			return rows.Err()
		})
}

// transition queues the rows of an applied decision and advances p.
func (a *applier) transition(w *writes, p *paymentRow, inboxID int64, eventID string, fact payment.Fact, dec payment.Decision) error {
	if len(dec.Transitions) == 0 {
		return poison("machine applied a fact without a transition")
	}
	now := a.now().UTC()
	for _, t := range dec.Transitions {
		w.trKey = append(w.trKey, p.key)
		w.trVersion = append(w.trVersion, t.Version)
		w.trFrom = append(w.trFrom, string(t.From))
		w.trTo = append(w.trTo, string(t.To))
		w.trKind = append(w.trKind, t.Kind)
		w.trAmount = append(w.trAmount, t.AmountMinor)
		w.trCurrency = append(w.trCurrency, t.Currency)
		w.trRefundID = append(w.trRefundID, t.RefundID)
		w.trInboxID = append(w.trInboxID, inboxID)
		for _, ps := range t.Postings {
			w.postKey = append(w.postKey, p.key)
			w.postVersion = append(w.postVersion, t.Version)
			w.postAccount = append(w.postAccount, ps.Account)
			w.postAmount = append(w.postAmount, ps.AmountMinor)
			w.postCurrency = append(w.postCurrency, ps.Currency)
		}
		ev := envelope.State{
			EventID:        envelope.StateEventID(p.key, t.Version),
			PaymentKey:     p.key,
			Source:         p.source,
			PaymentID:      p.paymentID,
			Version:        t.Version,
			Status:         t.To,
			PreviousStatus: t.From,
			Kind:           t.Kind,
			AmountMinor:    t.AmountMinor,
			Currency:       t.Currency,
			RefundID:       t.RefundID,
			Payment:        dec.State,
			SourceEventID:  eventID,
			OccurredAt:     fact.OccurredAt,
			RecordedAt:     now,
		}
		payload, err := json.Marshal(ev)
		if err != nil {
			return poison("encode state event: %w", err)
		}
		w.outKey = append(w.outKey, p.key)
		w.outVersion = append(w.outVersion, t.Version)
		w.outEventID = append(w.outEventID, ev.EventID)
		w.outPayload = append(w.outPayload, string(payload))
	}
	p.state = dec.State
	p.changed = true
	if fact.OccurredAt.After(p.lastEvent) {
		p.lastEvent = fact.OccurredAt
	}
	return nil
}

// inbox records an inbox row's outcome. An event deferred and then applied
// by a later event of the same batch is decided twice; the last decision is
// the one written (an UPDATE ... FROM with two rows for one id would pick
// either).
func (w *writes) inbox(id int64, outcome payment.Outcome, reason string) {
	if i, ok := w.inboxAt[id]; ok {
		w.inboxStatus[i], w.inboxReason[i] = string(outcome), reason
		return
	}
	if w.inboxAt == nil {
		w.inboxAt = map[int64]int{}
	}
	w.inboxAt[id] = len(w.inboxIDs)
	w.inboxIDs = append(w.inboxIDs, id)
	w.inboxStatus = append(w.inboxStatus, string(outcome))
	w.inboxReason = append(w.inboxReason, reason)
}

// write sends every row the batch decided on in one pipeline: the inbox
// rows of new deliveries (with their outcome), the outcomes of inbox rows
// decided again, payment states, transitions, postings and outbox events.
func (a *applier) write(ctx context.Context, tx pgx.Tx, w *writes, ds []delivery, payments map[string]*paymentRow) error {
	b := &pgx.Batch{}
	if err := queueNewDeliveries(b, w, ds); err != nil {
		return err
	}
	inserted := map[int64]bool{} // the rows queueNewDeliveries writes, with their outcome
	for _, d := range ds {
		if d.rec != nil {
			inserted[d.inboxID] = true
		}
	}
	// An existing row's outcome is written only if the row still has the
	// status it was read with: the deliveries' own (replay, sweeper), else
	// deferred (a waiting event loaded under its payment's lock).
	expected := map[int64]string{}
	for _, d := range ds {
		if d.rec == nil {
			expected[d.inboxID] = d.status
		}
	}
	var updIDs []int64
	var updStatus, updReason, updExpected []string
	for i, id := range w.inboxIDs {
		if !inserted[id] {
			exp, ok := expected[id]
			if !ok {
				exp = string(payment.OutcomeDeferred)
			}
			updIDs, updStatus, updReason = append(updIDs, id), append(updStatus, w.inboxStatus[i]), append(updReason, w.inboxReason[i])
			updExpected = append(updExpected, exp)
		}
	}
	if len(updIDs) > 0 {
		b.Queue(`
			UPDATE inbox SET status = u.status, reason = NULLIF(u.reason, ''), attempts = attempts + 1, processed_at = now()
			  FROM unnest($1::bigint[], $2::text[], $3::text[], $4::text[]) AS u(id, status, reason, expected)
			 WHERE inbox.id = u.id AND inbox.status = u.expected`, updIDs, updStatus, updReason, updExpected).
			Exec(func(ct pgconn.CommandTag) error {
				if n := int(ct.RowsAffected()); n != len(updIDs) {
					return fmt.Errorf("%w: %d of %d inbox rows still as read", ErrOutcomeChanged, n, len(updIDs))
				}
				return nil
			})
	}
	var (
		keys, sources, ids, statuses, currencies, states []string
		versions, amounts                                []int64
		lastEvents                                       []*time.Time
	)
	for _, p := range payments {
		if !p.changed {
			continue
		}
		st, err := json.Marshal(p.state)
		if err != nil {
			return poison("encode payment state: %w", err)
		}
		keys, sources, ids = append(keys, p.key), append(sources, p.source), append(ids, p.paymentID)
		statuses, currencies, states = append(statuses, string(p.state.Status)), append(currencies, p.state.Currency), append(states, string(st))
		versions, amounts, lastEvents = append(versions, p.state.Version), append(amounts, p.state.AmountMinor), append(lastEvents, nullTime(p.lastEvent))
	}
	if len(keys) > 0 {
		b.Queue(`
			INSERT INTO payments (payment_key, source, payment_id, status, version, amount_minor, currency, state, last_event_at)
			SELECT * FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::bigint[], $6::bigint[], $7::text[], $8::jsonb[], $9::timestamptz[])
			ON CONFLICT (payment_key) DO UPDATE
			   SET status = EXCLUDED.status, version = EXCLUDED.version, amount_minor = EXCLUDED.amount_minor,
			       currency = EXCLUDED.currency, state = EXCLUDED.state,
			       last_event_at = GREATEST(payments.last_event_at, EXCLUDED.last_event_at), updated_at = now()`,
			keys, sources, ids, statuses, versions, amounts, currencies, states, lastEvents)
	}
	if len(w.trKey) > 0 {
		b.Queue(`
			INSERT INTO payment_transitions (payment_key, version, from_status, to_status, kind, amount_minor, currency, refund_id, inbox_id)
			SELECT k, v, f, t, kind, amt, cur, NULLIF(ref, ''), inbox
			  FROM unnest($1::text[], $2::bigint[], $3::text[], $4::text[], $5::text[], $6::bigint[], $7::text[], $8::text[], $9::bigint[])
			       AS u(k, v, f, t, kind, amt, cur, ref, inbox)`,
			w.trKey, w.trVersion, w.trFrom, w.trTo, w.trKind, w.trAmount, w.trCurrency, w.trRefundID, w.trInboxID)
	}
	if len(w.postKey) > 0 {
		b.Queue(`
			INSERT INTO ledger_postings (payment_key, version, account, amount_minor, currency)
			SELECT * FROM unnest($1::text[], $2::bigint[], $3::text[], $4::bigint[], $5::text[])`,
			w.postKey, w.postVersion, w.postAccount, w.postAmount, w.postCurrency)
	}
	if len(w.outKey) > 0 {
		b.Queue(`
			INSERT INTO outbox (payment_key, version, event_id, payload)
			SELECT k, v, e, p::jsonb FROM unnest($1::text[], $2::bigint[], $3::text[], $4::text[]) AS u(k, v, e, p)
			 ORDER BY k, v`,
			w.outKey, w.outVersion, w.outEventID, w.outPayload)
	}
	if b.Len() == 0 {
		return nil
	}
	if err := tx.SendBatch(ctx, b).Close(); err != nil {
		return fmt.Errorf("write effects: %w", err)
	}
	return nil
}

// quarantine records a record that failed deterministically, with the error
// as its reason, and holds its payment so later events wait for a replay
// instead of being applied out of order. Text that Postgres refused (NUL
// bytes, invalid UTF-8) is cleaned; the record value is kept byte-exact.
func quarantine(ctx context.Context, tx pgx.Tx, rec *kgo.Record, cause error) (result, error) {
	source, dedup, paymentKey, eventType := "unknown", fmt.Sprintf("offset:%s:%d:%d", rec.Topic, rec.Partition, rec.Offset), string(rec.Key), ""
	var receivedAt time.Time
	if env, err := envelope.DecodeRaw(rec.Value); err == nil {
		source, dedup, paymentKey, eventType, receivedAt = env.Source, env.Event.DedupKey, env.PaymentKey, env.Event.Type, env.ReceivedAt
	}
	if receivedAt.IsZero() {
		receivedAt = rec.Timestamp
	}
	source, dedup, paymentKey, eventType = cleanText(source), cleanText(dedup), cleanText(paymentKey), cleanText(eventType)
	reason := cleanText(cause.Error())
	if len(reason) > 1000 {
		reason = reason[:1000]
	}
	// The record's own dedup slot may be taken (by its first delivery);
	// then it is recorded against that first delivery.
	_, err := tx.Exec(ctx, `
		INSERT INTO inbox (source, dedup_key, event_type, payment_key, status, reason, payload, topic, partition, kafka_offset, received_at, duplicate_of)
		VALUES ($1, $2, $3, $4, 'quarantined', $5, $6, $7, $8, $9, $10,
		        (SELECT id FROM inbox WHERE source = $1 AND dedup_key = $2 AND duplicate_of IS NULL))`,
		source, dedup, eventType, paymentKey, reason, rec.Value, rec.Topic, rec.Partition, rec.Offset, receivedAt)
	if err != nil {
		return result{}, fmt.Errorf("quarantine record: %w", err)
	}
	if paymentKey != "" {
		_, err = tx.Exec(ctx, `
			INSERT INTO payments (payment_key, source, payment_id, status, version, state, held, held_reason)
			VALUES ($1, $2, '', '', 0, '{}', true, $3)
			ON CONFLICT (payment_key) DO UPDATE SET held = true, held_reason = EXCLUDED.held_reason, updated_at = now()`,
			paymentKey, source, reason)
		if err != nil {
			return result{}, fmt.Errorf("hold payment: %w", err)
		}
	}
	return result{source, outcomeQuarantined, "poison"}, nil
}

// cleanText makes s storable as Postgres text: valid UTF-8 without NUL.
func cleanText(s string) string {
	return strings.ReplaceAll(strings.ToValidUTF8(s, "\uFFFD"), "\x00", "\uFFFD")
}

func nullTime(t time.Time) *time.Time {
	if t.IsZero() {
		return nil
	}
	return &t
}
