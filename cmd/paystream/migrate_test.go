package main

import (
	"context"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/paystream/paystream/internal/devpg"
	"github.com/paystream/paystream/internal/testenv"
)

// TestMigrateRefusesWALLevelReplica: against a server with wal_level =
// replica, `paystream migrate` exits 1 with one line saying what to set, and
// changes nothing: no table, no publication (so no processor can start
// writing state events that no replication slot keeps).
func TestMigrateRefusesWALLevelReplica(t *testing.T) {
	testenv.SkipIfShort(t)
	t.Parallel()
	// Not t.TempDir: when the tests run as root the server runs as the
	// postgres user, who must reach the data directory.
	dir, err := os.MkdirTemp("", "paystream-migrate-replica-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cluster, err := devpg.Start(ctx, devpg.Config{DataDir: dir, Settings: map[string]string{"wal_level": "replica"}, Replication: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if err := cluster.Stop(ctx); err != nil {
			t.Errorf("stop private cluster: %v", err)
		}
	})

	r := paystream.Run(t, []string{"PAYSTREAM_DATABASE_URL=" + cluster.URL()}, "migrate")
	lines := strings.Split(strings.TrimSpace(r.Stderr), "\n")
	t.Logf("migrate on wal_level=replica: exit %d, stderr %q", r.Code, r.Stderr)
	if r.Code != 1 || len(lines) != 1 {
		t.Fatalf("migrate: exit %d with %d stderr lines, want exit 1 and one line:\n%s", r.Code, len(lines), r.Stderr)
	}
	for _, want := range []string{"wal_level = logical", "max_replication_slots", "max_wal_senders", "restart Postgres", "it has wal_level = replica"} {
		if !strings.Contains(lines[0], want) {
			t.Errorf("migrate's error %q does not say %q", lines[0], want)
		}
	}

	conn, err := pgx.Connect(ctx, cluster.URL())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	var tables, publications int
	err = conn.QueryRow(ctx, `SELECT (SELECT count(*) FROM pg_tables WHERE schemaname = current_schema()),
		(SELECT count(*) FROM pg_publication)`).Scan(&tables, &publications)
	if err != nil {
		t.Fatal(err)
	}
	if tables != 0 || publications != 0 {
		t.Errorf("after the refusal: %d tables, %d publications; want migrate to change nothing", tables, publications)
	}
}
