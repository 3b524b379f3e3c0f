package migrations_test

import (
	"context"
	"errors"
	"net/url"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/paystream/paystream/internal/testenv"
	"github.com/paystream/paystream/migrations"
)

// SQLSTATEs the schema's constraints raise.
const (
	uniqueViolation = "23505"
	checkViolation  = "23514"
)

func TestAllIsOrdered(t *testing.T) {
	t.Parallel()
	all, err := migrations.All()
	if err != nil {
		t.Fatal(err)
	}
	if len(all) == 0 {
		t.Fatal("no embedded migrations")
	}
	for i, m := range all {
		if m.SQL == "" || !strings.HasSuffix(m.Name, ".sql") {
			t.Errorf("migration %d: name %q, %d bytes of SQL", m.Version, m.Name, len(m.SQL))
		}
		if i > 0 && m.Version <= all[i-1].Version {
			t.Errorf("migration %s (v%d) after %s (v%d): not increasing", m.Name, m.Version, all[i-1].Name, all[i-1].Version)
		}
	}
}

// TestApplyIsIdempotent: on a schema testenv already migrated, Apply
// applies nothing and records nothing new.
func TestApplyIsIdempotent(t *testing.T) {
	t.Parallel()
	db := testenv.NewDB(t)
	all, err := migrations.All()
	if err != nil {
		t.Fatal(err)
	}
	for range 2 {
		applied, err := migrations.Apply(t.Context(), db.Pool)
		if err != nil {
			t.Fatalf("second Apply: %v", err)
		}
		if len(applied) != 0 {
			t.Errorf("second Apply applied %v, want nothing", applied)
		}
	}
	if n := count(t, db.Pool, "SELECT count(*) FROM schema_migrations"); n != len(all) {
		t.Errorf("schema_migrations has %d rows, want %d", n, len(all))
	}
}

// TestApplyConcurrently runs Apply from four pools at once (four
// `paystream migrate` processes, in effect) on each of a few bare schemas:
// each migration is applied exactly once per schema, by exactly one of
// them, and none fails.
func TestApplyConcurrently(t *testing.T) {
	t.Parallel()
	all, err := migrations.All()
	if err != nil {
		t.Fatal(err)
	}
	var want []string
	for _, m := range all {
		want = append(want, m.Name)
	}
	const schemas, migrators = 3, 4
	for range schemas {
		url := bareSchema(t)
		pools := make([]*pgxpool.Pool, migrators)
		for i := range pools {
			pools[i] = openPool(t, url)
		}
		var wg sync.WaitGroup
		applied := make([][]string, migrators)
		errs := make([]error, migrators)
		start := make(chan struct{})
		for i := range migrators {
			wg.Go(func() {
				<-start
				applied[i], errs[i] = migrations.Apply(t.Context(), pools[i])
			})
		}
		close(start)
		wg.Wait()

		var got []string
		for i := range migrators {
			if errs[i] != nil {
				t.Errorf("migrator %d: %v", i, errs[i])
			}
			got = append(got, applied[i]...)
		}
		slices.Sort(got)
		if !slices.Equal(got, want) {
			t.Errorf("migrations applied across %d concurrent migrators = %v, want each of %v exactly once", migrators, got, want)
		}
		if n := count(t, pools[0], "SELECT count(*) FROM schema_migrations"); n != len(all) {
			t.Errorf("schema_migrations has %d rows, want %d", n, len(all))
		}
		// The schema is really there, in this schema.
		if n := count(t, pools[0], "SELECT count(*) FROM ledger_postings"); n != 0 {
			t.Errorf("fresh ledger_postings has %d rows", n)
		}
	}
}

// TestLedgerMustBalance: the deferred constraint trigger rejects, at
// commit, a transition whose postings do not sum to zero per currency, and
// accepts balanced ones.
func TestLedgerMustBalance(t *testing.T) {
	t.Parallel()
	db := testenv.NewDB(t)
	ctx := t.Context()
	seedTransition(t, db.Pool, "acme:pay_1", 1)

	cases := []struct {
		name     string
		postings [][3]any // account, amount, currency
		wantErr  bool
	}{
		{"unbalanced", [][3]any{{"gateway_receivable", int64(1000), "BRL"}, {"merchant_payable", int64(-900), "BRL"}}, true},
		{"one leg", [][3]any{{"gateway_receivable", int64(1000), "BRL"}}, true},
		{"balanced per total, not per currency", [][3]any{{"gateway_receivable", int64(1000), "BRL"}, {"merchant_payable", int64(-1000), "USD"}}, true},
		{"balanced", [][3]any{{"gateway_receivable", int64(1000), "BRL"}, {"merchant_payable", int64(-1000), "BRL"}}, false},
	}
	for _, tc := range cases {
		tx, err := db.Pool.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		for _, p := range tc.postings {
			// The check is deferred: each insert succeeds on its own.
			if _, err := tx.Exec(ctx, `INSERT INTO ledger_postings (payment_key, version, account, amount_minor, currency)
				VALUES ('acme:pay_1', 1, $1, $2, $3)`, p[0], p[1], p[2]); err != nil {
				t.Fatalf("%s: insert %v: %v", tc.name, p, err)
			}
		}
		err = tx.Commit(ctx)
		switch {
		case tc.wantErr && sqlState(err) != checkViolation:
			t.Errorf("%s: commit = %v, want SQLSTATE %s", tc.name, err, checkViolation)
		case !tc.wantErr && err != nil:
			t.Errorf("%s: commit = %v, want success", tc.name, err)
		}
	}
	if n := count(t, db.Pool, "SELECT count(*) FROM ledger_postings"); n != 2 {
		t.Errorf("ledger_postings has %d rows, want only the balanced pair", n)
	}
}

// TestLedgerPostingIsUniquePerAccount: a second posting on the same
// (payment, version, account, currency) is refused, balanced or not.
func TestLedgerPostingIsUniquePerAccount(t *testing.T) {
	t.Parallel()
	db := testenv.NewDB(t)
	ctx := t.Context()
	seedTransition(t, db.Pool, "acme:pay_1", 1)
	insert := `INSERT INTO ledger_postings (payment_key, version, account, amount_minor, currency) VALUES ('acme:pay_1', 1, $1, $2, $3)`

	tx, err := db.Pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx) //nolint:errcheck // after Commit it is a no-op
	if _, err := tx.Exec(ctx, insert, "gateway_receivable", 500, "BRL"); err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, insert, "merchant_payable", -500, "BRL"); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatalf("balanced pair: %v", err)
	}

	// The same pair again is balanced, so only the unique key can refuse it.
	tx, err = db.Pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx) //nolint:errcheck // rolled back on purpose
	_, err = tx.Exec(ctx, insert, "gateway_receivable", 500, "BRL")
	if sqlState(err) != uniqueViolation {
		t.Fatalf("duplicate posting = %v, want SQLSTATE %s", err, uniqueViolation)
	}
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && pgErr.TableName != "ledger_postings" {
		t.Errorf("violation on table %q, want ledger_postings", pgErr.TableName)
	}

	// Another currency on the same account is another posting.
	err = pgx.BeginFunc(ctx, db.Pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, insert, "gateway_receivable", 7, "USD"); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, insert, "merchant_payable", -7, "USD")
		return err
	})
	if err != nil {
		t.Errorf("same accounts in another currency: %v", err)
	}
}

// TestInboxDedup: the partial unique index lets one first delivery own a
// (source, dedup_key) and refuses a second, while later deliveries pointing
// at the first (duplicate_of) are recorded; ON CONFLICT DO NOTHING on it
// inserts nothing.
func TestInboxDedup(t *testing.T) {
	t.Parallel()
	db := testenv.NewDB(t)
	ctx := t.Context()
	insert := `INSERT INTO inbox (source, dedup_key, payment_key, status, topic, partition, kafka_offset, received_at, duplicate_of)
		VALUES ('acme', 'evt_1', 'acme:pay_1', 'processed', 'raw', 0, $1, now(), $2) RETURNING id`

	var first int64
	if err := db.Pool.QueryRow(ctx, insert, 0, nil).Scan(&first); err != nil {
		t.Fatalf("first delivery: %v", err)
	}
	_, err := db.Pool.Exec(ctx, insert, 1, nil)
	if sqlState(err) != uniqueViolation {
		t.Fatalf("second first-delivery = %v, want SQLSTATE %s", err, uniqueViolation)
	}
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && pgErr.ConstraintName != "inbox_dedup" {
		t.Errorf("violated %q, want inbox_dedup", pgErr.ConstraintName)
	}
	var dup int64
	if err := db.Pool.QueryRow(ctx, insert, 2, first).Scan(&dup); err != nil {
		t.Fatalf("delivery recorded as duplicate_of the first: %v", err)
	}
	tag, err := db.Pool.Exec(ctx, `INSERT INTO inbox (source, dedup_key, payment_key, status, topic, partition, kafka_offset, received_at)
		VALUES ('acme', 'evt_1', 'acme:pay_1', 'received', 'raw', 0, 3, now())
		ON CONFLICT (source, dedup_key) WHERE duplicate_of IS NULL DO NOTHING`)
	if err != nil || tag.RowsAffected() != 0 {
		t.Errorf("ON CONFLICT DO NOTHING = %v, %d rows; want no error, 0 rows", err, tag.RowsAffected())
	}
	// Another source may use the same key.
	if _, err := db.Pool.Exec(ctx, `INSERT INTO inbox (source, dedup_key, payment_key, status, topic, partition, kafka_offset, received_at)
		VALUES ('other', 'evt_1', 'other:pay_1', 'processed', 'raw', 0, 4, now())`); err != nil {
		t.Errorf("same dedup key from another source: %v", err)
	}
	if n := count(t, db.Pool, "SELECT count(*) FROM inbox WHERE source = 'acme'"); n != 2 {
		t.Errorf("acme inbox rows = %d, want 2 (first delivery and its duplicate)", n)
	}
}

// seedTransition inserts the payment and transition ledger postings hang on.
func seedTransition(t *testing.T, pool *pgxpool.Pool, key string, version int64) {
	t.Helper()
	source, id, _ := strings.Cut(key, ":")
	_, err := pool.Exec(t.Context(), `
		INSERT INTO payments (payment_key, source, payment_id, status, version, state) VALUES ($1, $2, $3, 'paid', $4, '{}')
		ON CONFLICT (payment_key) DO NOTHING`, key, source, id, version)
	if err == nil {
		_, err = pool.Exec(t.Context(), `
			INSERT INTO payment_transitions (payment_key, version, from_status, to_status, kind) VALUES ($1, $2, '', 'paid', 'capture')`,
			key, version)
	}
	if err != nil {
		t.Fatalf("seed %s v%d: %v", key, version, err)
	}
}

// bareSchema creates an empty schema next to a testenv one (so it lives in
// the same test database, wherever testenv found it), drops it when the
// test ends, and returns a URL whose search_path is it.
func bareSchema(t *testing.T) string {
	t.Helper()
	db := testenv.NewDB(t)
	name := db.Schema + "_bare"
	if _, err := db.Pool.Exec(t.Context(), "CREATE SCHEMA "+pgx.Identifier{name}.Sanitize()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if _, err := db.Pool.Exec(ctx, "DROP SCHEMA "+pgx.Identifier{name}.Sanitize()+" CASCADE"); err != nil {
			t.Errorf("drop schema %s: %v", name, err)
		}
	})
	u, err := url.Parse(db.URL)
	if err != nil || u.Scheme == "" {
		t.Fatalf("testenv URL %q is not a URL (%v)", db.URL, err)
	}
	q := u.Query()
	q.Set("search_path", name)
	u.RawQuery = q.Encode()
	return u.String()
}

func openPool(t *testing.T, url string) *pgxpool.Pool {
	t.Helper()
	pool, err := pgxpool.New(t.Context(), url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return pool
}

func count(t *testing.T, pool *pgxpool.Pool, sql string) int {
	t.Helper()
	var n int
	if err := pool.QueryRow(t.Context(), sql).Scan(&n); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
	return n
}

func sqlState(err error) string {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		return pgErr.Code
	}
	return ""
}
