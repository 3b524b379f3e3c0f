package store

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/paystream/paystream/internal/ledger"
)

// The read-only statements of `paystream reconcile` (package reconcile):
// they read what the processor wrote and change nothing.

// PaymentHead is a payment's identity and what its row says now: the
// columns every reader of payments shows, scanned by targets in
// paymentHeadColumns' order.
type PaymentHead struct {
	PaymentKey  string
	Source      string
	PaymentID   string
	Status      string
	Version     int64
	AmountMinor int64
	Currency    string
	Held        bool
}

// paymentHeadColumns are PaymentHead's columns, in targets' order.
const paymentHeadColumns = `payment_key, source, payment_id, status, version, amount_minor, currency, held`

// targets returns the scan destinations of paymentHeadColumns, followed
// by more.
func (p *PaymentHead) targets(more ...any) []any {
	return append([]any{&p.PaymentKey, &p.Source, &p.PaymentID, &p.Status, &p.Version, &p.AmountMinor, &p.Currency, &p.Held}, more...)
}

// PaymentRow is a payment as reconcile checks it: the queried columns and
// the machine's state, still encoded.
type PaymentRow struct {
	PaymentHead
	// State is the payments.state JSON, as stored.
	State []byte
}

func scanPaymentRow(r pgx.CollectableRow) (PaymentRow, error) {
	var p PaymentRow
	var state string
	err := r.Scan(p.targets(&state)...)
	p.State = []byte(state)
	return p, err
}

// PaymentsAfter returns up to limit payments whose key sorts after
// afterKey, in key order: a keyset page, so a scan of every payment holds
// no snapshot and no lock for long.
func PaymentsAfter(ctx context.Context, db DB, afterKey string, limit int) ([]PaymentRow, error) {
	return queryRows(ctx, db, scanPaymentRow, "read payments", `
		SELECT `+paymentHeadColumns+`, state::text FROM payments WHERE payment_key > $1 ORDER BY payment_key LIMIT $2`, afterKey, limit)
}

// LedgerBalances sums the ledger movements of keys into a balance per
// payment, account and currency (debits positive, as ledger.Balances),
// leaving zero balances out.
func LedgerBalances(ctx context.Context, db DB, keys []string) (map[string]map[ledger.Key]int64, error) {
	rows, err := db.Query(ctx, `
		SELECT payment_key, account, currency, sum(amount_minor)::bigint
		  FROM ledger_postings WHERE payment_key = ANY($1)
		 GROUP BY 1, 2, 3`, keys)
	if err != nil {
		return nil, fmt.Errorf("sum ledger movements: %w", err)
	}
	out := make(map[string]map[ledger.Key]int64, len(keys))
	var key string
	var k ledger.Key
	var sum int64
	_, err = pgx.ForEachRow(rows, []any{&key, &k.Account, &k.Currency, &sum}, func() error {
		if sum == 0 {
			return nil
		}
		if out[key] == nil {
			out[key] = map[ledger.Key]int64{}
		}
		out[key][k] = sum
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("sum ledger movements: %w", err)
	}
	return out, nil
}

// TransitionSpan is how many transitions a payment has and the highest
// version among them.
type TransitionSpan struct {
	Count, MaxVersion int64
}

// TransitionSpans returns the TransitionSpan of each of keys that has
// transitions.
func TransitionSpans(ctx context.Context, db DB, keys []string) (map[string]TransitionSpan, error) {
	rows, err := db.Query(ctx, `
		SELECT payment_key, count(*), max(version) FROM payment_transitions
		 WHERE payment_key = ANY($1) GROUP BY 1`, keys)
	if err != nil {
		return nil, fmt.Errorf("count transitions: %w", err)
	}
	out := make(map[string]TransitionSpan, len(keys))
	var key string
	var s TransitionSpan
	_, err = pgx.ForEachRow(rows, []any{&key, &s.Count, &s.MaxVersion}, func() error {
		out[key] = s
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("count transitions: %w", err)
	}
	return out, nil
}

// Waiting is a payment with deliveries that wait: held (quarantined
// deliveries, and those deferred behind them) or deferred.
type Waiting struct {
	PaymentKey string `json:"payment_key"`
	Held       bool   `json:"held"`
	HeldReason string `json:"held_reason,omitempty"`
	// Deliveries is how many of its deliveries wait (quarantined or
	// deferred).
	Deliveries int64 `json:"deliveries"`
	// Reasons are the distinct reasons they wait for, sorted.
	Reasons []string `json:"reasons"`
	// Since is when the oldest of them was received.
	Since time.Time `json:"since"`
}

// WaitingSince lists the payments held, or with deferred deliveries,
// whose oldest waiting delivery was received before cutoff, oldest first.
// A held payment without waiting deliveries counts from its last update.
func WaitingSince(ctx context.Context, db DB, cutoff time.Time, limit int) ([]Waiting, error) {
	return queryRows(ctx, db, pgx.RowToStructByPos[Waiting], "list waiting payments", `
		WITH w AS (
			SELECT payment_key, count(*) AS n, array_agg(DISTINCT COALESCE(reason, status) ORDER BY COALESCE(reason, status)) AS reasons,
			       min(received_at) AS since
			  FROM deliveries WHERE status IN ('deferred', 'quarantined')
			 GROUP BY payment_key
		)
		SELECT COALESCE(w.payment_key, p.payment_key), COALESCE(p.held, false), COALESCE(p.held_reason, ''),
		       COALESCE(w.n, 0), COALESCE(w.reasons, '{}'), COALESCE(w.since, p.updated_at)
		  FROM w FULL JOIN (SELECT payment_key, held, held_reason, updated_at FROM payments WHERE held) p USING (payment_key)
		 WHERE COALESCE(w.since, p.updated_at) < $1
		 ORDER BY 6, 1 LIMIT $2`, cutoff, limit)
}

// TransitionRef names one transition: the state event it must have
// published is "{PaymentKey}:{Version}".
type TransitionRef struct {
	PaymentKey string
	Version    int64
	At         time.Time
}

// TransitionsBetween returns the transitions recorded in [from, to), in
// time order. No index leads with created_at: it reads the whole table,
// once.
func TransitionsBetween(ctx context.Context, db DB, from, to time.Time) ([]TransitionRef, error) {
	return queryRows(ctx, db, pgx.RowToStructByPos[TransitionRef], "list transitions", `
		SELECT payment_key, version, created_at FROM payment_transitions
		 WHERE created_at >= $1 AND created_at < $2 ORDER BY created_at, payment_key, version`, from, to)
}

// OpenPayments returns up to limit payments of sources, updated at or
// after since, whose status is not one of final, oldest update first.
func OpenPayments(ctx context.Context, db DB, sources, final []string, since time.Time, limit int) ([]PaymentRow, error) {
	return queryRows(ctx, db, scanPaymentRow, "list open payments", `
		SELECT `+paymentHeadColumns+`, state::text FROM payments
		 WHERE source = ANY($1) AND status <> ALL($2) AND updated_at >= $3 AND payment_id <> ''
		 ORDER BY updated_at, payment_key LIMIT $4`, sources, final, since, limit)
}
