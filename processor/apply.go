package processor

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/paystream/paystream/internal/envelope"
	"github.com/paystream/paystream/internal/payment"
)

// Inbox reasons the processor itself assigns (the machine assigns the rest).
const (
	reasonDuplicateEvent = "duplicate_event"
	reasonPaymentHeld    = "payment_held"
)

// result is what applying one record did, for metrics.
type result struct {
	source  string
	outcome string
	reason  string
}

// applier writes one record's effects inside the batch transaction.
type applier struct {
	machine payment.Machine
	now     func() time.Time
}

// apply records one raw record in the inbox and, unless it is a duplicate,
// runs it through the payment machine and persists what the machine decided.
// Every write happens in tx; nothing here commits.
func (a *applier) apply(ctx context.Context, tx pgx.Tx, rec *kgo.Record) ([]result, error) {
	env, err := envelope.DecodeRaw(rec.Value)
	if err != nil {
		return nil, poison("decode record: %w", err)
	}
	factJSON, err := json.Marshal(env.Event.Fact)
	if err != nil {
		return nil, poison("encode fact: %w", err)
	}
	ev := env.Event
	occurred := nullTime(ev.Fact.OccurredAt)

	var inboxID int64
	err = tx.QueryRow(ctx, `
		INSERT INTO inbox (source, dedup_key, event_id, event_type, payment_key, status, fact, payload,
		                   topic, partition, kafka_offset, occurred_at, received_at)
		VALUES ($1, $2, NULLIF($3, ''), $4, $5, 'received', $6, $7, $8, $9, $10, $11, $12)
		ON CONFLICT (source, dedup_key) WHERE duplicate_of IS NULL DO NOTHING
		RETURNING id`,
		env.Source, ev.DedupKey, ev.EventID, ev.Type, env.PaymentKey, factJSON, rec.Value,
		rec.Topic, rec.Partition, rec.Offset, occurred, env.ReceivedAt,
	).Scan(&inboxID)
	if errors.Is(err, pgx.ErrNoRows) {
		// A redelivery: record it, pointing at the first delivery, and stop.
		_, err = tx.Exec(ctx, `
			INSERT INTO inbox (source, dedup_key, event_id, event_type, payment_key, status, reason, duplicate_of,
			                   topic, partition, kafka_offset, occurred_at, received_at)
			SELECT $1, $2, NULLIF($3, ''), $4, $5, 'ignored', $6, id, $7, $8, $9, $10, $11
			  FROM inbox WHERE source = $1 AND dedup_key = $2 AND duplicate_of IS NULL`,
			env.Source, ev.DedupKey, ev.EventID, ev.Type, env.PaymentKey, reasonDuplicateEvent,
			rec.Topic, rec.Partition, rec.Offset, occurred, env.ReceivedAt)
		if err != nil {
			return nil, fmt.Errorf("record duplicate delivery: %w", err)
		}
		return []result{{env.Source, string(payment.OutcomeIgnored), reasonDuplicateEvent}}, nil
	}
	if err != nil {
		return nil, fmt.Errorf("insert inbox row: %w", err)
	}

	p, err := lockPayment(ctx, tx, env.PaymentKey)
	if err != nil {
		return nil, err
	}
	if p.held {
		if err := setInboxStatus(ctx, tx, inboxID, payment.OutcomeDeferred, reasonPaymentHeld); err != nil {
			return nil, err
		}
		return []result{{env.Source, string(payment.OutcomeDeferred), reasonPaymentHeld}}, nil
	}

	d := a.machine.Apply(p.state, ev.Fact)
	if err := a.persist(ctx, tx, &p, env.Source, ev.PaymentID, inboxID, ev.EventID, ev.Fact, d); err != nil {
		return nil, err
	}
	results := []result{{env.Source, string(d.Outcome), d.Reason}}
	if d.Outcome == payment.OutcomeApplied {
		more, err := a.reoffer(ctx, tx, &p, env.Source, ev.PaymentID)
		if err != nil {
			return nil, err
		}
		results = append(results, more...)
	}
	return results, nil
}

// reoffer gives the payment's deferred events another chance after a
// transition (payment.Machine.Resume decides, in occurred_at order, until a
// pass makes no progress), so a deferred event is applied in the same
// transaction as its predecessor.
func (a *applier) reoffer(ctx context.Context, tx pgx.Tx, p *lockedPayment, source, paymentID string) ([]result, error) {
	rows, err := tx.Query(ctx, `
		SELECT id, COALESCE(event_id, ''), fact FROM inbox
		 WHERE payment_key = $1 AND status = 'deferred' AND reason IS DISTINCT FROM $2
		 ORDER BY id`, p.key, reasonPaymentHeld)
	if err != nil {
		return nil, fmt.Errorf("list deferred events: %w", err)
	}
	type deferred struct {
		id      int64
		eventID string
		fact    payment.Fact
	}
	waiting, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (deferred, error) {
		var d deferred
		err := row.Scan(&d.id, &d.eventID, &d.fact)
		return d, err
	})
	if err != nil {
		return nil, fmt.Errorf("list deferred events: %w", err)
	}
	if len(waiting) == 0 {
		return nil, nil
	}
	facts := make([]payment.Fact, len(waiting))
	for i, w := range waiting {
		facts[i] = w.fact
	}
	settled := a.machine.Resume(p.state, facts)
	results := make([]result, 0, len(settled.Resumed))
	for _, r := range settled.Resumed {
		w := waiting[r.Index]
		if err := a.persist(ctx, tx, p, source, paymentID, w.id, w.eventID, w.fact, r.Decision); err != nil {
			return nil, err
		}
		results = append(results, result{source, string(r.Decision.Outcome), r.Decision.Reason})
	}
	return results, nil
}

// lockedPayment is a payment row read FOR UPDATE inside the batch transaction.
type lockedPayment struct {
	key    string
	exists bool
	held   bool
	state  payment.State
}

func lockPayment(ctx context.Context, tx pgx.Tx, key string) (lockedPayment, error) {
	p := lockedPayment{key: key}
	err := tx.QueryRow(ctx, `SELECT state, held FROM payments WHERE payment_key = $1 FOR UPDATE`, key).Scan(&p.state, &p.held)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return p, nil
	case err != nil:
		return p, fmt.Errorf("lock payment: %w", err)
	}
	p.exists = true
	return p, nil
}

// persist writes a machine decision: the inbox row's outcome and, for an
// applied fact, the payment's new state, one transition row per transition
// with its ledger postings, and one outbox event per transition.
func (a *applier) persist(ctx context.Context, tx pgx.Tx, p *lockedPayment, source, paymentID string, inboxID int64, eventID string, fact payment.Fact, d payment.Decision) error {
	if d.Outcome != payment.OutcomeApplied {
		return setInboxStatus(ctx, tx, inboxID, d.Outcome, d.Reason)
	}
	if len(d.Transitions) == 0 {
		return poison("machine applied a fact without a transition")
	}
	stateJSON, err := json.Marshal(d.State)
	if err != nil {
		return poison("encode payment state: %w", err)
	}
	now := a.now().UTC()

	b := &pgx.Batch{}
	b.Queue(`
		INSERT INTO payments (payment_key, source, payment_id, status, version, amount_minor, currency, state, last_event_at)
		VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)
		ON CONFLICT (payment_key) DO UPDATE
		   SET status = EXCLUDED.status, version = EXCLUDED.version, amount_minor = EXCLUDED.amount_minor,
		       currency = EXCLUDED.currency, state = EXCLUDED.state,
		       last_event_at = GREATEST(payments.last_event_at, EXCLUDED.last_event_at), updated_at = now()`,
		p.key, source, paymentID, string(d.State.Status), d.State.Version, d.State.AmountMinor, d.State.Currency,
		stateJSON, nullTime(fact.OccurredAt))
	for _, t := range d.Transitions {
		b.Queue(`
			INSERT INTO payment_transitions (payment_key, version, from_status, to_status, kind, amount_minor, currency, refund_id, inbox_id)
			VALUES ($1, $2, $3, $4, $5, $6, $7, NULLIF($8, ''), $9)`,
			p.key, t.Version, string(t.From), string(t.To), t.Kind, t.AmountMinor, t.Currency, t.RefundID, inboxID)
		for _, ps := range t.Postings {
			b.Queue(`INSERT INTO ledger_postings (payment_key, version, account, amount_minor, currency) VALUES ($1, $2, $3, $4, $5)`,
				p.key, t.Version, ps.Account, ps.AmountMinor, ps.Currency)
		}
		ev := envelope.State{
			EventID:        envelope.StateEventID(p.key, t.Version),
			PaymentKey:     p.key,
			Source:         source,
			PaymentID:      paymentID,
			Version:        t.Version,
			Status:         t.To,
			PreviousStatus: t.From,
			Kind:           t.Kind,
			AmountMinor:    t.AmountMinor,
			Currency:       t.Currency,
			RefundID:       t.RefundID,
			Payment:        d.State,
			SourceEventID:  eventID,
			OccurredAt:     fact.OccurredAt,
			RecordedAt:     now,
		}
		payload, err := json.Marshal(ev)
		if err != nil {
			return poison("encode state event: %w", err)
		}
		b.Queue(`INSERT INTO outbox (payment_key, version, event_id, payload) VALUES ($1, $2, $3, $4)`,
			p.key, t.Version, ev.EventID, payload)
	}
	b.Queue(`UPDATE inbox SET status = 'processed', reason = NULL, attempts = attempts + 1, processed_at = now() WHERE id = $1`, inboxID)
	if err := tx.SendBatch(ctx, b).Close(); err != nil {
		return fmt.Errorf("write transition: %w", err)
	}
	p.state = d.State
	p.exists = true
	return nil
}

func setInboxStatus(ctx context.Context, tx pgx.Tx, id int64, outcome payment.Outcome, reason string) error {
	_, err := tx.Exec(ctx, `UPDATE inbox SET status = $2, reason = NULLIF($3, ''), attempts = attempts + 1, processed_at = now() WHERE id = $1`,
		id, string(outcome), reason)
	if err != nil {
		return fmt.Errorf("update inbox status: %w", err)
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
	// The record's own dedup slot may be taken (its first delivery was
	// quarantined too); then it is recorded against that first delivery.
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
	return result{source, "quarantined", "poison"}, nil
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
