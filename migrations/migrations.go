// Package migrations holds paystream's schema as numbered SQL files embedded in
// the binary. They are applied only when asked (paystream migrate), in order,
// each in its own transaction, under an advisory lock so that two migrators
// running at once apply each file exactly once.
package migrations

import (
	"context"
	"embed"
	"fmt"
	"io/fs"
	"slices"
	"sort"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

//go:embed *.sql
var files embed.FS

// lockKey is the advisory lock held while migrating ("paystrm" in ASCII).
const lockKey = 0x70617973747270

// Migration is one numbered SQL file.
type Migration struct {
	Version int
	Name    string
	SQL     string
}

// All returns the embedded migrations in version order.
func All() ([]Migration, error) {
	entries, err := fs.ReadDir(files, ".")
	if err != nil {
		return nil, fmt.Errorf("read embedded migrations: %w", err)
	}
	var out []Migration
	for _, e := range entries {
		num, _, ok := strings.Cut(e.Name(), "_")
		if !ok {
			return nil, fmt.Errorf("migration %q: name must be NNN_description.sql", e.Name())
		}
		v, err := strconv.Atoi(num)
		if err != nil {
			return nil, fmt.Errorf("migration %q: bad version: %w", e.Name(), err)
		}
		body, err := files.ReadFile(e.Name())
		if err != nil {
			return nil, fmt.Errorf("read migration %q: %w", e.Name(), err)
		}
		out = append(out, Migration{Version: v, Name: e.Name(), SQL: string(body)})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Version < out[j].Version })
	for i := 1; i < len(out); i++ {
		if out[i].Version == out[i-1].Version {
			return nil, fmt.Errorf("migrations %q and %q share version %d", out[i-1].Name, out[i].Name, out[i].Version)
		}
	}
	return out, nil
}

// Apply brings the database's schema (the connection's search_path) up to
// date and returns the names of the migrations it applied. It is idempotent
// and safe to run concurrently.
func Apply(ctx context.Context, pool *pgxpool.Pool) ([]string, error) {
	return ApplyTo(ctx, pool, 0)
}

// ApplyTo is Apply up to and including version (0: every migration), for
// tests that fill a database with an older schema before upgrading it.
func ApplyTo(ctx context.Context, pool *pgxpool.Pool, version int) ([]string, error) {
	all, err := All()
	if err != nil {
		return nil, err
	}
	if version > 0 {
		all = slices.DeleteFunc(all, func(m Migration) bool { return m.Version > version })
	}
	conn, err := pool.Acquire(ctx)
	if err != nil {
		return nil, fmt.Errorf("acquire connection: %w", err)
	}
	defer conn.Release()

	if _, err := conn.Exec(ctx, "SELECT pg_advisory_lock($1)", lockKey); err != nil {
		return nil, fmt.Errorf("take migration lock: %w", err)
	}
	defer conn.Exec(context.WithoutCancel(ctx), "SELECT pg_advisory_unlock($1)", lockKey) //nolint:errcheck // released with the session anyway

	if _, err := conn.Exec(ctx, `CREATE TABLE IF NOT EXISTS schema_migrations (
		version    integer PRIMARY KEY,
		name       text NOT NULL,
		applied_at timestamptz NOT NULL DEFAULT now())`); err != nil {
		return nil, fmt.Errorf("create schema_migrations: %w", err)
	}
	applied := map[int]bool{}
	rows, err := conn.Query(ctx, "SELECT version FROM schema_migrations")
	if err != nil {
		return nil, fmt.Errorf("list applied migrations: %w", err)
	}
	versions, err := pgx.CollectRows(rows, pgx.RowTo[int])
	if err != nil {
		return nil, fmt.Errorf("list applied migrations: %w", err)
	}
	for _, v := range versions {
		applied[v] = true
	}

	var done []string
	for _, m := range all {
		if applied[m.Version] {
			continue
		}
		// Read committed whatever the server's default: a step that locks
		// tables before reading them (version 4) must read what committed
		// until it got the locks.
		err := pgx.BeginTxFunc(ctx, conn, pgx.TxOptions{IsoLevel: pgx.ReadCommitted}, func(tx pgx.Tx) error {
			if before := beforeSQL[m.Version]; before != nil {
				if err := before(ctx, tx); err != nil {
					return err
				}
			}
			if _, err := tx.Exec(ctx, m.SQL); err != nil {
				return err
			}
			_, err := tx.Exec(ctx, "INSERT INTO schema_migrations (version, name) VALUES ($1, $2)", m.Version, m.Name)
			return err
		})
		if err != nil {
			return done, fmt.Errorf("apply migration %s: %w", m.Name, err)
		}
		done = append(done, m.Name)
	}
	return done, nil
}
