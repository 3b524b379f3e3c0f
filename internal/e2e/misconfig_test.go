package e2e

import (
	"context"
	"log/slog"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/paystream/paystream/internal/testenv"
	"github.com/paystream/paystream/processor"
)

// processorRole creates a login role for the test that may do what a
// processor does in db's schema, and returns a pool connecting as it. The
// role is dropped when the test ends.
func processorRole(t *testing.T, db *testenv.DB) (string, *pgxpool.Pool) {
	t.Helper()
	ctx := context.Background()
	role := strings.Replace(db.Schema, "t_", "r_", 1)
	const password = "processor-test" //nolint:gosec // a throwaway role of the test
	ident := pgx.Identifier{role}.Sanitize()
	schema := pgx.Identifier{db.Schema}.Sanitize()
	for _, stmt := range []string{
		"CREATE ROLE " + ident + " LOGIN PASSWORD '" + password + "'",
		"GRANT USAGE ON SCHEMA " + schema + " TO " + ident,
		"GRANT SELECT, INSERT, UPDATE ON ALL TABLES IN SCHEMA " + schema + " TO " + ident,
		"GRANT USAGE, SELECT, UPDATE ON ALL SEQUENCES IN SCHEMA " + schema + " TO " + ident,
	} {
		if _, err := db.Pool.Exec(ctx, stmt); err != nil {
			t.Fatalf("%s: %v", stmt, err)
		}
	}
	t.Cleanup(func() {
		// Before the schema is dropped (cleanups run last first): the
		// role's grants go with DROP OWNED.
		for _, stmt := range []string{"DROP OWNED BY " + ident, "DROP ROLE " + ident} {
			if _, err := db.Pool.Exec(context.Background(), stmt); err != nil {
				t.Errorf("%s: %v", stmt, err)
			}
		}
	})
	u, err := url.Parse(db.URL)
	if err != nil {
		t.Fatal(err)
	}
	u.User = url.UserPassword(role, password)
	cfg, err := pgxpool.ParseConfig(u.String())
	if err != nil {
		t.Fatal(err)
	}
	cfg.ConnConfig.RuntimeParams["search_path"] = db.Schema
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return ident, pool
}

// TestMisconfigurationStallsInsteadOfQuarantining: the processor connects
// as its own role; mid-run the role loses INSERT on ledger_postings (a bad
// GRANT). That is not the records' fault: nothing is quarantined and no
// payment is held; the partitions stall, retrying, and the stall shows in
// paystream_processor_batch_failures_total{class="permission"} and in an
// error log naming SQLSTATE 42501 and the fix. Granted back, everything
// flows, each event applied exactly once. (Before, every SQLSTATE outside
// a short transient list was poison: each record that moved money was
// quarantined and its payment held.)
func TestMisconfigurationStallsInsteadOfQuarantining(t *testing.T) {
	db := testenv.NewDB(t)
	brokers := testenv.Kafka(t)
	raw := testenv.Topic(t, "raw", 3)
	group := testenv.Group(t)
	role, pool := processorRole(t, db)
	ctx := context.Background()

	hs := genHistories(80)
	first, second := hs[:40], hs[40:]
	testenv.Produce(t, brokers, historyRecords(t, raw, first)...)

	reg := prometheus.NewRegistry()
	var logs testenv.SyncBuffer
	logger := slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelWarn}))
	runProcessor(t, pool, processor.Config{Brokers: brokers, Topic: raw, Group: group, Registerer: reg, Logger: logger,
		RetryBackoffMax: 500 * time.Millisecond})
	waitCaughtUp(t, db.Pool, brokers, group, raw, 60*time.Second)
	checkExactlyOnce(t, db.Pool, first)

	if _, err := db.Pool.Exec(ctx, "REVOKE INSERT ON ledger_movements FROM "+role); err != nil {
		t.Fatal(err)
	}
	testenv.Produce(t, brokers, historyRecords(t, raw, second)...)
	ends := testenv.EndOffsets(t, brokers, raw)
	// Enough failed attempts that a quarantine, had there been one, is
	// committed: the old code quarantined on the first failure.
	stalled := func() float64 {
		return testenv.Gather(t, reg).Sum("paystream_processor_batch_failures_total", map[string]string{"class": "permission"})
	}
	testenv.Eventually(t, 60*time.Second, func() bool {
		return stalled() >= 6 || takeEffects(t, db.Pool).quarantined > 0
	}, "the processor to stall on the missing privilege (or quarantine)")
	e := takeEffects(t, db.Pool)
	t.Logf("while INSERT was revoked: %d quarantined, %d held, %.0f permission failures", e.quarantined, e.held, stalled())
	if e.quarantined != 0 || e.held != 0 {
		t.Errorf("a missing privilege quarantined %d events and held %d payments, want none", e.quarantined, e.held)
	}
	if err := testenv.OffsetsBehind(t, db.Pool, group, raw, ends); err == nil {
		t.Errorf("the partitions did not stall without INSERT on ledger_postings")
	}
	if s := logs.String(); !strings.Contains(s, "sqlstate=42501") || !strings.Contains(s, "class=permission") || !strings.Contains(s, "fix=") {
		t.Errorf("no error log naming SQLSTATE 42501, the class and a fix; logs:\n%s", s)
	}

	if _, err := db.Pool.Exec(ctx, "GRANT INSERT ON ledger_movements TO "+role); err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, 60*time.Second, func() error { return testenv.OffsetsBehind(t, db.Pool, group, raw, ends) })
	checkExactlyOnce(t, db.Pool, hs)
}
