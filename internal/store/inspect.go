package store

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/paystream/paystream/internal/ledger"
)

// ErrNotFound is returned for a payment paystream has never seen.
var ErrNotFound = errors.New("not found")

// Payment is one payment as `paystream inspect payment` shows it.
type Payment struct {
	PaymentKey  string           `json:"payment_key"`
	Source      string           `json:"source"`
	PaymentID   string           `json:"payment_id"`
	Status      string           `json:"status"`
	Version     int64            `json:"version"`
	AmountMinor int64            `json:"amount_minor"`
	Currency    string           `json:"currency"`
	Held        bool             `json:"held"`
	HeldReason  string           `json:"held_reason,omitempty"`
	LastEventAt *time.Time       `json:"last_event_at,omitempty"`
	Ledger      []Posting        `json:"ledger"`
	Transitions []Transition     `json:"transitions"`
	Events      []InboxEvent     `json:"events"`
	Balances    map[string]int64 `json:"balances"`
}

// Posting is one ledger posting of a payment.
type Posting struct {
	Version     int64  `json:"version"`
	Account     string `json:"account"`
	AmountMinor int64  `json:"amount_minor"`
	Currency    string `json:"currency"`
}

// Transition is one real change of a payment.
type Transition struct {
	Version     int64     `json:"version"`
	From        string    `json:"from"`
	To          string    `json:"to"`
	Kind        string    `json:"kind"`
	AmountMinor int64     `json:"amount_minor"`
	Currency    string    `json:"currency"`
	RefundID    string    `json:"refund_id,omitempty"`
	At          time.Time `json:"at"`
}

// InboxEvent is one delivery of a webhook for the payment and what became of it.
type InboxEvent struct {
	InboxID    int64      `json:"inbox_id"`
	EventID    string     `json:"event_id"`
	DedupKey   string     `json:"dedup_key"`
	Type       string     `json:"type"`
	Outcome    string     `json:"outcome"`
	Reason     string     `json:"reason,omitempty"`
	OccurredAt *time.Time `json:"occurred_at,omitempty"`
	ReceivedAt time.Time  `json:"received_at"`
	Offset     string     `json:"offset"`
}

// InspectPayment loads a payment with its ledger, transitions and every
// delivery of its events, in arrival order.
func InspectPayment(ctx context.Context, pool *pgxpool.Pool, paymentKey string) (*Payment, error) {
	p := Payment{PaymentKey: paymentKey, Balances: map[string]int64{}}
	var heldReason *string
	err := pool.QueryRow(ctx, `
		SELECT source, payment_id, status, version, amount_minor, currency, held, held_reason, last_event_at
		  FROM payments WHERE payment_key = $1`, paymentKey).
		Scan(&p.Source, &p.PaymentID, &p.Status, &p.Version, &p.AmountMinor, &p.Currency, &p.Held, &heldReason, &p.LastEventAt)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, fmt.Errorf("payment %s: %w", paymentKey, ErrNotFound)
	}
	if err != nil {
		return nil, fmt.Errorf("load payment: %w", err)
	}
	if heldReason != nil {
		p.HeldReason = *heldReason
	}

	rows, err := pool.Query(ctx, `
		SELECT version, debit_account, credit_account, amount_minor, currency FROM ledger_movements
		 WHERE payment_key = $1 ORDER BY version, movement`, paymentKey)
	if err != nil {
		return nil, fmt.Errorf("load ledger: %w", err)
	}
	var version int64
	var m ledger.Movement
	_, err = pgx.ForEachRow(rows, []any{&version, &m.Debit, &m.Credit, &m.AmountMinor, &m.Currency}, func() error {
		// The signed postings per account are a view of the movements.
		for _, ps := range ledger.Postings([]ledger.Movement{m}) {
			p.Ledger = append(p.Ledger, Posting{Version: version, Account: ps.Account, AmountMinor: ps.AmountMinor, Currency: ps.Currency})
			p.Balances[ps.Account+":"+ps.Currency] += ps.AmountMinor
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("load ledger: %w", err)
	}
	if p.Ledger == nil {
		p.Ledger = []Posting{}
	}

	if p.Transitions, err = LoadTransitions(ctx, pool, paymentKey); err != nil {
		return nil, err
	}
	p.Events, err = queryRows(ctx, pool, pgx.RowToStructByPos[InboxEvent], "load events", `
		SELECT id, COALESCE(event_id, ''), dedup_key, event_type, status, COALESCE(reason, ''), occurred_at, received_at,
		       topic || '/' || partition || '@' || kafka_offset
		  FROM deliveries WHERE payment_key = $1 ORDER BY id`, paymentKey)
	if err != nil {
		return nil, err
	}
	return &p, nil
}
