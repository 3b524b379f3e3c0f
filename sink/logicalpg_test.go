package sink_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"net/url"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/paystream/paystream/internal/devpg"
	"github.com/paystream/paystream/internal/testenv"
)

// logicalSettings are the server settings the relay's tests need; the
// shared test stack gets them too once it runs wal_level = logical.
var logicalSettings = map[string]string{
	"wal_level":             "logical",
	"max_replication_slots": "64",
	"max_wal_senders":       "64",
}

// logicalDB returns a schema of its own, with the relay's slot and
// publication dropped when the test ends, on a server with wal_level =
// logical: the shared test database when it runs that, else a private
// cluster started once per test binary (see privateCluster).
func logicalDB(t *testing.T) *testenv.DB {
	t.Helper()
	testenv.SkipIfShort(t)
	var db *testenv.DB
	if sharedIsLogical(t) {
		db = testenv.NewDB(t)
	} else {
		db = schemaDB(t, privateCluster(t, "logical", logicalSettings))
	}
	t.Cleanup(func() { dropSlot(t, db.Pool, slotOf(db)) })
	return db
}

var shared struct {
	once    sync.Once
	logical bool
}

// sharedIsLogical reports whether the shared test database (the
// environment's) runs wal_level = logical.
func sharedIsLogical(t *testing.T) bool {
	shared.once.Do(func() {
		u := os.Getenv(testenv.EnvDatabaseURL)
		if u == "" {
			return
		}
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		conn, err := pgx.Connect(ctx, u)
		if err != nil {
			t.Logf("shared test database: %v; using a private cluster", err)
			return
		}
		defer conn.Close(ctx)
		var level string
		if err := conn.QueryRow(ctx, `SHOW wal_level`).Scan(&level); err == nil {
			shared.logical = level == "logical"
		}
	})
	return shared.logical
}

// clusters are the private clusters of the test binary, by name; TestMain
// stops them.
var clusters = struct {
	sync.Mutex
	m map[string]*clusterOnce
}{m: map[string]*clusterOnce{}}

type clusterOnce struct {
	once sync.Once
	c    *devpg.Cluster
	dir  string
	err  error
}

// privateCluster returns the private cluster name, started at first use
// with settings, on a free port, its paystream role allowed to replicate.
func privateCluster(t *testing.T, name string, settings map[string]string) *devpg.Cluster {
	t.Helper()
	clusters.Lock()
	co := clusters.m[name]
	if co == nil {
		co = &clusterOnce{}
		clusters.m[name] = co
	}
	clusters.Unlock()
	co.once.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		if co.dir, co.err = os.MkdirTemp("", "paystream-sink-pg-"); co.err != nil {
			return
		}
		co.c, co.err = devpg.Start(ctx, devpg.Config{DataDir: co.dir, Settings: settings, Replication: true})
	})
	if co.err != nil {
		t.Fatalf("private Postgres cluster %s: %v", name, co.err)
	}
	return co.c
}

// stopClusters stops the private clusters and removes their data.
func stopClusters() {
	clusters.Lock()
	defer clusters.Unlock()
	for _, co := range clusters.m {
		if co.c != nil {
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			if err := co.c.Stop(ctx); err != nil {
				os.Stderr.WriteString("stop private cluster: " + err.Error() + "\n")
			}
			cancel()
		}
		if co.dir != "" {
			_ = os.RemoveAll(co.dir)
		}
	}
}

// schemaDB is testenv.NewDB on the private cluster c: a schema of its own,
// dropped when the test ends, and a pool confined to it. The relay
// needs no tables, so it is not migrated.
func schemaDB(t *testing.T, c *devpg.Cluster) *testenv.DB {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	suffix := make([]byte, 8)
	_, _ = rand.Read(suffix)
	schema := "t_" + hex.EncodeToString(suffix)
	admin, err := pgx.Connect(ctx, c.URL())
	if err != nil {
		t.Fatal(err)
	}
	_, err = admin.Exec(ctx, "CREATE SCHEMA "+pgx.Identifier{schema}.Sanitize())
	admin.Close(ctx)
	if err != nil {
		t.Fatalf("create schema %s: %v", schema, err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if conn, err := pgx.Connect(ctx, c.URL()); err == nil {
			_, _ = conn.Exec(ctx, "DROP SCHEMA IF EXISTS "+pgx.Identifier{schema}.Sanitize()+" CASCADE")
			conn.Close(ctx)
		}
	})
	u, _ := url.Parse(c.URL())
	q := u.Query()
	q.Set("search_path", schema)
	u.RawQuery = q.Encode()
	pool, err := pgxpool.New(ctx, u.String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return &testenv.DB{Pool: pool, URL: u.String(), Schema: schema}
}

// dropSlot drops slot and its publication once no relay streams it (a
// killed relay's walsender may take a moment to notice).
func dropSlot(t *testing.T, pool *pgxpool.Pool, slot string) {
	ctx := context.Background()
	testenv.WaitFor(t, 30*time.Second, func() error {
		_, err := pool.Exec(ctx, `SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE slot_name = $1`, slot)
		return err
	})
	if _, err := pool.Exec(ctx, "DROP PUBLICATION IF EXISTS "+pgx.Identifier{slot}.Sanitize()); err != nil {
		t.Errorf("drop publication %s: %v", slot, err)
	}
}
