package processor

import (
	"encoding/json"
	"fmt"
	"strings"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/paystream/paystream/internal/envelope"
	"github.com/paystream/paystream/internal/payment"
	"github.com/paystream/paystream/internal/statelog"
	"github.com/paystream/paystream/internal/store"
)

// Delivery reasons the processor itself assigns (the machine assigns the rest).
const (
	reasonDuplicateEvent  = store.ReasonDuplicateEvent
	reasonPaymentHeld     = store.ReasonPaymentHeld
	reasonAwaitingRefetch = store.ReasonAwaitingRefetch
)

// outcomeQuarantined is the status of a record that failed deterministically.
const outcomeQuarantined = store.StatusQuarantined

// result is what applying one record did, for metrics.
type result struct {
	source  string
	outcome string
	reason  string
	// partition is the raw topic partition of the record decided (-1 for
	// a stored delivery decided again by replay or the sweeper).
	partition int32
}

// applier decides what records do to their payments, in memory, over what
// a batch transaction read: no I/O. The store writes what it decided.
type applier struct {
	machine payment.Machine
	now     func() time.Time
	// idleTimeout is the batch transactions' idle_in_transaction_session_timeout
	// (0: the server's setting).
	idleTimeout time.Duration
}

// delivery is one decoded record, or a stored delivery decided again, and
// what became of it.
type delivery struct {
	rec *kgo.Record
	env envelope.Raw
	// inboxID is the delivery's id, allocated before it is stored so the
	// rows that reference it are written in the same round trip.
	inboxID int64
	// duplicate marks a redelivery of an event whose dedup key is stored,
	// and duplicateOf is the first delivery's id.
	duplicate   bool
	duplicateOf int64
	// refetched, when not nil, are the facts the gateway's API asserted
	// for the payment: applied instead of the webhook's own fact.
	refetched []payment.Fact
	// status is, for a stored delivery (replay, sweeper), its status as
	// the caller read it: the new outcome is written only if it still has
	// it (see ErrOutcomeChanged).
	status string
	// headers, when not nil, are the trace context the state events of
	// its payment carry: its batch's span (a transaction shared by
	// several partitions' batches has one per batch).
	headers []statelog.Header
}

// partition is the raw topic partition d was consumed from, -1 for a
// stored delivery.
func (d *delivery) partition() int32 {
	if d.rec == nil {
		return -1
	}
	return d.rec.Partition
}

// waiting is a deferred delivery that may apply after a transition.
type waiting struct {
	inboxID int64
	eventID string
	fact    payment.Fact
}

// paymentRow is a payment as read under its partition's lock, then
// advanced in memory.
type paymentRow struct {
	key       string
	source    string
	paymentID string
	// stored is true when the payments table has the row (else the batch
	// inserts it).
	stored    bool
	held      bool
	state     payment.State
	changed   bool
	lastEvent time.Time
	waiting   []waiting
}

// writes are the rows a batch writes once its decisions are made.
type writes struct {
	store.Writes
	// outcomeAt indexes outcomes by delivery id: the outcomes decided, of
	// new deliveries and stored ones alike.
	outcomeAt map[int64]int
	outcomes  []store.Outcome
}

// decodeAll decodes recs, failing with a poison error on the first that
// does not decode.
func decodeAll(recs []*kgo.Record) ([]delivery, error) {
	ds := make([]delivery, len(recs))
	for i, rec := range recs {
		env, err := envelope.DecodeRaw(rec.Value)
		if err != nil {
			return nil, poison("decode record at offset %d: %w", rec.Offset, err)
		}
		ds[i] = delivery{rec: rec, env: env}
	}
	return ds, nil
}

// decide runs the machine over deliveries, in order, against their
// payments (as read, then advanced in memory), and returns the rows to
// write, with a result per decision. Its deliveries are a batch's records
// (filled in by loaded), or stored deliveries decided again by replay or
// the sweeper.
//
// A record that cannot be applied deterministically (an invalid fact)
// fails the call with a poison error; the caller then retries record by
// record under savepoints to quarantine just that record.
func (a *applier) decide(ds []delivery, payments map[string]*paymentRow) (store.Writes, []result, error) {
	var w writes
	results := make([]result, 0, len(ds))
	for i := range ds {
		d := &ds[i]
		if d.duplicate {
			results = append(results, result{d.env.Source, string(payment.OutcomeIgnored), reasonDuplicateEvent, d.partition()})
			continue
		}
		p := payments[d.env.PaymentKey]
		ev := d.env.Event
		if p.held {
			w.outcome(p.key, d.inboxID, payment.OutcomeDeferred, reasonPaymentHeld)
			results = append(results, result{d.env.Source, string(payment.OutcomeDeferred), reasonPaymentHeld, d.partition()})
			continue
		}
		if ev.NeedsRefetch && d.refetched == nil {
			// The body is thin or unsigned: no money moves on it until the
			// payment's state is refetched from the gateway.
			w.outcome(p.key, d.inboxID, payment.OutcomeDeferred, reasonAwaitingRefetch)
			results = append(results, result{d.env.Source, string(payment.OutcomeDeferred), reasonAwaitingRefetch, d.partition()})
			continue
		}
		facts := []payment.Fact{ev.Fact}
		if d.refetched != nil {
			facts = d.refetched
		}
		// The delivery's outcome is the first applied decision's, else the
		// first one's (a refetch asserting nothing new is a duplicate).
		var first *payment.Decision
		applied := false
		for _, f := range facts {
			dec := a.machine.Apply(p.state, f)
			if dec.Outcome == payment.OutcomeIgnored && dec.Reason == payment.ReasonInvalidFact {
				return store.Writes{}, nil, poison("event %s (%s): invalid fact", ev.EventID, ev.Type)
			}
			if first == nil || (dec.Outcome == payment.OutcomeApplied && !applied) {
				first = &dec
			}
			if dec.Outcome != payment.OutcomeApplied {
				continue
			}
			applied = true
			if err := a.transition(&w, p, d.inboxID, ev.EventID, f, dec); err != nil {
				return store.Writes{}, nil, err
			}
		}
		if first == nil {
			first = &payment.Decision{Outcome: payment.OutcomeIgnored, Reason: payment.ReasonDuplicateFact}
		}
		w.outcome(p.key, d.inboxID, first.Outcome, first.Reason)
		results = append(results, result{d.env.Source, string(first.Outcome), first.Reason, d.partition()})
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
			w.outcome(p.key, wt.inboxID, r.Decision.Outcome, r.Decision.Reason)
			results = append(results, result{d.env.Source, string(r.Decision.Outcome), r.Decision.Reason, d.partition()})
			if r.Decision.Outcome == payment.OutcomeApplied {
				if err := a.transition(&w, p, wt.inboxID, wt.eventID, wt.fact, r.Decision); err != nil {
					return store.Writes{}, nil, err
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
	var own map[string][]statelog.Header // by payment key
	for i := range ds {
		if ds[i].headers != nil {
			if own == nil {
				own = map[string][]statelog.Header{}
			}
			own[ds[i].env.PaymentKey] = ds[i].headers
		}
	}
	for i := range w.Events {
		if h, ok := own[w.Events[i].Key]; ok {
			w.Events[i].Headers = h // read only: shared
		}
	}
	if err := a.rows(&w, ds, payments); err != nil {
		return store.Writes{}, nil, err
	}
	return w.Writes, results, nil
}

// reads returns what deciding ds needs read: a fresh delivery id for
// each, whether each is a redelivery (its dedup key is stored already),
// and the payments of ds with their deferred events; and the payments'
// rows, which loaded fills in.
//
// The ids come from one sequence, in offset order, so id order is arrival
// order. Rows never refer to a delivery by its Kafka position, which is
// not unique: a second consumer group reads the same records, and a
// recreated topic reuses offsets.
func reads(ds []delivery) (store.Reads, map[string]*paymentRow) {
	r := store.Reads{IDs: len(ds), Keys: make([]store.DedupKey, len(ds))}
	payments := map[string]*paymentRow{}
	for i := range ds {
		d := &ds[i]
		r.Keys[i] = store.DedupKey{Source: d.env.Source, Key: d.env.Event.DedupKey}
		if payments[d.env.PaymentKey] == nil {
			payments[d.env.PaymentKey] = &paymentRow{key: d.env.PaymentKey, source: d.env.Source, paymentID: d.env.Event.PaymentID}
			r.Payments = append(r.Payments, d.env.PaymentKey)
		}
	}
	return r, payments
}

// loaded fills ds in (ids, redeliveries) and their payments from what
// reads(ds) read.
func loaded(ds []delivery, l *store.Loaded, payments map[string]*paymentRow) {
	loadedPayments(l.Payments, payments)
	for i := range ds {
		d := &ds[i]
		d.inboxID = l.IDs[i]
		// A key stored before, or by an earlier record of this batch, is
		// a redelivery of that first delivery.
		key := store.DedupKey{Source: d.env.Source, Key: d.env.Event.DedupKey}
		if first, ok := l.Known[key]; ok {
			d.duplicate, d.duplicateOf = true, first
		} else {
			l.Known[key] = d.inboxID
		}
	}
}

// loadedPayments copies what the store read of payments into rows (whose
// entries exist). A waiting delivery whose envelope does not decode is
// left waiting: replay's business.
func loadedPayments(locked map[string]*store.LoadedPayment, rows map[string]*paymentRow) {
	for key, lp := range locked {
		p := rows[key]
		if p == nil {
			continue
		}
		p.state, p.held, p.stored = lp.State, lp.Held, lp.Found
		for i := range lp.Waiting {
			env, err := lp.Waiting[i].Envelope()
			if err != nil {
				continue
			}
			p.waiting = append(p.waiting, waiting{lp.Waiting[i].ID, env.Event.EventID, env.Event.Fact})
		}
	}
}

// transition queues the rows of an applied decision and advances p.
func (a *applier) transition(w *writes, p *paymentRow, inboxID int64, eventID string, fact payment.Fact, dec payment.Decision) error {
	if len(dec.Transitions) == 0 {
		return poison("machine applied a fact without a transition")
	}
	now := a.now().UTC()
	for _, t := range dec.Transitions {
		w.Transitions = append(w.Transitions, store.TransitionWrite{PaymentKey: p.key, DeliveryID: inboxID, Transition: t})
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
		// Per payment, transitions are decided, and so emitted, in
		// version order.
		w.Events = append(w.Events, statelog.Event{Key: p.key, Version: t.Version, Payload: payload})
	}
	p.state = dec.State
	p.changed = true
	if fact.OccurredAt.After(p.lastEvent) {
		p.lastEvent = fact.OccurredAt
	}
	return nil
}

// outcome records a delivery's outcome. An event deferred and then applied
// by a later event of the same batch is decided twice; the last decision is
// the one written.
func (w *writes) outcome(paymentKey string, id int64, outcome payment.Outcome, reason string) {
	if i, ok := w.outcomeAt[id]; ok {
		w.outcomes[i].Status, w.outcomes[i].Reason = string(outcome), reason
		return
	}
	if w.outcomeAt == nil {
		w.outcomeAt = map[int64]int{}
	}
	w.outcomeAt[id] = len(w.outcomes)
	w.outcomes = append(w.outcomes, store.Outcome{ID: id, PaymentKey: paymentKey, Status: string(outcome), Reason: reason})
}

// rows completes w with every row the batch decided on: the new
// deliveries (with their outcome), the outcomes of stored deliveries
// decided again and the payment states, beside the transitions, movements
// and state events decide added.
func (a *applier) rows(w *writes, ds []delivery, payments map[string]*paymentRow) error {
	recordedAt := a.now().UTC()
	// A stored delivery's outcome is written only if the row still has
	// the status it was read with: the deliveries' own (replay, sweeper),
	// else deferred (a waiting event loaded under its payment's lock).
	expected := map[int64]string{}
	for i := range ds {
		d := &ds[i]
		if d.rec == nil {
			expected[d.inboxID] = d.status
			continue
		}
		sd := store.Delivery{
			ID: d.inboxID, RecordedAt: recordedAt, Topic: d.rec.Topic, Partition: d.rec.Partition, Offset: d.rec.Offset,
			Envelope: d.env, Duplicate: d.duplicate, DuplicateOf: d.duplicateOf,
		}
		if !d.duplicate {
			at, ok := w.outcomeAt[d.inboxID]
			if !ok {
				return fmt.Errorf("delivery at offset %d has no outcome", d.rec.Offset)
			}
			sd.Status, sd.Reason = w.outcomes[at].Status, w.outcomes[at].Reason
			delete(w.outcomeAt, d.inboxID) // written with the row
		}
		w.Deliveries = append(w.Deliveries, sd)
	}
	for _, o := range w.outcomes {
		if _, ok := w.outcomeAt[o.ID]; !ok {
			continue
		}
		o.Expected = string(payment.OutcomeDeferred)
		if exp, ok := expected[o.ID]; ok {
			o.Expected = exp
		}
		w.Outcomes = append(w.Outcomes, o)
	}
	for _, p := range payments {
		if p.changed {
			w.Payments = append(w.Payments, store.PaymentWrite{New: !p.stored, Key: p.key, Source: p.source, PaymentID: p.paymentID, State: p.state, LastEventAt: p.lastEvent})
		}
	}
	return nil
}

// quarantined is how a record that failed deterministically is stored:
// with the error as its reason, its payment held so later events wait for
// a replay instead of being applied out of order. Text that Postgres
// refused (NUL bytes, invalid UTF-8) is cleaned; the record value is kept
// byte-exact.
func quarantined(now time.Time, rec *kgo.Record, cause error) (store.Quarantined, result) {
	q := store.Quarantined{
		RecordedAt: now.UTC(), Source: "unknown", DedupKey: fmt.Sprintf("offset:%s:%d:%d", rec.Topic, rec.Partition, rec.Offset),
		PaymentKey: string(rec.Key), Record: rec.Value, Topic: rec.Topic, Partition: rec.Partition, Offset: rec.Offset,
	}
	if env, err := envelope.DecodeRaw(rec.Value); err == nil {
		q.Source, q.DedupKey, q.PaymentKey, q.EventType, q.ReceivedAt = env.Source, env.Event.DedupKey, env.PaymentKey, env.Event.Type, env.ReceivedAt
	}
	if q.ReceivedAt.IsZero() {
		q.ReceivedAt = rec.Timestamp
	}
	q.Source, q.DedupKey, q.PaymentKey, q.EventType = cleanText(q.Source), cleanText(q.DedupKey), cleanText(q.PaymentKey), cleanText(q.EventType)
	q.Reason = cleanText(cause.Error())
	if len(q.Reason) > 1000 {
		q.Reason = q.Reason[:1000]
	}
	return q, result{q.Source, outcomeQuarantined, "poison", rec.Partition}
}

// cleanText makes s storable as Postgres text: valid UTF-8 without NUL.
func cleanText(s string) string {
	return strings.ReplaceAll(strings.ToValidUTF8(s, "\uFFFD"), "\x00", "\uFFFD")
}
