package e2e

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/paystream/paystream/ingest"
	"github.com/paystream/paystream/internal/lab/simulate"
	"github.com/paystream/paystream/internal/provider/drivers"
	"github.com/paystream/paystream/internal/source"
	"github.com/paystream/paystream/internal/testenv"
	"github.com/paystream/paystream/processor"
)

// simPipeline is ingest, processor and sink in the test process, on the
// test's schema and topics, with one source per driver the simulator
// speaks; the Mercado Pago and Zoop sources refetch from the simulation's
// fake gateway API.
type simPipeline struct {
	db          *testenv.DB
	brokers     []string
	raw, state  string
	group       string
	url         string
	sourcesFile string
	gateway     net.Listener
}

// The fake gateway API's credentials: the generic API's token (Mercado
// Pago), and the zoop source's marketplace, API key and webhook credential.
const (
	simGatewayToken    = "e2e-simulate-api-token"
	simZoopMarketplace = "5a1e0c0de2e0000000000000000e2e01"
	simZoopKey         = "zpk_e2e_simulate_key_0123456789"
	simZoopCredential  = "paystream:e2e-zoop-webhook-pass-9b1d"
)

func setupSimPipeline(t *testing.T) *simPipeline {
	t.Helper()
	p := &simPipeline{
		db:      testenv.NewDB(t),
		brokers: testenv.Kafka(t),
		raw:     testenv.Topic(t, "raw", 3),
		state:   testenv.Topic(t, "state", 3),
		group:   testenv.Group(t),
	}
	var err error
	if p.gateway, err = net.Listen("tcp", "127.0.0.1:0"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.gateway.Close() })
	yaml := badInputSourcesYAML() + fmt.Sprintf("    api_token: %s\n    api_base_url: http://%s\n    refetch_rate: 1000\n", simGatewayToken, p.gateway.Addr()) +
		fmt.Sprintf("  - name: zp\n    driver: zoop\n    account: %s\n    secrets: [%q]\n    api_token: %s\n    api_base_url: http://%s\n    refetch_rate: 1000\n",
			simZoopMarketplace, simZoopCredential, simZoopKey, p.gateway.Addr())
	p.sourcesFile = filepath.Join(t.TempDir(), "sources.yaml")
	if err := os.WriteFile(p.sourcesFile, []byte(yaml), 0o600); err != nil {
		t.Fatal(err)
	}
	sources, err := source.Parse([]byte(yaml), drivers.Factories())
	if err != nil {
		t.Fatal(err)
	}
	p.url = serveIngest(t, ingest.Config{Sources: sources, Brokers: p.brokers, Topic: p.raw, DLQTopic: testenv.Topic(t, "dlq", 1),
		Logger: testLogger(t), Registerer: prometheus.NewRegistry()})

	refetch := map[string]*source.RefetchConfig{}
	for name, s := range sources {
		if s.Refetch != nil {
			refetch[name] = s.Refetch
		}
	}
	runProcessor(t, p.db.Pool, processor.Config{Brokers: p.brokers, Topic: p.raw, Group: p.group,
		Refetch: refetch, RefetchRetry: 300 * time.Millisecond})
	runSink(t, p.db.Pool, p.brokers, p.state)
	return p
}

func (p *simPipeline) target() simulate.Target {
	return simulate.Target{Pool: p.db.Pool, KafkaBrokers: p.brokers, RawTopic: p.raw, StateTopic: p.state, Group: p.group,
		DrainTimeout: 2 * time.Minute}
}

// simulation runs a simulation of payments against p with a sampler.
func (p *simPipeline) simulation(t *testing.T, payments int, poison int) *simulate.Simulation {
	t.Helper()
	sampler, err := simulate.NewSampler(simulate.SamplerConfig{Pool: p.db.Pool, Group: p.group, Topic: p.raw, Brokers: p.brokers, Interval: 50 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	sim, err := simulate.New(simulate.Config{
		SourcesFile: p.sourcesFile, IngestURL: p.url, Payments: payments, Duplicates: 0.15, Reorder: 0.25,
		Concurrency: 16, Seed: 20261201, GatewayListener: p.gateway, Poison: poison,
		KafkaBrokers: p.brokers, RawTopic: p.raw, Sampler: sampler,
	}, testLogger(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(sim.Close)
	return sim
}

func logReport(t *testing.T, rep simulate.Report) {
	t.Helper()
	t.Logf("drained %v in %s; %d payments (%d incomplete)", rep.Drained, rep.DrainTime.Round(time.Millisecond), rep.Payments, rep.Incomplete)
	for _, inv := range rep.Invariants {
		t.Logf("%s ok=%v skipped=%v checked=%d: %s", inv.ID, inv.OK, inv.Skipped, inv.Checked, inv.Detail)
	}
}

// TestSimulateVerifiesAHealthyPipelineAndCatchesTampering: about 2,000
// webhooks of every driver (all shapes of history each can tell, 15 %
// duplicates, a quarter reordered, Mercado Pago's and Zoop's refetched
// from the fake gateway API) and three poison records go through a
// healthy pipeline, and Verify finds every invariant holds. Then faults are planted one at a
// time in what the pipeline wrote, and Verify must name the invariant each
// breaks: a refund applied twice (I2), a ledger movement off by one (I7),
// a transition rolled back after its event was published (I8), a delivery
// row lost (I4), and a state event published twice (I3).
func TestSimulateVerifiesAHealthyPipelineAndCatchesTampering(t *testing.T) {
	testenv.SkipIfShort(t)
	p := setupSimPipeline(t)
	sim := p.simulation(t, 600, 3)
	ctx := context.Background()
	stats, err := sim.Deliver(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("delivered %d webhooks (%d events, %d duplicates) in %s: %d attempts, %d ok, %d 5xx, %d network errors, %d given up; p50 %s p99 %s",
		stats.Planned, stats.Events, stats.Duplicates, stats.Elapsed.Round(time.Millisecond), stats.Attempts, stats.OK, stats.Status5xx,
		stats.NetErrors, stats.GivenUp, stats.P50, stats.P99)
	if stats.Planned < 2000 {
		t.Errorf("only %d deliveries planned", stats.Planned)
	}
	perDriver := map[string]int{}
	for _, op := range sim.Oracle().Payments {
		perDriver[op.Driver]++
	}
	t.Logf("payments by driver %v", perDriver)
	if perDriver["zoop"] == 0 || perDriver["mercadopago"] == 0 {
		t.Errorf("payments by driver %v: want the refetching drivers among them", perDriver)
	}
	rep, err := sim.Verify(ctx, p.target())
	if err != nil {
		t.Fatal(err)
	}
	logReport(t, rep)
	if !rep.OK() {
		t.Fatalf("a healthy pipeline fails %v", rep.Failed())
	}
	for _, inv := range rep.Invariants {
		if inv.Skipped {
			t.Errorf("%s not exercised: %s", inv.ID, inv.Detail)
		}
	}

	exec := func(sql string, args ...any) {
		t.Helper()
		if _, err := p.db.Pool.Exec(ctx, sql, args...); err != nil {
			t.Fatalf("%s: %v", sql, err)
		}
	}
	// planted runs Verify after a fault was planted and wants invariant id
	// among the failures.
	planted := func(id, fault string) {
		t.Helper()
		rep, err := sim.Verify(ctx, simulate.Target{Pool: p.db.Pool, KafkaBrokers: p.brokers, RawTopic: p.raw, StateTopic: p.state,
			Group: p.group, DrainTimeout: time.Second})
		if err != nil {
			t.Fatal(err)
		}
		if !slices.Contains(rep.Failed(), id) {
			logReport(t, rep)
			t.Fatalf("%s: Verify fails %v, want %s among them", fault, rep.Failed(), id)
		}
		t.Logf("%s: fails %v; %s: %s", fault, rep.Failed(), id, rep.Result(id).Detail)
	}

	// I2: a refund applied a second time, as a new version.
	exec(`CREATE TABLE sim_refund AS SELECT * FROM payment_transitions WHERE kind = 'refund' LIMIT 1`)
	exec(`INSERT INTO payment_transitions (payment_key, version, from_status, to_status, kind, amount_minor, currency, refund_id, delivery_id)
	      SELECT r.payment_key, p.version + 1, r.to_status, r.to_status, r.kind, r.amount_minor, r.currency, r.refund_id, r.delivery_id
	        FROM sim_refund r JOIN payments p USING (payment_key)`)
	planted("I2", "a refund applied twice")
	exec(`DELETE FROM payment_transitions t USING sim_refund r, payments p
	       WHERE t.payment_key = r.payment_key AND p.payment_key = r.payment_key AND t.version = p.version + 1`)

	// I7: one movement of a capture off by one minor unit.
	exec(`UPDATE ledger_movements SET amount_minor = amount_minor + 1
	       WHERE (payment_key, version, movement) = (SELECT payment_key, version, movement FROM ledger_movements ORDER BY payment_key LIMIT 1)`)
	planted("I7", "a ledger movement off by one")
	exec(`UPDATE ledger_movements SET amount_minor = amount_minor - 1
	       WHERE (payment_key, version, movement) = (SELECT payment_key, version, movement FROM ledger_movements ORDER BY payment_key LIMIT 1)`)

	// I8: the last transition of a payment gone (as if its transaction
	// rolled back) while its event is on the topic.
	exec(`CREATE TABLE sim_last AS SELECT t.* FROM payment_transitions t JOIN payments p ON p.payment_key = t.payment_key AND p.version = t.version
	       WHERE p.version > 1 ORDER BY t.payment_key LIMIT 1`)
	exec(`DELETE FROM payment_transitions t USING sim_last l WHERE t.payment_key = l.payment_key AND t.version = l.version`)
	planted("I8", "a published transition not committed")
	exec(`INSERT INTO payment_transitions SELECT * FROM sim_last`)

	// I4: a raw record's delivery row lost (an offset skipped).
	exec(`CREATE TABLE sim_delivery AS SELECT * FROM deliveries WHERE reason = 'duplicate_event' ORDER BY id LIMIT 1`)
	exec(`DELETE FROM deliveries d USING sim_delivery s WHERE d.id = s.id`)
	planted("I4", "a delivery row lost")
	exec(`INSERT INTO deliveries SELECT * FROM sim_delivery`)

	if rep, err := sim.Verify(ctx, p.target()); err != nil || !rep.OK() {
		logReport(t, rep)
		t.Fatalf("after undoing the faults: %v, fails %v", err, rep.Failed())
	}

	// I3: a state event published a second time, outside the sink's
	// transactions.
	recs := committedState(t, p.brokers, p.state)
	if len(recs) == 0 {
		t.Fatal("no state events")
	}
	again := &kgo.Record{Topic: p.state, Key: []byte(recs[0].ev.PaymentKey), Value: recs[0].raw,
		Headers: []kgo.RecordHeader{{Key: "event-id", Value: []byte(recs[0].eventID)}}}
	testenv.Produce(t, p.brokers, again)
	planted("I3", "a state event published twice")
}

// TestSimulateCatchesAProcessorThatSkipsTheDedupInsert plants the issue's
// example fault: the processor's dedup-key insert does nothing (a trigger
// in the test's schema drops every row, as a build that skipped the insert
// would). Redeliveries are then taken for new events, and Verify names I1.
func TestSimulateCatchesAProcessorThatSkipsTheDedupInsert(t *testing.T) {
	testenv.SkipIfShort(t)
	p := setupSimPipeline(t)
	ctx := context.Background()
	if _, err := p.db.Pool.Exec(ctx, `
		CREATE FUNCTION sim_skip_dedup() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN RETURN NULL; END $$;
		CREATE TRIGGER sim_skip_dedup BEFORE INSERT ON dedup_keys FOR EACH ROW EXECUTE FUNCTION sim_skip_dedup();`); err != nil {
		t.Fatal(err)
	}
	sim := p.simulation(t, 120, 0)
	if _, err := sim.Deliver(ctx, nil); err != nil {
		t.Fatal(err)
	}
	tg := p.target()
	// A batch holding an event and its redelivery cannot commit without
	// the first's dedup key: its partition stalls, so do not wait long.
	tg.DrainTimeout = 20 * time.Second
	rep, err := sim.Verify(ctx, tg)
	if err != nil {
		t.Fatal(err)
	}
	logReport(t, rep)
	if !slices.Contains(rep.Failed(), "I1") {
		t.Fatalf("Verify fails %v, want I1 among them", rep.Failed())
	}
}
