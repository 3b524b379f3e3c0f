package e2e

import (
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/paystream/paystream/internal/testenv"
	"github.com/paystream/paystream/processor"
	"github.com/paystream/paystream/sink"
)

// relayRun is a sink relay in the test process with a registry of its own.
type relayRun struct {
	*service
	reg *prometheus.Registry
}

// startRelay runs a relay on pool (whose slot must exist, or be lost) until
// the returned service is stopped.
func startRelay(t *testing.T, pool *pgxpool.Pool, brokers []string, state, ckpt string) *relayRun {
	t.Helper()
	reg := prometheus.NewRegistry()
	relay, err := sink.New(pool, sink.Config{
		Brokers: brokers, Topic: state, CheckpointTopic: ckpt,
		MaxBatchDelay: 5 * time.Millisecond, HeartbeatInterval: time.Second,
		StandbyRetry: 100 * time.Millisecond, LostSlotRetry: 200 * time.Millisecond,
		Logger: testLogger(t), Registerer: reg,
	})
	if err != nil {
		t.Fatal(err)
	}
	return &relayRun{service: startService(t, "sink", relay.Run), reg: reg}
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
	db := testenv.NewDB(t)
	brokers := testenv.Kafka(t)
	raw, state, ckpt := testenv.Topic(t, "raw", 3), testenv.Topic(t, "state", 3), testenv.Topic(t, "ckpt", 1)
	group := testenv.Group(t)
	if _, err := sink.SetupSlot(t.Context(), db.Pool); err != nil {
		t.Fatal(err)
	}
	runProcessor(t, db.Pool, processor.Config{Brokers: brokers, Topic: raw, Group: group, BatchMaxRecords: 20})
	first := startRelay(t, db.Pool, brokers, state, ckpt)

	hs := genHistories(2000)
	prod := producePaced(t, brokers, raw, hs, 5, 20*time.Millisecond)
	testenv.Eventually(t, 2*time.Minute, func() bool { return stateHighWater(t, brokers, state) >= 300 }, "300 state records")
	first.stop()
	slot := slotOf(t, db)
	testenv.WaitFor(t, 30*time.Second, func() error {
		_, err := db.Pool.Exec(t.Context(), `SELECT pg_drop_replication_slot($1)`, slot)
		return err
	})
	lostAt := deliveries(t, db.Pool)
	testenv.Eventually(t, time.Minute, func() bool { return deliveries(t, db.Pool) >= lostAt+500 }, "500 deliveries with no slot")

	second := startRelay(t, db.Pool, brokers, state, ckpt)
	testenv.Eventually(t, 30*time.Second, func() bool { return second.gauge(t, "paystream_sink_slot_lost") == 1 }, "slot reported lost")
	if n := count(t, db.Pool, `SELECT count(*) FROM pg_replication_slots WHERE slot_name = '`+slot+`'`); n != 0 {
		t.Fatalf("the relay created the lost slot again")
	}
	rep, err := sink.Republish(t.Context(), db.Pool, sink.RepublishConfig{Brokers: brokers, Topic: state, CheckpointTopic: ckpt})
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
	waitCaughtUp(t, db.Pool, brokers, group, raw, 5*time.Minute)
	waitRelayed(t, db, 2*time.Minute)
	recs := committedState(t, brokers, state)
	repeats := checkEveryVersion(t, recs, wantVersions(done))
	t.Logf("%d payments, %d state records, %d republished, %d repeats", len(done), len(recs), countRepublished(recs), repeats)
	if repeats != 0 {
		t.Errorf("%d repeated event ids: republish publishes only what the topic lacks", repeats)
	}
	if got := countRepublished(recs); got != rep.Published {
		t.Errorf("%d records marked %s, republish reported %d", got, sink.HeaderRepublished, rep.Published)
	}
}
