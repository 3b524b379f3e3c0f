package processor

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/paystream/paystream/internal/store"
	"github.com/paystream/paystream/internal/testenv"
)

// TestClassify is the decision table: only an error caused by the record's
// own data quarantines it; anything else stalls the partition (the batch is
// retried) under a low-cardinality class.
func TestClassify(t *testing.T) {
	t.Parallel()
	pg := func(code string) error { return fmt.Errorf("write effects: %w", &pgconn.PgError{Code: code}) }
	cases := []struct {
		name   string
		err    error
		poison bool
		class  string
	}{
		{"our own validation", poison("event %s: invalid fact", "e1"), true, classPoison},
		{"22P02 invalid text representation", pg("22P02"), true, classPoison},
		{"22021 invalid UTF-8 / NUL", pg("22021"), true, classPoison},
		{"22003 numeric out of range", pg("22003"), true, classPoison},
		{"23514 check violation (a movement of 0)", fmt.Errorf("write effects: %w",
			&pgconn.PgError{Code: "23514", TableName: "ledger_movements", ConstraintName: "ledger_movements_amount_minor_check"}), true, classPoison},
		{"23514 partition constraint (a partition attached meanwhile)", fmt.Errorf("write effects: %w",
			&pgconn.PgError{Code: "23514", TableName: "deliveries_default"}), false, classContention},
		{"23502 not null violation", pg("23502"), true, classPoison},
		{"23503 foreign key violation", pg("23503"), true, classPoison},
		{"54000 program limit (index row too large)", pg("54000"), true, classPoison},
		{"23505 unique violation: a racing writer", pg("23505"), false, classContention},
		{"40001 serialization failure", pg("40001"), false, classContention},
		{"40P01 deadlock", pg("40P01"), false, classContention},
		{"55P03 lock not available", pg("55P03"), false, classContention},
		{"57014 statement timeout", pg("57014"), false, classTimeout},
		{"context deadline", fmt.Errorf("lock partition offset: %w", context.DeadlineExceeded), false, classTimeout},
		{"42501 insufficient privilege", pg("42501"), false, classPermission},
		{"42P01 undefined table", pg("42P01"), false, classMissingObject},
		{"42703 undefined column", pg("42703"), false, classMissingObject},
		{"42883 undefined function", pg("42883"), false, classMissingObject},
		{"3F000 invalid schema", pg("3F000"), false, classMissingObject},
		{"42601 syntax error", pg("42601"), false, classMissingObject},
		{"08006 connection failure", pg("08006"), false, classConnection},
		{"57P01 admin shutdown", pg("57P01"), false, classConnection},
		{"25P03 idle in transaction timeout", pg("25P03"), false, classConnection},
		{"53100 disk full", pg("53100"), false, classResources},
		{"53300 too many connections", pg("53300"), false, classResources},
		{"55006 object in use", pg("55006"), false, classOther},
		{"58030 I/O error", pg("58030"), false, classOther},
		{"XX000 internal error", pg("XX000"), false, classOther},
		{"XX001 data corrupted", pg("XX001"), false, classOther},
		{"unknown SQLSTATE", pg("ZZ999"), false, classOther},
		{"malformed SQLSTATE", pg("2"), false, classOther},
		{"network error", fmt.Errorf("load deliveries: %w", &net.OpError{Op: "read", Err: errors.New("connection reset by peer")}), false, classConnection},
		{"unknown error", errors.New("something else"), false, classOther},
		{"unexpected EOF", io.ErrUnexpectedEOF, false, classOther},
	}
	for _, tc := range cases {
		f := classify(tc.err)
		if f.poison != tc.poison || f.class != tc.class {
			t.Errorf("%s: classify = {poison %v, class %s}, want {poison %v, class %s}", tc.name, f.poison, f.class, tc.poison, tc.class)
		}
		if got := isPoison(tc.err); got != tc.poison {
			t.Errorf("%s: isPoison = %v, want %v", tc.name, got, tc.poison)
		}
		if !f.poison && tc.class != classContention && tc.class != classOther && f.fix == "" {
			t.Errorf("%s: a stall of class %s names no fix", tc.name, f.class)
		}
	}
	for _, err := range []error{nil, context.Canceled, fmt.Errorf("commit: %w", ErrFenced)} {
		if isPoison(err) {
			t.Errorf("isPoison(%v) = true, want false", err)
		}
	}
}

// TestPartitionAttachedMeanwhileIsNotPoison reproduces on the real Postgres
// the check_violation a batch gets when retention attaches the delivery
// partition of the batch's day while the batch's INSERT runs: the
// statement routed its row with the partitions it started with (to the
// default partition), and the default partition's bounds changed under
// it. The record is not at fault and the retry routes it anew, so the
// failure must stall-and-retry, never quarantine. Before, every 23514 was
// poison: the record was quarantined and its payment held.
func TestPartitionAttachedMeanwhileIsNotPoison(t *testing.T) {
	t.Parallel()
	db := testenv.NewDB(t)
	ctx := t.Context()
	day := time.Date(2091, 3, 4, 0, 0, 0, 0, time.UTC) // no partition yet: the row goes to the default one
	gate := rand.Int64N(1<<31-1) + 1
	insert := `
		INSERT INTO deliveries (id, recorded_at, source, dedup_key, payment_key, status, topic, partition, kafka_offset, received_at)
		SELECT nextval('deliveries_id_seq'), $1, 'acme', 'evt_attach', 'acme:pay_attach', 'processed', 'raw', 0, 0, now()
		  FROM (SELECT pg_advisory_lock_shared($2)) AS gate`

	// The INSERT starts, then waits at the gate (an advisory lock the test
	// holds) after its executor set up routing and before it routes.
	holder, err := db.Pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer holder.Release()
	if _, err := holder.Exec(ctx, `SELECT pg_advisory_lock($1)`, gate); err != nil {
		t.Fatal(err)
	}
	inserted := make(chan error, 1)
	go func() {
		_, err := db.Pool.Exec(ctx, insert, day.Add(time.Hour), gate)
		inserted <- err
	}()
	testenv.WaitFor(t, 30*time.Second, func() error {
		var waiting bool
		if err := db.Pool.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_locks WHERE locktype = 'advisory' AND NOT granted AND objid = $1)`, gate).Scan(&waiting); err != nil {
			return err
		}
		if !waiting {
			return errors.New("the INSERT is not at the gate yet")
		}
		return nil
	})
	// Retention attaches the day's partition meanwhile.
	if _, err := store.CreatePartition(ctx, db.Pool, store.PartitionOf(day)); err != nil {
		t.Fatal(err)
	}
	if _, err := holder.Exec(ctx, `SELECT pg_advisory_unlock($1)`, gate); err != nil {
		t.Fatal(err)
	}
	err = <-inserted
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) || pgErr.Code != "23514" {
		t.Fatalf("INSERT racing the ATTACH: %v, want SQLSTATE 23514 (the race this test stands for did not happen)", err)
	}
	t.Logf("Postgres: %s (SQLSTATE %s, table %s, constraint %q)", pgErr.Message, pgErr.Code, pgErr.TableName, pgErr.ConstraintName)
	if f := classify(fmt.Errorf("write effects: %w", err)); f.poison || f.class != classContention {
		t.Errorf("classify = {poison %v, class %s}, want a retried stall of class %s", f.poison, f.class, classContention)
	}
	// The retry routes the row to the new partition.
	if _, err := db.Pool.Exec(ctx, insert, day.Add(time.Hour), gate); err != nil {
		t.Fatalf("retry: %v", err)
	}
	var part string
	if err := db.Pool.QueryRow(ctx, `SELECT tableoid::regclass::text FROM deliveries WHERE dedup_key = 'evt_attach'`).Scan(&part); err != nil {
		t.Fatal(err)
	}
	if want := store.PartitionOf(day).Name; part != want {
		t.Errorf("retried row is in %s, want %s", part, want)
	}
}
