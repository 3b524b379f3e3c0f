package e2e

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/paystream/paystream/internal/testenv"
	"github.com/paystream/paystream/migrations"
	"github.com/paystream/paystream/processor"
	"github.com/paystream/paystream/sink"
)

// relayRun is a sink relay in the test process with a registry of its own.
type relayRun struct {
	*testenv.Service
	reg *prometheus.Registry
}

// startRelay runs a relay on pool (whose slot must exist, or be lost) until
// the returned service is stopped.
func startRelay(t *testing.T, pool *pgxpool.Pool, brokers []string, state, ckpt string) *relayRun {
	t.Helper()
	return startRelayWith(t, pool, sink.Config{Brokers: brokers, Topic: state, CheckpointTopic: ckpt})
}

// startRelayWith runs a relay on pool with cfg's topics, the test's logger,
// a registry of its own and short retries.
func startRelayWith(t *testing.T, pool *pgxpool.Pool, cfg sink.Config) *relayRun {
	t.Helper()
	reg := prometheus.NewRegistry()
	cfg.MaxBatchDelay, cfg.HeartbeatInterval = 5*time.Millisecond, time.Second
	cfg.StandbyRetry, cfg.LostSlotRetry = 100*time.Millisecond, 200*time.Millisecond
	cfg.Logger, cfg.Registerer = testLogger(t), reg
	relay, err := sink.New(pool, cfg)
	if err != nil {
		t.Fatal(err)
	}
	return &relayRun{Service: testenv.Start(t, "sink", relay.Run), reg: reg}
}

// gauge reads the value of an unlabelled gauge of r.
func (r *relayRun) gauge(t *testing.T, name string) float64 {
	t.Helper()
	mfs, err := r.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == name && len(mf.GetMetric()) == 1 {
			return mf.GetMetric()[0].GetGauge().GetValue()
		}
	}
	t.Fatalf("relay has no gauge %s", name)
	return 0
}

// walReceiver returns the pid of the standby's WAL receiver.
func walReceiver(t *testing.T, standbyURL string) int {
	t.Helper()
	conn, err := pgx.Connect(t.Context(), standbyURL)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	var pid int
	testenv.WaitFor(t, 30*time.Second, func() error {
		return conn.QueryRow(t.Context(), `SELECT pid FROM pg_stat_wal_receiver WHERE status = 'streaming'`).Scan(&pid)
	})
	return pid
}

// checkEveryVersion fails the test unless a read_committed consumer that
// drops the event ids it has seen reads, from recs, each payment's
// versions 1..want in order and nothing else; it returns how many records
// it dropped as repeats.
func checkEveryVersion(t *testing.T, recs []stateRecord, want map[string]int64) (repeats int) {
	t.Helper()
	seen := map[string]bool{}
	var firsts []stateRecord
	for _, r := range recs {
		if seen[r.eventID] {
			repeats++
			continue
		}
		seen[r.eventID] = true
		firsts = append(firsts, r)
	}
	checkStateOnce(t, firsts, want)
	return repeats
}

// countRepublished counts the records Republish published.
func countRepublished(recs []stateRecord) int {
	n := 0
	for _, r := range recs {
		if r.republished {
			n++
		}
	}
	return n
}

// TestRepublishAfterLostSlot: the relay's slot is dropped while the
// processor goes on committing (as a failover to a standby loses it), so
// the WAL messages of those transactions are gone. The relay restarted on
// the database refuses to create a new slot (paystream_sink_slot_lost 1)
// and publishes nothing; `paystream republish` recreates the slot and
// publishes from payment_transitions what the topic lacks, and the relay
// resumes. A read_committed consumer deduplicating by event id sees every
// version of every payment, in order.
func TestRepublishAfterLostSlot(t *testing.T) {
	testenv.SkipIfShort(t)
	p := startRelayPipeline(t, 20)
	first := startRelay(t, p.db.Pool, p.brokers, p.state, p.ckpt)

	hs := genHistories(2000)
	prod := producePaced(t, p.brokers, p.raw, hs, 5, 20*time.Millisecond)
	testenv.Eventually(t, 2*time.Minute, func() bool { return testenv.EndOffsetSum(t, p.brokers, p.state) >= 300 }, "300 state records")
	first.Stop()
	slot := slotOf(t, p.db)
	testenv.WaitFor(t, 30*time.Second, func() error {
		_, err := p.db.Pool.Exec(t.Context(), `SELECT pg_drop_replication_slot($1)`, slot)
		return err
	})
	lostAt := deliveries(t, p.db.Pool)
	testenv.Eventually(t, time.Minute, func() bool { return deliveries(t, p.db.Pool) >= lostAt+500 }, "500 deliveries with no slot")

	second := startRelay(t, p.db.Pool, p.brokers, p.state, p.ckpt)
	testenv.Eventually(t, 30*time.Second, func() bool { return second.gauge(t, "paystream_sink_slot_lost") == 1 }, "slot reported lost")
	if n := count(t, p.db.Pool, `SELECT count(*) FROM pg_replication_slots WHERE slot_name = '`+slot+`'`); n != 0 {
		t.Fatalf("the relay created the lost slot again")
	}
	rep, err := sink.Republish(t.Context(), p.db.Pool, sink.RepublishConfig{Brokers: p.brokers, Topic: p.state, CheckpointTopic: p.ckpt})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("republish: %d transitions since %s, %d already on the topic, %d published again; slot at %s",
		rep.Transitions, rep.Since.Format(time.RFC3339Nano), rep.OnTopic, rep.Published, rep.SlotLSN)
	if rep.Published == 0 {
		t.Fatal("republish published nothing: the test lost no state event")
	}
	testenv.Eventually(t, 30*time.Second, func() bool {
		return second.gauge(t, "paystream_sink_slot_lost") == 0 && second.gauge(t, "paystream_sink_active") == 1
	}, "relay resumes")

	done := prod.stop(t, hs)
	waitCaughtUp(t, p.db.Pool, p.brokers, p.group, p.raw, 5*time.Minute)
	waitRelayed(t, p.db, 2*time.Minute)
	recs := committedState(t, p.brokers, p.state)
	repeats := checkEveryVersion(t, recs, wantVersions(done))
	t.Logf("%d payments, %d state records, %d republished, %d repeats", len(done), len(recs), countRepublished(recs), repeats)
	if repeats != 0 {
		t.Errorf("%d repeated event ids: republish publishes only what the topic lacks", repeats)
	}
	if got := countRepublished(recs); got != rep.Published {
		t.Errorf("%d records marked %s, republish reported %d", got, sink.HeaderRepublished, rep.Published)
	}
}

// pgPair is a private Postgres cluster and its streaming standby, run by
// deploy/stack.sh on ports of their own: the test kills the primary, which
// the shared stack's other tests need.
type pgPair struct {
	dir          string
	port         int
	primary, dup string // database URLs of the primary and the standby
}

const stackScript = "../../deploy/stack.sh"

func (p *pgPair) stack(t *testing.T, args ...string) {
	t.Helper()
	cmd := exec.Command(stackScript, args...)
	cmd.Env = append(os.Environ(), "PAYSTREAM_STACK_DIR="+p.dir, "PAYSTREAM_STACK_PG_PORT="+strconv.Itoa(p.port))
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("stack.sh %s: %v\n%s", strings.Join(args, " "), err, out)
	}
}

// newPGPair starts a primary and, on the next port, a standby streaming
// from it (standby-up); both are stopped and removed when the test ends.
func newPGPair(t *testing.T) *pgPair {
	t.Helper()
	p := &pgPair{dir: t.TempDir(), port: testenv.FreePorts(t, 2)}
	port := p.port
	url := func(port int) string {
		return fmt.Sprintf("postgres://paystream@127.0.0.1:%d/paystream?sslmode=disable", port)
	}
	p.primary, p.dup = url(port), url(port+1)
	t.Cleanup(func() { p.stack(t, "down", "--purge") })
	p.stack(t, "postgres-up")
	return p
}

// TestFailoverLosesNoStateEvent (Postgres 15, no failover slots): while
// webhooks' raw records flow, the standby falls behind (its WAL receiver
// stopped) while the relay publishes from the primary, then the primary is
// killed and the standby promoted; processor and sink start again on the new primary.
// The logical slot did not survive (a standby has none before Postgres
// 17), so the relay reports it lost and relays nothing rather than
// skipping; `paystream republish` publishes from payment_transitions what
// the topic lacks, and the relay resumes. A read_committed consumer
// deduplicating by event id sees every version of every payment, in order.
// Repeats come from transactions the standby never received: their records
// are applied again on the new primary, and the relay publishes their
// events again with the same ids; the test counts them.
func TestFailoverLosesNoStateEvent(t *testing.T) {
	testenv.SkipIfShort(t)
	pair := newPGPair(t)
	ctx := t.Context()
	brokers := testenv.Kafka(t)
	raw, state, ckpt, group := relayTopics(t)

	primary, err := pgxpool.New(ctx, pair.primary)
	if err != nil {
		t.Fatal(err)
	}
	defer primary.Close()
	if _, err := migrations.Apply(ctx, primary); err != nil {
		t.Fatal(err)
	}
	setupSlot(t, primary)
	pair.stack(t, "standby-up")
	proc := runProcessor(t, primary, processor.Config{Brokers: brokers, Topic: raw, Group: group, BatchMaxRecords: 20})
	relay := startRelay(t, primary, brokers, state, ckpt)

	hs := genHistories(2000)
	prod := producePaced(t, brokers, raw, hs, 5, 20*time.Millisecond)
	testenv.Eventually(t, 2*time.Minute, func() bool { return testenv.EndOffsetSum(t, brokers, state) >= 600 }, "600 state records")
	// The standby falls behind: its WAL receiver stops while the primary
	// goes on committing, and the relay publishing, for a moment.
	receiver := walReceiver(t, pair.dup)
	if err := syscall.Kill(receiver, syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	behindAt := testenv.EndOffsetSum(t, brokers, state)
	testenv.Eventually(t, time.Minute, func() bool { return testenv.EndOffsetSum(t, brokers, state) >= behindAt+150 }, "150 state records the standby lacks")

	pair.stack(t, "kill-postgres")
	killedAt := testenv.EndOffsetSum(t, brokers, state)
	if err := syscall.Kill(receiver, syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	proc.Stop()
	relay.Stop()
	primary.Close()
	pair.stack(t, "promote-standby")

	promoted, err := pgxpool.New(ctx, pair.dup)
	if err != nil {
		t.Fatal(err)
	}
	defer promoted.Close()
	db := &testenv.DB{Pool: promoted, URL: pair.dup, Schema: "public"}
	runProcessor(t, promoted, processor.Config{Brokers: brokers, Topic: raw, Group: group, BatchMaxRecords: 20})
	relay = startRelay(t, promoted, brokers, state, ckpt)
	testenv.Eventually(t, 30*time.Second, func() bool { return relay.gauge(t, "paystream_sink_slot_lost") == 1 }, "slot reported lost")
	if _, err := sink.SetupSlot(ctx, promoted); !errors.Is(err, sink.ErrSlotLost) {
		t.Fatalf("SetupSlot (paystream migrate) on the promoted standby = %v, want ErrSlotLost", err)
	}
	rep, err := sink.Republish(ctx, promoted, sink.RepublishConfig{Brokers: brokers, Topic: state, CheckpointTopic: ckpt})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("primary killed at state high water %d; republish: checkpoint %s on timeline %d, %d transitions since %s, %d already on the topic, %d published again; slot at %s",
		killedAt, rep.CheckpointLSN, rep.CheckpointTimeline, rep.Transitions, rep.Since.Format(time.RFC3339Nano), rep.OnTopic, rep.Published, rep.SlotLSN)
	testenv.Eventually(t, 30*time.Second, func() bool {
		return relay.gauge(t, "paystream_sink_slot_lost") == 0 && relay.gauge(t, "paystream_sink_active") == 1
	}, "relay resumes")

	done := prod.stop(t, hs)
	waitCaughtUp(t, promoted, brokers, group, raw, 5*time.Minute)
	waitRelayed(t, db, 2*time.Minute)
	recs := committedState(t, brokers, state)
	repeats := checkEveryVersion(t, recs, wantVersions(done))
	t.Logf("%d payments, %d state records for read_committed consumers, %d republished, %d repeated event ids (transactions the standby never received, applied and published again)",
		len(done), len(recs), countRepublished(recs), repeats)
}
