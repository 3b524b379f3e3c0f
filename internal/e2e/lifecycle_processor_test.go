package e2e

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/paystream/paystream/internal/testenv"
)

// processorGrace is the processor's terminationGracePeriodSeconds in
// deploy/k8s/base/processor.yaml: the kubelet SIGKILLs it after that.
const processorGrace = 60 * time.Second

// TestProcessorSIGTERMUnderLoad runs `paystream processor` (the binary)
// while raw records keep arriving, sends it SIGTERM mid-load, twice,
// restarting it each time, and checks each stop: exit status 0 within the
// manifests' grace period, "processor stopped" logged and no error, and
// the group's Kafka offsets equal to the offsets stored in Postgres (the
// copy at shutdown). Throughout, stored offsets never go backwards and
// never disagree with the deliveries (a batch is whole or absent). After
// the last processor drained the topic: every record is a delivery once,
// every event's effects (transitions, ledger movements, balances) are
// there once, and a read_committed consumer of the state topic sees every
// state event once, in order.
func TestProcessorSIGTERMUnderLoad(t *testing.T) {
	testenv.SkipIfShort(t)
	db := testenv.NewDB(t)
	brokers := testenv.Kafka(t)
	raw, state := testenv.Topic(t, "raw", 3), testenv.Topic(t, "state", 3)
	group := testenv.Group(t)
	runSink(t, db.Pool, brokers, state)
	watch := watchOffsets(t, db.Pool, group, raw)

	// At most 12,000 records, 20 every 30 ms (about 650/s) until stopped.
	hs := genHistories(3000)
	prod := producePaced(t, brokers, raw, hs, 5, 30*time.Millisecond)
	// The processor's sessions are named app, so the test sees when one
	// is inside a transaction.
	app := "paystream-sigterm-" + strings.TrimPrefix(group, "g-")
	args := []string{"processor", "--kafka-brokers", strings.Join(brokers, ","), "--database-url", withAppName(t, db.URL, app),
		"--raw-topic", raw, "--group", group, "--batch-max-records", "10", "--session-timeout", "6s",
		"--log-format", "json"}

	for n := range 2 {
		p := startBin(t, fmt.Sprintf("paystream processor %d", n), args...)
		from := deliveries(t, db.Pool)
		testenv.Eventually(t, 2*time.Minute, func() bool { return deliveries(t, db.Pool) >= from+400 },
			"processor %d to store 400 deliveries", n)
		// Signal while a batch transaction is open, as far as a poll can tell.
		waitInTransaction(t, db.Pool, app, time.Minute)
		atSignal, produced, flowing := deliveries(t, db.Pool), prod.records.Load(), prod.flowing()
		took := p.terminate(t, processorGrace)
		if !p.logged(t, "processor stopped") {
			t.Errorf("processor %d exited without logging \"processor stopped\"", n)
		}
		checkOffsetsCopied(t, db.Pool, brokers, group, raw)
		t.Logf("processor %d: SIGTERM with %d deliveries stored of %d records produced (producer still producing: %v); exited 0 after %s; %d deliveries stored by then",
			n, atSignal, produced, flowing, took.Round(time.Millisecond), deliveries(t, db.Pool))
	}

	last := startBin(t, "paystream processor 2", args...)
	done := prod.stop(t, hs)
	total := len(done) * 4
	drainStart := time.Now()
	waitCaughtUp(t, db.Pool, brokers, group, raw, 5*time.Minute)
	t.Logf("%d payments, %d records produced; the last processor caught up %s after the producer stopped",
		len(done), total, time.Since(drainStart).Round(time.Millisecond))
	watch.check(t)

	if n := count(t, db.Pool, `SELECT count(*) FROM deliveries`); n != total {
		t.Errorf("%d deliveries, want %d (one per record)", n, total)
	}
	if n := count(t, db.Pool, `SELECT count(DISTINCT (topic, partition, kafka_offset)) FROM deliveries`); n != total {
		t.Errorf("%d distinct record offsets among the deliveries, want %d", n, total)
	}
	if n := count(t, db.Pool, `SELECT count(*) FROM deliveries WHERE reason = 'duplicate_event'`); n != len(done) {
		t.Errorf("%d deliveries ignored as duplicate_event, want %d (one redelivery per payment)", n, len(done))
	}
	recs := checkPipelineOnce(t, db, brokers, state, done, 2*time.Minute)
	t.Logf("%d state events on the topic for read_committed consumers", len(recs))
	last.terminate(t, processorGrace)
}

// waitInTransaction returns once a session named app is inside a
// transaction, polling without pause (a batch transaction lasts
// milliseconds), and fails the test if none is within bound.
func waitInTransaction(t *testing.T, pool *pgxpool.Pool, app string, bound time.Duration) {
	t.Helper()
	for deadline := time.Now().Add(bound); time.Now().Before(deadline); {
		var open bool
		err := pool.QueryRow(context.Background(), `
			SELECT EXISTS (SELECT FROM pg_stat_activity
			                WHERE application_name = $1 AND state IN ('active', 'idle in transaction') AND xact_start IS NOT NULL)`,
			app).Scan(&open)
		if err != nil {
			t.Fatal(err)
		}
		if open {
			return
		}
	}
	t.Fatalf("no session named %s inside a transaction within %s", app, bound)
}

// checkOffsetsCopied fails the test unless the group's offsets in Kafka
// equal those stored in Postgres for every partition that has one: what a
// processor copies when it stops.
func checkOffsetsCopied(t *testing.T, pool *pgxpool.Pool, brokers []string, group, topic string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	fetched, err := testenv.Admin(t, brokers).FetchOffsets(ctx, group)
	if err == nil {
		err = fetched.Error()
	}
	if err != nil {
		t.Fatalf("fetch offsets of group %s: %v", group, err)
	}
	for p, stored := range testenv.StoredOffsets(t, pool, group, topic) {
		o, ok := fetched.Lookup(topic, p)
		if !ok && stored == 0 {
			// Claimed fresh and nothing applied yet (a short-lived
			// processor may not reach a partition whose records come
			// last in its first, backlogged fetch): no position to copy.
			continue
		}
		if !ok || o.At != stored {
			t.Errorf("partition %d: offset in Kafka %d (committed: %v), in Postgres %d", p, o.At, ok, stored)
		}
	}
}
