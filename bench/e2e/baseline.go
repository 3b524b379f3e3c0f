package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"syscall"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/paystream/paystream/bench/internal/rig"
	"github.com/paystream/paystream/internal/payment"
	"github.com/paystream/paystream/internal/provider"
	"github.com/paystream/paystream/internal/provider/drivers"
	"github.com/paystream/paystream/internal/source"
)

// baselineSchema is the synchronous baseline's tables: the received
// events (their unique key is the deduplication), the payments and the
// ledger. It lives in its own schema.
const baselineSchema = `
CREATE TABLE IF NOT EXISTS webhook_events (
    source      text        NOT NULL,
    event_id    text        NOT NULL,
    payment_key text        NOT NULL,
    event_type  text        NOT NULL,
    fact        jsonb       NOT NULL,
    payload     bytea       NOT NULL,
    outcome     text        NOT NULL DEFAULT 'received',
    reason      text,
    received_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (source, event_id)
);
CREATE INDEX IF NOT EXISTS webhook_events_deferred ON webhook_events (payment_key, received_at) WHERE outcome = 'deferred';
CREATE TABLE IF NOT EXISTS payments (
    payment_key  text        PRIMARY KEY,
    status       text        NOT NULL,
    version      bigint      NOT NULL,
    amount_minor bigint      NOT NULL DEFAULT 0,
    currency     text        NOT NULL DEFAULT '',
    state        jsonb       NOT NULL,
    waiting      integer     NOT NULL DEFAULT 0,
    updated_at   timestamptz NOT NULL DEFAULT now()
);
CREATE TABLE IF NOT EXISTS ledger_postings (
    id           bigserial   PRIMARY KEY,
    payment_key  text        NOT NULL,
    version      bigint      NOT NULL,
    account      text        NOT NULL,
    amount_minor bigint      NOT NULL CHECK (amount_minor <> 0),
    currency     text        NOT NULL,
    created_at   timestamptz NOT NULL DEFAULT now(),
    UNIQUE (payment_key, version, account, currency)
);
`

// runBaseline is the `baseline` subcommand: the synchronous server, run
// by the bench as its own process so its CPU can be measured alone.
func runBaseline(args []string) error {
	fs := flag.NewFlagSet("baseline", flag.ExitOnError)
	addr := fs.String("addr", "127.0.0.1:0", "listen address")
	dbURL := fs.String("database-url", "", "Postgres URL (with search_path set to the baseline's schema)")
	sourcesPath := fs.String("sources", "", "sources file")
	conns := fs.Int("conns", 16, "Postgres connections")
	_ = fs.Parse(args)

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	sources, err := source.Load(*sourcesPath, drivers.Factories())
	if err != nil {
		return err
	}
	cfg, err := pgxpool.ParseConfig(*dbURL)
	if err != nil {
		return fmt.Errorf("parse database url: %w", err)
	}
	cfg.MaxConns = int32(*conns)
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return fmt.Errorf("connect: %w", err)
	}
	defer pool.Close()
	if _, err := pool.Exec(ctx, baselineSchema); err != nil {
		return fmt.Errorf("create baseline schema: %w", err)
	}
	ln, err := net.Listen("tcp", *addr)
	if err != nil {
		return fmt.Errorf("listen: %w", err)
	}
	b := &baseline{pool: pool, sources: sources, log: log}
	mux := http.NewServeMux()
	mux.HandleFunc("POST /webhooks/{source}", b.webhook)
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, _ *http.Request) { _, _ = io.WriteString(w, "ok\n") })
	return rig.Serve(ctx, ln, mux)
}

// baseline is the design most teams write: verify the signature, then in
// the request's own Postgres transaction insert-or-ignore the event, lock
// the payment row, run the state machine, write the ledger rows, commit,
// answer. It applies paystream's rules (payment.Machine, the
// standardwebhooks driver) so that only the architecture differs.
type baseline struct {
	pool    *pgxpool.Pool
	sources map[string]*source.Source
	log     *slog.Logger
}

func (b *baseline) webhook(w http.ResponseWriter, r *http.Request) {
	src, ok := b.sources[r.PathValue("source")]
	if !ok {
		http.NotFound(w, r)
		return
	}
	pr := rig.VerifiedRequest(w, r, src)
	if pr == nil {
		return
	}
	ev, err := src.Driver.Parse(pr)
	if err != nil {
		http.Error(w, "unprocessable", http.StatusUnprocessableEntity)
		return
	}
	if err := pgx.BeginFunc(r.Context(), b.pool, func(tx pgx.Tx) error {
		return b.apply(r.Context(), tx, src, ev, pr.Body)
	}); err != nil {
		b.log.Warn("webhook not applied", "source", src.Name, "error", err)
		http.Error(w, "try again", http.StatusServiceUnavailable)
		return
	}
	rig.WriteOK(w)
}

// apply is the request's transaction.
func (b *baseline) apply(ctx context.Context, tx pgx.Tx, src *source.Source, ev provider.Event, body []byte) error {
	key := src.PaymentKey(ev.PaymentID)
	fact, err := json.Marshal(ev.Fact)
	if err != nil {
		return fmt.Errorf("encode fact: %w", err)
	}
	tag, err := tx.Exec(ctx, `INSERT INTO webhook_events (source, event_id, payment_key, event_type, fact, payload)
		VALUES ($1, $2, $3, $4, $5, $6) ON CONFLICT DO NOTHING`, src.Name, ev.DedupKey, key, ev.Type, fact, body)
	if err != nil {
		return fmt.Errorf("insert event: %w", err)
	}
	if tag.RowsAffected() == 0 {
		return nil // a repeated delivery: already recorded
	}

	st, waiting, err := lockPayment(ctx, tx, key)
	if err != nil {
		return err
	}
	var pending []payment.Fact
	var pendingIDs []string
	if waiting > 0 {
		if pending, pendingIDs, err = deferredFacts(ctx, tx, key); err != nil {
			return err
		}
	}
	m := payment.Machine{}
	dec, settled := m.Offer(st, ev.Fact, pending)
	if err := setOutcome(ctx, tx, src.Name, ev.DedupKey, dec); err != nil {
		return err
	}
	if dec.Outcome == payment.OutcomeDeferred {
		_, err := tx.Exec(ctx, `UPDATE payments SET waiting = waiting + 1 WHERE payment_key = $1`, key)
		return err
	}
	if dec.Outcome != payment.OutcomeApplied {
		return nil
	}
	for _, r := range settled.Resumed {
		if err := setOutcome(ctx, tx, src.Name, pendingIDs[r.Index], r.Decision); err != nil {
			return err
		}
	}
	if err := insertPostings(ctx, tx, key, settled.Transitions); err != nil {
		return err
	}
	state, err := json.Marshal(settled.State)
	if err != nil {
		return fmt.Errorf("encode state: %w", err)
	}
	_, err = tx.Exec(ctx, `UPDATE payments SET status = $2, version = $3, amount_minor = $4, currency = $5, state = $6,
		waiting = waiting - $7, updated_at = now() WHERE payment_key = $1`,
		key, settled.State.Status, settled.State.Version, settled.State.AmountMinor, settled.State.Currency, state, len(settled.Resumed))
	if err != nil {
		return fmt.Errorf("update payment: %w", err)
	}
	return nil
}

// lockPayment locks the payment's row, creating it first if new, and
// returns its state and how many of its events wait (deferred).
func lockPayment(ctx context.Context, tx pgx.Tx, key string) (payment.State, int, error) {
	const lock = `SELECT state, waiting FROM payments WHERE payment_key = $1 FOR UPDATE`
	var raw []byte
	var waiting int
	err := tx.QueryRow(ctx, lock, key).Scan(&raw, &waiting)
	if errors.Is(err, pgx.ErrNoRows) {
		if _, err = tx.Exec(ctx, `INSERT INTO payments (payment_key, status, version, state) VALUES ($1, '', 0, '{}')
			ON CONFLICT DO NOTHING`, key); err != nil {
			return payment.State{}, 0, fmt.Errorf("insert payment: %w", err)
		}
		err = tx.QueryRow(ctx, lock, key).Scan(&raw, &waiting)
	}
	if err != nil {
		return payment.State{}, 0, fmt.Errorf("lock payment: %w", err)
	}
	var st payment.State
	if err := json.Unmarshal(raw, &st); err != nil {
		return payment.State{}, 0, fmt.Errorf("decode payment state: %w", err)
	}
	return st, waiting, nil
}

// deferredFacts returns the payment's waiting facts in arrival order, and
// their event ids.
func deferredFacts(ctx context.Context, tx pgx.Tx, key string) ([]payment.Fact, []string, error) {
	rows, err := tx.Query(ctx, `SELECT event_id, fact FROM webhook_events
		WHERE payment_key = $1 AND outcome = 'deferred' ORDER BY received_at, event_id`, key)
	if err != nil {
		return nil, nil, fmt.Errorf("read deferred events: %w", err)
	}
	defer rows.Close()
	var facts []payment.Fact
	var ids []string
	for rows.Next() {
		var id string
		var raw []byte
		if err := rows.Scan(&id, &raw); err != nil {
			return nil, nil, fmt.Errorf("read deferred events: %w", err)
		}
		var f payment.Fact
		if err := json.Unmarshal(raw, &f); err != nil {
			return nil, nil, fmt.Errorf("decode deferred fact: %w", err)
		}
		facts, ids = append(facts, f), append(ids, id)
	}
	return facts, ids, rows.Err()
}

func setOutcome(ctx context.Context, tx pgx.Tx, src, eventID string, d payment.Decision) error {
	_, err := tx.Exec(ctx, `UPDATE webhook_events SET outcome = $3, reason = NULLIF($4, '') WHERE source = $1 AND event_id = $2`,
		src, eventID, string(d.Outcome), d.Reason)
	if err != nil {
		return fmt.Errorf("record outcome: %w", err)
	}
	return nil
}

// insertPostings writes the transitions' ledger postings in one statement.
func insertPostings(ctx context.Context, tx pgx.Tx, key string, ts []payment.Transition) error {
	var versions, amounts []int64
	var accounts, currencies []string
	for _, t := range ts {
		for _, p := range t.Postings() {
			versions, accounts = append(versions, t.Version), append(accounts, p.Account)
			amounts, currencies = append(amounts, p.AmountMinor), append(currencies, p.Currency)
		}
	}
	if len(versions) == 0 {
		return nil
	}
	_, err := tx.Exec(ctx, `INSERT INTO ledger_postings (payment_key, version, account, amount_minor, currency)
		SELECT $1, * FROM unnest($2::bigint[], $3::text[], $4::bigint[], $5::text[])`, key, versions, accounts, amounts, currencies)
	if err != nil {
		return fmt.Errorf("insert postings: %w", err)
	}
	return nil
}
