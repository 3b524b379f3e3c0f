package main

import (
	"context"
	"encoding/json"
	"log/slog"
	"net/http/httptest"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/paystream/paystream/ingest"
	"github.com/paystream/paystream/internal/lab/simulate"
	"github.com/paystream/paystream/internal/provider/drivers"
	"github.com/paystream/paystream/internal/source"
	"github.com/paystream/paystream/internal/testenv"
	"github.com/paystream/paystream/processor"
	"github.com/paystream/paystream/sink"
)

// TestSimulateCommandDelivers: `paystream-lab simulate` without --verify sends
// every planned webhook once or more, each verified and parsed by the real
// driver of its source, prints a JSON report that says so and saves an
// oracle in which every webhook was acknowledged.
func TestSimulateCommandDelivers(t *testing.T) {
	t.Parallel()
	url, ok, bad := verifier(t, loadgenSources)
	sources := writeSources(t, loadgenSources)
	oracle := filepath.Join(t.TempDir(), "oracle.json")
	r := lab.Run(t, nil, "simulate", "--sources", sources, "--url", url, "--payments", "40", "--duplicates", "0.2",
		"--reorder", "0.3", "--seed", "5", "--oracle", oracle, "--json", "-q")
	if r.Code != 0 {
		t.Fatalf("exit %d, stderr:\n%s", r.Code, r.Stderr)
	}
	var out struct {
		Seed     int64                  `json:"seed"`
		Delivery simulate.DeliveryStats `json:"delivery"`
	}
	if err := json.Unmarshal([]byte(r.Stdout), &out); err != nil {
		t.Fatalf("stdout is not the JSON report: %v\n%s", err, r.Stdout)
	}
	d := out.Delivery
	if out.Seed != 5 || d.OK != d.Planned || d.Planned != d.Events+d.Duplicates || d.Duplicates == 0 || d.GivenUp != 0 {
		t.Errorf("report %+v", out)
	}
	if bad.Load() != 0 || ok.Load() != int64(d.Planned) {
		t.Errorf("the drivers accepted %d and refused %d requests; %d planned", ok.Load(), bad.Load(), d.Planned)
	}
	o, err := simulate.LoadOracle(oracle)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range o.Events {
		if e.Acks != e.Sends {
			t.Errorf("oracle: event %s sent %d times, acknowledged %d", e.EventID, e.Sends, e.Acks)
		}
	}
	t.Logf("%d payments, %d events, %d deliveries", len(o.Payments), d.Events, d.Planned)
}

// TestSimulateUsageErrors: what --verify and --verify-only need is named
// before anything is sent.
func TestSimulateUsageErrors(t *testing.T) {
	t.Parallel()
	sources := writeSources(t, loadgenSources)
	cases := []struct {
		args []string
		want string
	}{
		{[]string{"simulate"}, "--sources"},
		{[]string{"simulate", "--verify-only"}, "--oracle"},
		{[]string{"simulate", "--sources", sources, "--verify"}, "--kafka-brokers"},
		{[]string{"simulate", "--sources", sources, "--verify", "--kafka-brokers", "127.0.0.1:1"}, "--database-url"},
		{[]string{"simulate", "--sources", sources, "--poison", "2"}, "--kafka-brokers"},
		{[]string{"simulate", "--sources", sources, "--driver", "mercadopago"}, "no source with driver"},
	}
	for _, c := range cases {
		r := lab.Run(t, nil, c.args...)
		if r.Code == 0 || !strings.Contains(r.Stderr, c.want) {
			t.Errorf("%s: exit %d, stderr %q; want a failure naming %s", strings.Join(c.args, " "), r.Code, r.Stderr, c.want)
		}
	}
}

// TestSimulateVerifyCommand runs the one-command check on a real pipeline
// (ingest, processor and sink in the test process, on the real broker and
// Postgres): `paystream-lab simulate --verify` delivers, drains and prints one
// line per invariant, all ok, exit 0, saving the oracle. Then one ledger
// movement is changed by hand, and `paystream-lab simulate --verify-only
// --oracle` in another process prints I7 as failed and exits 3.
func TestSimulateVerifyCommand(t *testing.T) {
	t.Parallel()
	testenv.SkipIfShort(t)
	db := testenv.NewDB(t)
	brokers := testenv.Kafka(t)
	raw, state, dlq, group := testenv.Topic(t, "raw", 3), testenv.Topic(t, "state", 3), testenv.Topic(t, "dlq", 1), testenv.Group(t)
	log := slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelWarn}))
	sources, err := source.Parse([]byte(loadgenSources), drivers.Factories())
	if err != nil {
		t.Fatal(err)
	}
	srv, err := ingest.New(ingest.Config{Sources: sources, Brokers: brokers, Topic: raw, DLQTopic: dlq, Logger: log, Registerer: prometheus.NewRegistry()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Close)
	hs := httptest.NewServer(srv.Handler())
	t.Cleanup(hs.Close)
	proc, err := processor.New(db.Pool, processor.Config{Brokers: brokers, Topic: raw, Group: group, SessionTimeout: 6 * time.Second,
		Logger: log, Registerer: prometheus.NewRegistry()})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := sink.SetupSlot(t.Context(), db.Pool); err != nil {
		t.Fatal(err)
	}
	relay, err := sink.New(db.Pool, sink.Config{Brokers: brokers, Topic: state, CheckpointTopic: testenv.Topic(t, "ckpt", 1),
		MaxBatchDelay: 5 * time.Millisecond, Logger: log, Registerer: prometheus.NewRegistry()})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{}, 2)
	for _, run := range []func(context.Context) error{proc.Run, relay.Run} {
		go func() {
			defer func() { done <- struct{}{} }()
			if err := run(ctx); err != nil {
				t.Errorf("run: %v", err)
			}
		}()
	}
	t.Cleanup(func() { cancel(); <-done; <-done })

	oracle := filepath.Join(t.TempDir(), "oracle.json")
	env := []string{"PAYSTREAM_DATABASE_URL=" + db.URL, "PAYSTREAM_KAFKA_BROKERS=" + strings.Join(brokers, ","),
		"PAYSTREAM_RAW_TOPIC=" + raw, "PAYSTREAM_STATE_TOPIC=" + state, "PAYSTREAM_GROUP=" + group}
	r := lab.Run(t, env, "simulate", "--sources", writeSources(t, loadgenSources), "--url", hs.URL, "--payments", "60",
		"--duplicates", "0.2", "--reorder", "0.3", "--poison", "1", "--verify", "--oracle", oracle)
	t.Logf("stdout:\n%s", r.Stdout)
	if r.Code != 0 || !strings.Contains(r.Stdout, "all invariants hold") {
		t.Fatalf("simulate --verify: exit %d, stderr:\n%s", r.Code, r.Stderr)
	}
	for _, id := range []string{"I1", "I2", "I3", "I4", "I5", "I6", "I7", "I8", "I9", "I10"} {
		if !regexp.MustCompile(`(?m)^` + id + `\s+ok\s`).MatchString(r.Stdout) {
			t.Errorf("no ok line for %s", id)
		}
	}

	if _, err := db.Pool.Exec(t.Context(), `UPDATE ledger_movements SET amount_minor = amount_minor + 1
		WHERE (payment_key, version, movement) = (SELECT payment_key, version, movement FROM ledger_movements ORDER BY payment_key LIMIT 1)`); err != nil {
		t.Fatal(err)
	}
	r = lab.Run(t, env, "simulate", "--verify-only", "--oracle", oracle, "--drain-timeout", "5s", "--json", "-q")
	var out struct {
		OK     bool            `json:"ok"`
		Verify simulate.Report `json:"verify"`
	}
	if err := json.Unmarshal([]byte(r.Stdout), &out); err != nil {
		t.Fatalf("stdout is not the JSON report: %v\n%s\nstderr:\n%s", err, r.Stdout, r.Stderr)
	}
	if r.Code != exitDrift || out.OK || strings.Join(out.Verify.Failed(), ",") != "I7" {
		t.Fatalf("--verify-only after a ledger change: exit %d, fails %v; want exit %d and I7 alone\nstderr:\n%s", r.Code, out.Verify.Failed(), exitDrift, r.Stderr)
	}
	t.Logf("I7: %s", out.Verify.Result("I7").Detail)
}
