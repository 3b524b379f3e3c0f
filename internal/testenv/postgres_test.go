package testenv

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/paystream/paystream/migrations"
)

func schemaExists(t *testing.T, schema string) bool {
	t.Helper()
	conn, err := pgx.Connect(t.Context(), databaseURL(t))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	var exists bool
	if err := conn.QueryRow(t.Context(), "SELECT EXISTS (SELECT 1 FROM pg_namespace WHERE nspname = $1)", schema).Scan(&exists); err != nil {
		t.Fatal(err)
	}
	return exists
}

func TestNewDB(t *testing.T) {
	SkipIfShort(t)
	t.Parallel()

	t.Run("AppliesMigrationsInItsOwnSchema", func(t *testing.T) {
		t.Parallel()
		db := NewDB(t)

		var current string
		if err := db.Pool.QueryRow(t.Context(), "SELECT current_schema()").Scan(&current); err != nil {
			t.Fatal(err)
		}
		if current != db.Schema {
			t.Fatalf("current_schema() = %q, want %q", current, db.Schema)
		}
		all, err := migrations.All()
		if err != nil {
			t.Fatal(err)
		}
		var applied int
		if err := db.Pool.QueryRow(t.Context(), "SELECT count(*) FROM schema_migrations").Scan(&applied); err != nil {
			t.Fatal(err)
		}
		if applied != len(all) || applied == 0 {
			t.Fatalf("%d migrations applied, want all %d", applied, len(all))
		}
		var payments *string
		if err := db.Pool.QueryRow(t.Context(), "SELECT to_regclass($1)::text", db.Schema+".payments").Scan(&payments); err != nil {
			t.Fatal(err)
		}
		if payments == nil {
			t.Fatalf("no payments table in schema %s", db.Schema)
		}
	})

	t.Run("IsolatesSchemas", func(t *testing.T) {
		t.Parallel()
		a, b := NewDB(t), NewDB(t)
		if a.Schema == b.Schema {
			t.Fatalf("two DBs share schema %s", a.Schema)
		}

		if _, err := a.Pool.Exec(t.Context(), `INSERT INTO consumer_offsets (group_id, topic, partition, next_offset) VALUES ('g', 't', 0, 42)`); err != nil {
			t.Fatal(err)
		}
		var inA, inB int
		if err := a.Pool.QueryRow(t.Context(), "SELECT count(*) FROM consumer_offsets").Scan(&inA); err != nil {
			t.Fatal(err)
		}
		if err := b.Pool.QueryRow(t.Context(), "SELECT count(*) FROM consumer_offsets").Scan(&inB); err != nil {
			t.Fatal(err)
		}
		if inA != 1 || inB != 0 {
			t.Fatalf("rows: %d in the schema written to, %d in the other; want 1 and 0", inA, inB)
		}
	})

	t.Run("URLLandsInTheSchema", func(t *testing.T) {
		t.Parallel()
		db := NewDB(t)

		// As a subprocess would: a plain pool from the URL alone.
		pool, err := pgxpool.New(t.Context(), db.URL)
		if err != nil {
			t.Fatal(err)
		}
		defer pool.Close()
		var current string
		if err := pool.QueryRow(t.Context(), "SELECT current_schema()").Scan(&current); err != nil {
			t.Fatal(err)
		}
		if current != db.Schema {
			t.Fatalf("URL %s lands in schema %q, want %q", db.URL, current, db.Schema)
		}
		var applied int
		if err := pool.QueryRow(t.Context(), "SELECT count(*) FROM schema_migrations").Scan(&applied); err != nil {
			t.Fatal(err)
		}
		if applied == 0 {
			t.Fatal("no migrations visible through the URL")
		}
	})

	t.Run("CleanupDropsTheSchema", func(t *testing.T) {
		t.Parallel()
		var schema string
		t.Run("Inner", func(t *testing.T) { // not parallel: t.Run returns after its cleanup
			schema = NewDB(t).Schema
			if !schemaExists(t, schema) {
				t.Fatalf("schema %s missing while the test runs", schema)
			}
		})
		if schema == "" {
			t.Fatal("inner test made no DB")
		}
		if schemaExists(t, schema) {
			t.Fatalf("schema %s still exists after its test ended", schema)
		}
	})

	t.Run("PostgresReturnsAMigratedPool", func(t *testing.T) {
		t.Parallel()
		pool := Postgres(t)
		var applied int
		if err := pool.QueryRow(t.Context(), "SELECT count(*) FROM schema_migrations").Scan(&applied); err != nil {
			t.Fatal(err)
		}
		if applied == 0 {
			t.Fatal("Postgres returned an unmigrated pool")
		}
	})
}

func TestWithSearchPath(t *testing.T) {
	t.Parallel()

	for _, tt := range []struct {
		in, want string
	}{
		{"postgres://u@h:5432/db", "postgres://u@h:5432/db?search_path=t_x"},
		{"postgresql://u:p@h/db?sslmode=disable", "postgresql://u:p@h/db?search_path=t_x&sslmode=disable"},
		{"postgres://u@h/db?search_path=public&sslmode=disable", "postgres://u@h/db?search_path=t_x&sslmode=disable"},
		{"host=h dbname=db", "host=h dbname=db search_path=t_x"},
	} {
		got := withSearchPath(tt.in, "t_x")
		if got != tt.want {
			t.Errorf("withSearchPath(%q) = %q, want %q", tt.in, got, tt.want)
		}
		cfg, err := pgx.ParseConfig(got)
		if err != nil {
			t.Errorf("pgx cannot parse %q: %v", got, err)
			continue
		}
		if sp := cfg.RuntimeParams["search_path"]; sp != "t_x" {
			t.Errorf("pgx reads search_path %q from %q, want t_x", sp, got)
		}
	}
}
