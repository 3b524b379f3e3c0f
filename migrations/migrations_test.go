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

	"github.com/paystream/paystream/internal/ledger"
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
		if n := count(t, pools[0], "SELECT count(*) FROM ledger_movements"); n != 0 {
			t.Errorf("fresh ledger_movements has %d rows", n)
		}
	}
}

// TestLedgerMovementConstraints: a movement is balanced by construction;
// the table refuses what would make one meaningless (a zero or negative
// amount, the same account on both sides, a currency that is not three
// upper-case letters), and a second movement with the same (payment,
// version, movement). No trigger is involved.
func TestLedgerMovementConstraints(t *testing.T) {
	t.Parallel()
	db := testenv.NewDB(t)
	ctx := t.Context()
	seedTransition(t, db.Pool, "acme:pay_1", 1)
	insert := `INSERT INTO ledger_movements (payment_key, version, movement, debit_account, credit_account, amount_minor, currency)
		VALUES ('acme:pay_1', 1, $1, $2, $3, $4, $5)`
	cases := []struct {
		name          string
		movement      int
		debit, credit string
		amount        int64
		currency      string
		want          string // SQLSTATE, "" for success
	}{
		{"zero amount", 0, "gateway_receivable", "merchant_payable", 0, "BRL", checkViolation},
		{"negative amount", 0, "gateway_receivable", "merchant_payable", -5, "BRL", checkViolation},
		{"same account", 0, "gateway_receivable", "gateway_receivable", 5, "BRL", checkViolation},
		{"bad currency", 0, "gateway_receivable", "merchant_payable", 5, "brl", checkViolation},
		{"capture", 0, "gateway_receivable", "merchant_payable", 1000, "BRL", ""},
		{"same movement again", 0, "gateway_receivable", "merchant_payable", 1000, "BRL", uniqueViolation},
		{"next movement", 1, "merchant_payable", "dispute_reserve", 300, "BRL", ""},
	}
	for _, tc := range cases {
		_, err := db.Pool.Exec(ctx, insert, tc.movement, tc.debit, tc.credit, tc.amount, tc.currency)
		if got := sqlState(err); got != tc.want || (tc.want == "" && err != nil) {
			t.Errorf("%s: %v, want SQLSTATE %q", tc.name, err, tc.want)
		}
	}
	// The postings view has two legs per movement and sums to zero.
	if n := count(t, db.Pool, "SELECT count(*) FROM ledger_postings"); n != 4 {
		t.Errorf("ledger_postings has %d rows, want 4", n)
	}
	if n := count(t, db.Pool, "SELECT COALESCE(sum(amount_minor), 0) FROM ledger_postings"); n != 0 {
		t.Errorf("ledger_postings sums to %d, want 0", n)
	}
}

// TestDedupKeys: one (source, dedup_key) is stored once: a second insert
// is a unique violation, ON CONFLICT DO NOTHING inserts nothing, and
// another source may use the same key.
func TestDedupKeys(t *testing.T) {
	t.Parallel()
	db := testenv.NewDB(t)
	ctx := t.Context()
	insert := `INSERT INTO dedup_keys (source, dedup_key, delivery_id, recorded_at) VALUES ($1, 'evt_1', $2, now())`
	if _, err := db.Pool.Exec(ctx, insert, "acme", 1); err != nil {
		t.Fatalf("first delivery: %v", err)
	}
	_, err := db.Pool.Exec(ctx, insert, "acme", 2)
	if sqlState(err) != uniqueViolation {
		t.Fatalf("second first-delivery = %v, want SQLSTATE %s", err, uniqueViolation)
	}
	tag, err := db.Pool.Exec(ctx, insert+` ON CONFLICT DO NOTHING`, "acme", 3)
	if err != nil || tag.RowsAffected() != 0 {
		t.Errorf("ON CONFLICT DO NOTHING = %v, %d rows; want no error, 0 rows", err, tag.RowsAffected())
	}
	if _, err := db.Pool.Exec(ctx, insert, "other", 4); err != nil {
		t.Errorf("same dedup key from another source: %v", err)
	}
}

// TestDeliveriesWithoutPartition: a delivery recorded on a day without a
// partition lands in the default partition instead of failing (a failure
// there would be a check violation, which the processor treats as poison).
func TestDeliveriesWithoutPartition(t *testing.T) {
	t.Parallel()
	db := testenv.NewDB(t)
	_, err := db.Pool.Exec(t.Context(), `
		INSERT INTO deliveries (id, recorded_at, source, dedup_key, payment_key, status, topic, partition, kafka_offset, received_at)
		VALUES (nextval('deliveries_id_seq'), now() + interval '400 days', 'acme', 'evt_1', 'acme:pay_1', 'processed', 'raw', 0, 0, now())`)
	if err != nil {
		t.Fatal(err)
	}
	if n := count(t, db.Pool, "SELECT count(*) FROM deliveries_default"); n != 1 {
		t.Errorf("default partition has %d rows, want 1", n)
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

// TestUpgradeConvertsPostingsToMovements: migration 004 turns stored
// postings into exactly the movements ledger.Movements makes of them,
// three-legged entries and two currencies included, and drops nothing.
func TestUpgradeConvertsPostingsToMovements(t *testing.T) {
	t.Parallel()
	pool := openPool(t, bareSchema(t))
	ctx := t.Context()
	if _, err := migrations.ApplyTo(ctx, pool, 3); err != nil {
		t.Fatal(err)
	}
	entries := map[int64][]ledger.Posting{
		1: {{Account: "gateway_receivable", AmountMinor: 1000, Currency: "BRL"}, {Account: "merchant_payable", AmountMinor: -1000, Currency: "BRL"}},
		2: {{Account: "gateway_receivable", AmountMinor: -400, Currency: "BRL"}, {Account: "merchant_payable", AmountMinor: 100, Currency: "BRL"},
			{Account: "dispute_reserve", AmountMinor: 300, Currency: "BRL"}},
		3: {{Account: "a", AmountMinor: 5, Currency: "USD"}, {Account: "b", AmountMinor: -5, Currency: "USD"},
			{Account: "a", AmountMinor: -7, Currency: "BRL"}, {Account: "c", AmountMinor: 7, Currency: "BRL"}},
	}
	seedTransition(t, pool, "acme:pay_1", 1)
	for v, ps := range entries {
		if v > 1 {
			if _, err := pool.Exec(ctx, `INSERT INTO payment_transitions (payment_key, version, from_status, to_status, kind) VALUES ('acme:pay_1', $1, 'paid', 'paid', 'x')`, v); err != nil {
				t.Fatal(err)
			}
		}
		// One transaction per entry: the old schema checks balance at commit.
		err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			for _, p := range ps {
				if _, err := tx.Exec(ctx, `INSERT INTO ledger_postings (payment_key, version, account, amount_minor, currency) VALUES ('acme:pay_1', $1, $2, $3, $4)`,
					v, p.Account, p.AmountMinor, p.Currency); err != nil {
					return err
				}
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	if _, err := migrations.Apply(ctx, pool); err != nil {
		t.Fatal(err)
	}
	for v, ps := range entries {
		want, err := ledger.Movements(ps)
		if err != nil {
			t.Fatal(err)
		}
		rows, err := pool.Query(ctx, `SELECT debit_account, credit_account, amount_minor, currency FROM ledger_movements
			WHERE payment_key = 'acme:pay_1' AND version = $1 ORDER BY movement`, v)
		if err != nil {
			t.Fatal(err)
		}
		got, err := pgx.CollectRows(rows, pgx.RowToStructByPos[ledger.Movement])
		if err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(got, want) {
			t.Errorf("version %d: movements %+v, want %+v", v, got, want)
		}
	}
}
