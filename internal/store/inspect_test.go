package store_test

import (
	"errors"
	"reflect"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/paystream/paystream/internal/store"
	"github.com/paystream/paystream/internal/testenv"
)

func TestInspectUnknownPayment(t *testing.T) {
	t.Parallel()
	db := testenv.NewDB(t)
	seed(t, db.Pool, "acme:pay_other", 0) // another payment exists; this one does not
	p, err := store.InspectPayment(t.Context(), db.Pool, "acme:pay_missing")
	if !errors.Is(err, store.ErrNotFound) || p != nil {
		t.Fatalf("InspectPayment(unknown) = %v, %v; want nil, ErrNotFound", p, err)
	}
}

// seed writes one payment as the processor would have left it: paid then
// partially refunded, with a stale event and a duplicate delivery in its
// inbox, and returns when its first event occurred.
func seed(t *testing.T, pool *pgxpool.Pool, key string, partition int) time.Time {
	t.Helper()
	at := time.Date(2026, 11, 29, 18, 0, 0, 0, time.UTC)
	err := pgx.BeginFunc(t.Context(), pool, func(tx pgx.Tx) error {
		stmts := []struct {
			sql  string
			args []any
		}{
			{`INSERT INTO payments (payment_key, source, payment_id, status, version, amount_minor, currency, state, last_event_at)
			  VALUES ($1, 'acme', split_part($1, ':', 2), 'partially_refunded', 2, 1050, 'BRL', '{}', $2)`, []any{key, at.Add(2 * time.Minute)}},
			{`INSERT INTO deliveries (id, recorded_at, source, dedup_key, event_id, event_type, payment_key, status, reason, duplicate_of, topic, partition, kafka_offset, occurred_at, received_at)
			  VALUES (nextval('deliveries_id_seq'), now(), 'acme', $1 || ':paid', $1 || ':paid', 'payment.paid', $1, 'processed', NULL, NULL, 'raw', $5, 10, $2, $2),
			         (nextval('deliveries_id_seq'), now(), 'acme', $1 || ':created', $1 || ':created', 'payment.created', $1, 'ignored', 'stale', NULL, 'raw', $5, 11, $3, $2),
			         (nextval('deliveries_id_seq'), now(), 'acme', $1 || ':refund', NULL, 'payment.partially_refunded', $1, 'processed', NULL, NULL, 'raw', $5, 12, $4, $4)`,
				[]any{key, at.Add(time.Minute), at, at.Add(2 * time.Minute), partition}},
			{`INSERT INTO deliveries (id, recorded_at, source, dedup_key, event_id, event_type, payment_key, status, reason, duplicate_of, topic, partition, kafka_offset, received_at)
			  SELECT nextval('deliveries_id_seq'), now(), source, dedup_key, event_id, event_type, payment_key, 'ignored', 'duplicate_event', id, topic, partition, 13, received_at
			    FROM deliveries WHERE dedup_key = $1 || ':paid'`, []any{key}},
			{`INSERT INTO payment_transitions (payment_key, version, from_status, to_status, kind, amount_minor, currency, refund_id)
			  VALUES ($1, 1, '', 'paid', 'capture', 1050, 'BRL', NULL), ($1, 2, 'paid', 'partially_refunded', 'refund', 50, 'BRL', 're_1')`, []any{key}},
			{`INSERT INTO ledger_movements (payment_key, version, movement, debit_account, credit_account, amount_minor, currency)
			  VALUES ($1, 1, 0, 'gateway_receivable', 'merchant_payable', 1050, 'BRL'),
			         ($1, 2, 0, 'merchant_payable', 'gateway_receivable', 50, 'BRL')`, []any{key}},
		}
		for _, s := range stmts {
			if _, err := tx.Exec(t.Context(), s.sql, s.args...); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		t.Fatalf("seed %s: %v", key, err)
	}
	return at
}

func TestInspectPayment(t *testing.T) {
	t.Parallel()
	db := testenv.NewDB(t)
	at := seed(t, db.Pool, "acme:pay_1", 2)
	seed(t, db.Pool, "acme:pay_2", 1) // must not leak into pay_1's answer

	p, err := store.InspectPayment(t.Context(), db.Pool, "acme:pay_1")
	if err != nil {
		t.Fatal(err)
	}
	if p.PaymentKey != "acme:pay_1" || p.Source != "acme" || p.PaymentID != "pay_1" || p.Status != "partially_refunded" ||
		p.Version != 2 || p.AmountMinor != 1050 || p.Currency != "BRL" || p.Held || p.HeldReason != "" {
		t.Errorf("payment = %+v", p)
	}
	if p.LastEventAt == nil || !p.LastEventAt.Equal(at.Add(2*time.Minute)) {
		t.Errorf("LastEventAt = %v, want %v", p.LastEventAt, at.Add(2*time.Minute))
	}

	wantLedger := []store.Posting{
		{1, "gateway_receivable", 1050, "BRL"}, {1, "merchant_payable", -1050, "BRL"},
		{2, "merchant_payable", 50, "BRL"}, {2, "gateway_receivable", -50, "BRL"},
	}
	if !reflect.DeepEqual(p.Ledger, wantLedger) {
		t.Errorf("Ledger = %+v, want %+v (version, then movement, debit before credit)", p.Ledger, wantLedger)
	}
	wantBalances := map[string]int64{"gateway_receivable:BRL": 1000, "merchant_payable:BRL": -1000}
	if !reflect.DeepEqual(p.Balances, wantBalances) {
		t.Errorf("Balances = %v, want %v", p.Balances, wantBalances)
	}

	if len(p.Transitions) != 2 {
		t.Fatalf("Transitions = %+v, want 2", p.Transitions)
	}
	for i, want := range []store.Transition{
		{Version: 1, From: "", To: "paid", Kind: "capture", AmountMinor: 1050, Currency: "BRL"},
		{Version: 2, From: "paid", To: "partially_refunded", Kind: "refund", AmountMinor: 50, Currency: "BRL", RefundID: "re_1"},
	} {
		got := p.Transitions[i]
		if got.At.IsZero() {
			t.Errorf("transition %d has no time", i)
		}
		got.At = time.Time{}
		if got != want {
			t.Errorf("transition %d = %+v, want %+v", i, got, want)
		}
	}

	type ev struct{ eventID, dedup, typ, outcome, reason, offset string }
	var got []ev
	for _, e := range p.Events {
		got = append(got, ev{e.EventID, e.DedupKey, e.Type, e.Outcome, e.Reason, e.Offset})
		if e.InboxID == 0 || e.ReceivedAt.IsZero() {
			t.Errorf("event %+v lacks inbox id or received time", e)
		}
	}
	want := []ev{
		{"acme:pay_1:paid", "acme:pay_1:paid", "payment.paid", "processed", "", "raw/2@10"},
		{"acme:pay_1:created", "acme:pay_1:created", "payment.created", "ignored", "stale", "raw/2@11"},
		{"", "acme:pay_1:refund", "payment.partially_refunded", "processed", "", "raw/2@12"},
		{"acme:pay_1:paid", "acme:pay_1:paid", "payment.paid", "ignored", "duplicate_event", "raw/2@13"},
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("Events =\n%+v\nwant (arrival order)\n%+v", got, want)
	}
	for i := 1; i < len(p.Events); i++ {
		if p.Events[i].InboxID <= p.Events[i-1].InboxID {
			t.Errorf("events not in inbox id order: %d after %d", p.Events[i].InboxID, p.Events[i-1].InboxID)
		}
	}
	if o := p.Events[1].OccurredAt; o == nil || !o.Equal(at) {
		t.Errorf("stale event OccurredAt = %v, want %v", o, at)
	}
	if o := p.Events[3].OccurredAt; o != nil {
		t.Errorf("duplicate without occurred_at has OccurredAt %v, want nil", o)
	}
}

// TestInspectHeldPayment: a payment held for a quarantined event says so,
// and one the processor only knows from that event (no transition yet) has
// empty, not null, lists.
func TestInspectHeldPayment(t *testing.T) {
	t.Parallel()
	db := testenv.NewDB(t)
	if _, err := db.Pool.Exec(t.Context(), `
		INSERT INTO payments (payment_key, source, payment_id, status, version, state, held, held_reason)
		VALUES ('acme:pay_h', 'acme', 'pay_h', '', 0, '{}', true, 'quarantined: bad amount')`); err != nil {
		t.Fatal(err)
	}
	p, err := store.InspectPayment(t.Context(), db.Pool, "acme:pay_h")
	if err != nil {
		t.Fatal(err)
	}
	if !p.Held || p.HeldReason != "quarantined: bad amount" || p.LastEventAt != nil {
		t.Errorf("held payment = %+v", p)
	}
	if p.Ledger == nil || p.Transitions == nil || p.Events == nil || p.Balances == nil {
		t.Errorf("empty lists must be empty, not nil (JSON [] not null): %+v", p)
	}
}
