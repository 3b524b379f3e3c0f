package store_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/paystream/paystream/internal/envelope"
	"github.com/paystream/paystream/internal/payment"
	"github.com/paystream/paystream/internal/provider"
	"github.com/paystream/paystream/internal/store"
	"github.com/paystream/paystream/internal/testenv"
)

// A deployment starts with empty tables: every statement a batch prepares
// is first planned against a few rows. The key lookups in dedup_keys and
// payments must still use their primary keys once the tables have grown,
// before any ANALYZE, for small batches and full ones:
//
//   - with the plan cache's generic plan, made on the empty tables, each
//     batch read every row of both (bench-e2e: 780 dedup_keys rows per
//     delivery);
//   - with custom plans, a batch of 100 keys against tables of some
//     thousands of rows was planned as a hash join over a sequential scan
//     (bench-e2e: 412 scans of dedup_keys, 6 million rows, until the table
//     passed about 40,000 rows).
func TestKeyLookupsUseIndexesAfterTablesGrow(t *testing.T) {
	t.Parallel()
	db := testenv.NewDB(t)
	ctx := t.Context()
	conn, err := db.Pool.Acquire(ctx) // one session: its statement cache is what is tested
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Release()
	for _, sql := range []string{
		// No ANALYZE during the test: only the tables' size tells the
		// planner they grew.
		`ALTER TABLE dedup_keys SET (autovacuum_enabled = false)`,
		`ALTER TABLE payments SET (autovacuum_enabled = false)`,
		`INSERT INTO dedup_keys VALUES ('acme', 'evt_0', 1, now())`,
		`INSERT INTO payments (payment_key, source, payment_id, status, version, amount_minor, currency, state)
		 VALUES ('acme:pay_0', 'acme', 'pay_0', 'paid', 1, 100, 'BRL', '{}')`,
	} {
		if _, err := conn.Exec(ctx, sql); err != nil {
			t.Fatalf("%s: %v", sql, err)
		}
	}

	// A batch's reads and writes (a redelivery, a payment update), rolled
	// back: only the plans stay.
	batch := func(keys int) {
		t.Helper()
		dedup, payments := make([]store.DedupKey, keys), make([]string, keys)
		for i := range keys {
			dedup[i] = store.DedupKey{Source: "acme", Key: fmt.Sprintf("evt_%d", i*7)}
			payments[i] = fmt.Sprintf("acme:pay_%d", i*7)
		}
		tx, err := store.BeginBatch(ctx, conn, store.BatchLock{}, store.Reads{IDs: 1, Keys: dedup, Payments: payments})
		if err != nil {
			t.Fatalf("batch: %v", err)
		}
		defer tx.Rollback(ctx) //nolint:errcheck // rolled back on purpose: only the plans stay
		loaded := tx.Loaded
		first, known := loaded.Known[dedup[0]]
		if !known || first != 1 || !loaded.Payments[payments[0]].Found {
			t.Fatalf("stored key or payment not found: %+v", loaded)
		}
		now := time.Now().UTC()
		err = tx.Write(ctx, store.Writes{
			Deliveries: []store.Delivery{{ID: loaded.IDs[0], RecordedAt: now, Topic: "raw", Offset: 1, Duplicate: true, DuplicateOf: first,
				Envelope: envelope.Raw{Source: "acme", PaymentKey: payments[0], ReceivedAt: now, Event: provider.Event{DedupKey: dedup[0].Key}}}},
			Payments: []store.PaymentWrite{{Key: payments[0], Source: "acme", PaymentID: "pay_0",
				State: payment.State{Status: payment.StatusPaid, Version: 1, AmountMinor: 100, Currency: "BRL"}}},
		})
		if err != nil {
			t.Fatalf("batch: %v", err)
		}
	}
	// More than the plan cache's five custom plans before it settles on a
	// generic one, on the tiny tables.
	for range 10 {
		batch(30)
	}

	if _, err := conn.Exec(ctx, `
		INSERT INTO dedup_keys SELECT 'acme', 'evt_' || i, i, now() FROM generate_series(1, 15000) AS i;
		INSERT INTO payments (payment_key, source, payment_id, status, version, amount_minor, currency, state)
		SELECT 'acme:pay_' || i, 'acme', 'pay_' || i, 'paid', 1, 100, 'BRL', '{}' FROM generate_series(1, 15000) AS i`); err != nil {
		t.Fatal(err)
	}
	// Small batches, then full ones, on tables grown to where a hash join
	// over a sequential scan looks cheaper than 100 index probes.
	for _, keys := range []int{30, 100} {
		before := seqScans(t, conn)
		for range 5 {
			batch(keys)
		}
		after := seqScans(t, conn)
		for table, n := range after {
			if n.index == before[table].index {
				// Else the statistics were not flushed, and no count moved.
				t.Errorf("%s: no index scan counted for 5 batches: statistics not flushed", table)
			}
			if n.scans != before[table].scans {
				t.Errorf("%s: %d sequential scans (%d rows read) by 5 batches of %d keys, want none",
					table, n.scans-before[table].scans, n.rows-before[table].rows, keys)
			}
		}
	}
}

type scans struct{ scans, rows, index int64 }

// seqScans returns the sequential scans (and the index scans) of
// dedup_keys and payments so far, this session's included.
func seqScans(t *testing.T, conn *pgxpool.Conn) map[string]scans {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	// The session's counters reach the shared statistics when it is idle.
	if _, err := conn.Exec(ctx, `SELECT pg_stat_force_next_flush()`); err != nil {
		t.Fatal(err)
	}
	rows, err := conn.Query(ctx, `
		SELECT relname, seq_scan, seq_tup_read, COALESCE(idx_scan, 0) FROM pg_stat_user_tables
		 WHERE schemaname = current_schema() AND relname IN ('dedup_keys', 'payments')`)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]scans{}
	var name string
	var s scans
	if _, err := pgx.ForEachRow(rows, []any{&name, &s.scans, &s.rows, &s.index}, func() error { out[name] = s; return nil }); err != nil {
		t.Fatal(err)
	}
	if len(out) != 2 {
		t.Fatalf("statistics of %d tables, want 2", len(out))
	}
	return out
}
