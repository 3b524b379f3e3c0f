package console_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/crypto/bcrypt"

	"github.com/paystream/paystream/internal/console"
	"github.com/paystream/paystream/internal/testenv"
)

// The basic auth user of the tests.
const (
	testUser     = "support"
	testPassword = "correct horse battery staple"
)

// bundle is a console on a freshly migrated schema.
type bundle struct {
	db  *testenv.DB
	srv *console.Server
	// ts serves srv on loopback, for the browser and real HTTP.
	ts  *httptest.Server
	reg *prometheus.Registry
	now time.Time
}

type setupOpts struct {
	cfg func(*console.Config)
	// readOnly connects the console as a role with the grants
	// docs/console.md documents, not as the schema's owner.
	readOnly bool
}

// at is the tests' clock: every seeded row is before it.
var at = time.Date(2026, 11, 29, 18, 0, 0, 0, time.UTC)

func setup(t testing.TB, o setupOpts) *bundle {
	t.Helper()
	db := testenv.NewDB(t)
	b := &bundle{db: db, reg: prometheus.NewRegistry(), now: at.Add(2 * time.Hour)}
	pool := db.Pool
	if o.readOnly {
		pool = readOnlyPool(t, db)
	}
	cfg := console.Config{
		Auth:       console.Auth{BasicFile: authFile(t)},
		Now:        func() time.Time { return b.now },
		Logger:     slog.New(slog.DiscardHandler),
		Registerer: b.reg,
	}
	if o.cfg != nil {
		o.cfg(&cfg)
	}
	srv, err := console.New(pool, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Close)
	b.srv = srv
	b.ts = httptest.NewServer(srv)
	t.Cleanup(b.ts.Close)
	return b
}

// authFile writes a secrets file with testUser's bcrypt hash.
func authFile(t testing.TB) string {
	t.Helper()
	hash, err := bcrypt.GenerateFromPassword([]byte(testPassword), bcrypt.MinCost)
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "users")
	if err := os.WriteFile(path, []byte("# console users\n"+testUser+":"+string(hash)+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// readOnlyGrants are docs/console.md's grants, for schema %[1]s and role
// %[2]s.
const readOnlyGrants = `
GRANT USAGE ON SCHEMA %[1]s TO %[2]s;
GRANT SELECT ON %[1]s.payments, %[1]s.payment_transitions, %[1]s.ledger_movements, %[1]s.deliveries,
                %[1]s.dedup_keys, %[1]s.consumer_offsets TO %[2]s;
ALTER ROLE %[2]s SET default_transaction_read_only = on;`

// readOnlyPool creates a login role with the documented grants on db's
// schema (dropped when the test ends) and returns a pool connected as it.
func readOnlyPool(t testing.TB, db *testenv.DB) *pgxpool.Pool {
	t.Helper()
	ctx := t.Context()
	role := "console_" + db.Schema
	ident := func(s string) string { return pgx.Identifier{s}.Sanitize() }
	stmts := fmt.Sprintf("CREATE ROLE %s LOGIN PASSWORD 'console';", ident(role)) + fmt.Sprintf(readOnlyGrants, ident(db.Schema), ident(role))
	if _, err := db.Pool.Exec(ctx, stmts); err != nil {
		t.Fatalf("create read-only role: %v", err)
	}
	t.Cleanup(func() {
		ctx := context.WithoutCancel(ctx)
		// After the pool's close (registered later, run first); the schema
		// (dropped after this) still holds the grants, so drop them first.
		_, err := db.Pool.Exec(ctx, fmt.Sprintf("DROP OWNED BY %s; DROP ROLE %s", ident(role), ident(role)))
		if err != nil {
			t.Errorf("drop role %s: %v", role, err)
		}
	})
	cfg, err := pgxpool.ParseConfig(db.URL)
	if err != nil {
		t.Fatal(err)
	}
	cfg.ConnConfig.User, cfg.ConnConfig.Password = role, "console"
	cfg.ConnConfig.RuntimeParams["search_path"] = db.Schema
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return pool
}

// get fetches path as the test user, without following redirects, and
// returns the status, the Location header and the body.
func (b *bundle) get(t testing.TB, path string) (int, string, string) {
	t.Helper()
	return b.do(t, http.MethodGet, path, func(r *http.Request) { r.SetBasicAuth(testUser, testPassword) })
}

func (b *bundle) do(t testing.TB, method, path string, prep func(*http.Request)) (int, string, string) {
	t.Helper()
	req := httptest.NewRequestWithContext(t.Context(), method, path, nil)
	if prep != nil {
		prep(req)
	}
	rec := httptest.NewRecorder()
	b.srv.ServeHTTP(rec, req)
	body, _ := io.ReadAll(rec.Body)
	return rec.Code, rec.Header().Get("Location"), string(body)
}

// exec runs statements on the test's schema as its owner.
func (b *bundle) exec(t testing.TB, sql string, args ...any) {
	t.Helper()
	if _, err := b.db.Pool.Exec(t.Context(), sql, args...); err != nil {
		t.Fatalf("%s: %v", strings.SplitN(strings.TrimSpace(sql), "\n", 2)[0], err)
	}
}

// delivery is one deliveries row to seed.
type delivery struct {
	payment, eventID, typ, status, reason string
	dupOf                                 bool // a redelivery of the previous row
	received                              time.Time
	body                                  string
}

// seedDeliveries inserts ds in order (ids ascending) on partition 0 of
// the raw topic "raw", from offset 0.
func (b *bundle) seedDeliveries(t testing.TB, ds ...delivery) {
	t.Helper()
	for i, d := range ds {
		dedup := d.eventID
		if dedup == "" {
			dedup = fmt.Sprintf("%s:%d", d.payment, i)
		}
		var body any
		if d.body != "" {
			body = []byte(d.body)
		}
		b.exec(t, `
			INSERT INTO deliveries (id, recorded_at, source, dedup_key, event_id, event_type, payment_key, status, reason,
			                        duplicate_of, body, topic, partition, kafka_offset, occurred_at, received_at)
			VALUES (nextval('deliveries_id_seq'), $9, 'acme', $1, NULLIF($2, ''), $3, $4, $5, NULLIF($6, ''),
			        CASE WHEN $7 THEN currval('deliveries_id_seq') - 1 END, $10, 'raw', 0,
			        (SELECT count(*) FROM deliveries), $8, $8)`,
			dedup, d.eventID, d.typ, d.payment, d.status, d.reason, d.dupOf, d.received, at, body)
		if !d.dupOf {
			b.exec(t, `INSERT INTO dedup_keys (source, dedup_key, delivery_id, recorded_at)
			           VALUES ('acme', $1, currval('deliveries_id_seq'), $2) ON CONFLICT DO NOTHING`, dedup, at)
		}
	}
}

// seedPaidAndRefunded writes acme:pay_1 as the processor leaves a payment
// created, authorized, paid and partly refunded: four transitions, their
// ledger movements and six deliveries (one redelivery, one stale event).
func (b *bundle) seedPaidAndRefunded(t testing.TB) {
	t.Helper()
	key := "acme:pay_1"
	b.exec(t, `INSERT INTO payments (payment_key, source, payment_id, status, version, amount_minor, currency, state, last_event_at, created_at, updated_at)
	           VALUES ($1, 'acme', 'pay_1', 'partially_refunded', 4, 105000, 'BRL', '{}', $2, $3, $2)`, key, at.Add(4*time.Minute), at)
	b.exec(t, `INSERT INTO payment_transitions (payment_key, version, from_status, to_status, kind, amount_minor, currency, refund_id, created_at)
	           VALUES ($1, 1, '', 'pending', 'create', 105000, 'BRL', NULL, $2),
	                  ($1, 2, 'pending', 'authorized', 'authorize', 105000, 'BRL', NULL, $2 + interval '1 minute'),
	                  ($1, 3, 'authorized', 'paid', 'capture', 105000, 'BRL', NULL, $2 + interval '2 minutes'),
	                  ($1, 4, 'paid', 'partially_refunded', 'refund', 5000, 'BRL', 're_1', $2 + interval '4 minutes')`, key, at)
	b.exec(t, `INSERT INTO ledger_movements (payment_key, version, movement, debit_account, credit_account, amount_minor, currency)
	           VALUES ($1, 3, 0, 'gateway_receivable', 'merchant_payable', 105000, 'BRL'),
	                  ($1, 4, 0, 'merchant_payable', 'gateway_receivable', 5000, 'BRL')`, key)
	b.seedDeliveries(t,
		delivery{payment: key, eventID: "evt_created", typ: "payment.created", status: "processed", received: at},
		delivery{payment: key, eventID: "evt_authorized", typ: "payment.authorized", status: "processed", received: at.Add(time.Minute)},
		delivery{payment: key, eventID: "evt_paid", typ: "payment.paid", status: "processed", received: at.Add(2 * time.Minute),
			body: `{"type":"payment.paid","data":{"card_last4":"4242"}}`},
		delivery{payment: key, eventID: "evt_paid", typ: "payment.paid", status: "ignored", reason: "duplicate_event", dupOf: true, received: at.Add(3 * time.Minute)},
		delivery{payment: key, eventID: "evt_pending_late", typ: "payment.pending", status: "ignored", reason: "stale", received: at.Add(3 * time.Minute)},
		delivery{payment: key, eventID: "evt_refund", typ: "payment.partially_refunded", status: "processed", received: at.Add(4 * time.Minute)},
	)
}

// seedHeld writes acme:pay_held, held by a quarantined delivery, with a
// later event deferred behind it.
func (b *bundle) seedHeld(t testing.TB) {
	t.Helper()
	key := "acme:pay_held"
	b.exec(t, `INSERT INTO payments (payment_key, source, payment_id, status, version, amount_minor, currency, state, held, held_reason, updated_at)
	           VALUES ($1, 'acme', 'pay_held', 'pending', 1, 990, 'JPY', '{}', true, 'currency_mismatch', $2)`, key, at.Add(-time.Hour))
	b.seedDeliveries(t,
		delivery{payment: key, eventID: "evt_held_paid", typ: "payment.paid", status: "quarantined", reason: "currency_mismatch", received: at.Add(-time.Hour)},
		delivery{payment: key, eventID: "evt_held_refund", typ: "payment.refunded", status: "deferred", reason: "payment_held", received: at.Add(-30 * time.Minute)},
	)
}
