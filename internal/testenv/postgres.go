package testenv

import (
	"context"
	"errors"
	"net/url"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/paystream/paystream/migrations"
)

// DB is a migrated schema of its own for one test.
type DB struct {
	// Pool's connections have the schema as their search_path, so
	// unqualified names resolve to the test's tables.
	Pool *pgxpool.Pool

	// URL connects to the same schema: it carries search_path as a query
	// parameter (or key=value setting), which pgx turns into a run-time
	// parameter. Hand it to subprocesses, e.g. as PAYSTREAM_DATABASE_URL.
	URL string

	// Schema is the schema's name, t_ and 16 random hex digits.
	Schema string
}

// NewDB creates a schema in the test database, applies the migrations to
// it and returns a pool confined to it. When the test ends, the pool is
// closed and the schema dropped with everything in it.
func NewDB(t testing.TB) *DB {
	t.Helper()
	SkipIfShort(t)
	base := databaseURL(t)
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()

	schema := "t_" + randomSuffix(8)
	admin, err := pgx.Connect(ctx, base)
	if err != nil {
		t.Fatalf("testenv: connect to the test database (%s): %v\n%s", redact(base), err, howToStart)
	}
	_, err = admin.Exec(ctx, "CREATE SCHEMA "+pgx.Identifier{schema}.Sanitize())
	admin.Close(context.WithoutCancel(ctx))
	if err != nil {
		t.Fatalf("testenv: create schema %s: %v", schema, err)
	}
	// Registered before the pool's Close, so it runs after it.
	t.Cleanup(func() { dropSchema(t, base, schema) })

	dsn := withSearchPath(base, schema)
	cfg, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		t.Fatalf("testenv: parse database URL: %v", err)
	}
	cfg.ConnConfig.RuntimeParams["search_path"] = schema
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatalf("testenv: open pool: %v", err)
	}
	t.Cleanup(pool.Close)

	if _, err := migrations.Apply(ctx, pool); err != nil {
		t.Fatalf("testenv: migrate schema %s: %v", schema, err)
	}
	return &DB{Pool: pool, URL: dsn, Schema: schema}
}

// Postgres is NewDB for tests that need only the pool.
func Postgres(t testing.TB) *pgxpool.Pool {
	t.Helper()
	return NewDB(t).Pool
}

func dropSchema(t testing.TB, base, schema string) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, base)
	if err != nil {
		t.Errorf("testenv: drop schema %s: connect: %v", schema, err)
		return
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, "DROP SCHEMA IF EXISTS "+pgx.Identifier{schema}.Sanitize()+" CASCADE"); err != nil {
		t.Errorf("testenv: drop schema %s: %v", schema, err)
	}
	dropReplication(ctx, t, conn, schema)
}

// dropReplication drops the sink's replication slots and publications of
// schema in conn's database, if a test made them: they belong to the
// database, not the schema, and a slot left behind keeps WAL forever. The
// names follow sink.SlotName ("paystream_", the database, the schema and a
// hash) or, for an earlier relay, "paystream_" and the schema; testenv's
// schema names (t_ and hex digits) need no cleaning.
func dropReplication(ctx context.Context, t testing.TB, conn *pgx.Conn, schema string) {
	rows, err := conn.Query(ctx, `
		SELECT slot_name FROM pg_replication_slots WHERE database = current_database() AND slot_name LIKE 'paystream\_%'
		UNION SELECT pubname FROM pg_publication WHERE pubname LIKE 'paystream\_%'`)
	var names []string
	if err == nil {
		names, err = pgx.CollectRows(rows, pgx.RowTo[string])
	}
	if err != nil {
		t.Errorf("testenv: list replication slots of schema %s: %v", schema, err)
		return
	}
	for _, name := range names {
		if !slotOfSchema(name, schema) {
			continue
		}
		// A relay still streaming holds the slot: end its WAL sender first.
		_, err := conn.Exec(ctx, `
			SELECT pg_terminate_backend(active_pid) FROM pg_replication_slots
			 WHERE slot_name = $1 AND active_pid IS NOT NULL`, name)
		if err == nil {
			err = dropSlot(ctx, conn, name)
		}
		if err == nil {
			_, err = conn.Exec(ctx, "DROP PUBLICATION IF EXISTS "+pgx.Identifier{name}.Sanitize())
		}
		if err != nil {
			t.Errorf("testenv: drop replication slot %s: %v", name, err)
		}
	}
}

// slotOfSchema reports whether name is a sink slot name of schema.
func slotOfSchema(name, schema string) bool {
	if name == "paystream_"+schema {
		return true
	}
	if i := len(name) - 9; i > 0 && name[i] == '_' && strings.Trim(name[i+1:], "0123456789abcdef") == "" {
		return strings.HasSuffix(name[:i], "_"+schema)
	}
	return false
}

// dropSlot drops slot name if it exists, waiting the moment a terminated
// WAL sender takes to release it.
func dropSlot(ctx context.Context, conn *pgx.Conn, name string) error {
	for delay := 10 * time.Millisecond; ; delay = min(2*delay, time.Second) {
		_, err := conn.Exec(ctx, `
			SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE slot_name = $1`, name)
		var pgErr *pgconn.PgError
		if err == nil || !errors.As(err, &pgErr) || pgErr.Code != "55006" { // object_in_use: still active
			return err
		}
		select {
		case <-ctx.Done():
			return err
		case <-time.After(delay):
		}
	}
}

// databaseURL returns the test database's URL: the environment's, else a
// container's.
func databaseURL(t testing.TB) string {
	t.Helper()
	SkipIfShort(t)
	if u := strings.TrimSpace(os.Getenv(EnvDatabaseURL)); u != "" {
		return u
	}
	u, err := postgresContainer()
	if err != nil {
		t.Fatalf("testenv: no Postgres for tests: %s is unset and %v\n%s", EnvDatabaseURL, err, howToStart)
	}
	return u
}

// withSearchPath adds search_path=schema to a connection string in either
// of the forms pgx accepts, replacing any search_path it had.
func withSearchPath(dsn, schema string) string {
	if strings.HasPrefix(dsn, "postgres://") || strings.HasPrefix(dsn, "postgresql://") {
		if u, err := url.Parse(dsn); err == nil {
			q := u.Query()
			q.Set("search_path", schema)
			u.RawQuery = q.Encode()
			return u.String()
		}
	}
	// key=value form: a later key overrides an earlier one.
	return strings.TrimSpace(dsn) + " search_path=" + schema
}

// redact drops the password from a URL-form connection string for messages.
func redact(dsn string) string {
	u, err := url.Parse(dsn)
	if err != nil || u.User == nil {
		if strings.Contains(dsn, "password") {
			return "(connection string with a password)"
		}
		return dsn
	}
	return u.Redacted()
}
