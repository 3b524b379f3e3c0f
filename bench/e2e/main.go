// Command bench-e2e measures paystream end to end against the design most
// teams write, on the same machine, with the same workload, in the same
// run. `make bench-e2e` runs it on the local stack (deploy/stack.sh).
//
//	go run ./bench/e2e [-quick] [-rate 5000] [-deliveries 60000] [-rounds 2] [-warmup 20000] [-repeats 0.2] [-body 1024] [-c 64] [-json out.json]
//
// # What runs
//
// paystream: `bin/paystream ingest`, `processor` and `sink`, each its own
// process, against the stack's Kafka and Postgres, with a fresh schema and
// fresh raw, state and DLQ topics, created by `paystream migrate`.
//
// The synchronous baseline: this program's `baseline` subcommand, also its
// own process, with its own schema. Per webhook it verifies the Standard
// Webhooks signature and then, in the request's own Postgres transaction,
// inserts the event or ignores it (its unique key is the deduplication),
// locks the payment row (SELECT … FOR UPDATE, inserting it first if new),
// runs payment.Machine, writes the ledger postings, commits and answers.
// It uses paystream's standardwebhooks driver and state machine, so the
// payload convention and the status rules are identical; only the
// architecture differs.
//
// Before both, -warmup deliveries (20,000 by default) go through paystream
// with their own payments, schema and topics, unmeasured: the Kafka broker
// is a JVM, and on a freshly started stack its JIT compiler threads take a
// third or more of the broker's CPU for minutes. The report still shows
// what the compiler took during each run ("of which the broker's JIT
// compiler"): near zero once the broker is warm.
//
// Each design runs the workload -rounds times (2 by default), alternated:
// paystream then the baseline, then the baseline then paystream, and so
// on, each round with its own payments, schemas and topics. The VM this
// was built on changes speed by up to 1.7× over minutes; with one round
// each, a change between the two halves of a run moved the ratio from
// 1.9× to 3.0× between consecutive runs of the same code. The table is
// over every round (counts, times and CPU summed, latency percentiles over
// every sample), and each round's ratio is printed under it.
//
// # Workload
//
// internal/lab/loadgen's Lifecycle, one schedule sent to both over 64
// keep-alive connections as fast as they answer: payments going created →
// paid → refunded → a late created (a second creation event, ignored as
// stale), bodies padded to about 1 KB, 20 % of the deliveries repeating a
// recent event. The defaults are 60,000 deliveries, so 48,000 distinct
// events and 12,000 payments; -quick is a tenth of that.
//
// By default each target gets the requests as fast as it answers them, so
// accepted→published measures the backlog the burst leaves. With -rate N
// the requests arrive at N per second instead (request i is sent at
// start + i/N, by whichever worker is free; those that start more than
// 10 ms after their time are counted as late), which measures the latency
// of a target keeping up with that rate, or shows that it does not.
//
// # What is measured
//
//   - accepted/s: 2xx answers per second of the load (first request to
//     last answer); accept p50/p99: each request's time to its answer.
//   - end-to-end deliveries/s: deliveries over the time from the first
//     request to the last delivery recorded in Postgres. For paystream that
//     is when the processor's committed offsets (which move in the same
//     transaction as the inbox rows) reach the raw topic's end; for the
//     baseline, the last answer, since it answers after its commit.
//   - accepted→published p50/p99: from a webhook's first 2xx answer to the
//     arrival, on the state topic, of the state event it caused (matched by
//     the event's source_event_id and checked against its payment key).
//     The late created and the repeats cause none. For the baseline,
//     "published" means committed, which happens before the answer: 0.
//   - CPU µs per delivery of each process, from /proc/<pid>/stat
//     (utime+stime) deltas over the run (the pipeline's run ends when the
//     last state event arrived): ingest, processor, sink or the baseline,
//     the Kafka broker (the stack's pid file, or -broker-pid), and
//     Postgres (the postmaster, found as the parent of the bench's own
//     backend, plus its children, plus the children it reaped).
//   - WAL bytes per delivery: pg_current_wal_lsn() before and after.
//
// The broker and Postgres are shared: their CPU and the WAL include
// whatever else runs on them meanwhile (other tests, autovacuum). Run on a
// quiet machine for numbers to publish. The program asserts nothing; it
// reports, and checks that every payment ended refunded.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"runtime"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/paystream/paystream/bench/internal/rig"
	"github.com/paystream/paystream/ingest"
	"github.com/paystream/paystream/internal/lab/loadgen"
)

type options struct {
	binary        string
	deliveries    int
	warmup        int
	repeats       float64
	bodyBytes     int
	concurrency   int
	client        string
	rounds        int
	partitions    int
	baselineConns int
	httpServer    string
	ingestProcs   int
	brokerPID     int
	rate          float64
	quick         bool
	keep          bool
	jsonPath      string
	profileDir    string
}

func main() {
	if len(os.Args) > 1 && os.Args[1] == "baseline" {
		if err := runBaseline(os.Args[2:]); err != nil {
			fmt.Fprintln(os.Stderr, "bench-e2e baseline:", err)
			os.Exit(1)
		}
		return
	}
	var o options
	flag.StringVar(&o.binary, "binary", "bin/paystream", "paystream binary to run as ingest, processor and sink")
	flag.IntVar(&o.deliveries, "deliveries", 60_000, "webhook deliveries, repeats included")
	flag.IntVar(&o.warmup, "warmup", 20_000, "deliveries sent through paystream first, in its own schema and topics, and not measured: they warm the Kafka broker's JIT (0: none)")
	flag.Float64Var(&o.repeats, "repeats", 0.20, "fraction of the deliveries that repeat an event already delivered")
	flag.IntVar(&o.bodyBytes, "body", 1024, "approximate body size in bytes")
	flag.IntVar(&o.concurrency, "c", 64, "load generator connections")
	flag.StringVar(&o.client, "client", "fasthttp", `the load generator's HTTP client: "fasthttp" (a fraction of net/http's CPU per request, which the designs under test get instead), or "net/http" (as before 2026-12-02)`)
	flag.IntVar(&o.rounds, "rounds", 2, "rounds of the whole workload per design, alternated (paystream then the baseline, then the other way round), each with its own payments, schemas and topics: a change in the machine's speed during the bench then hits both designs. The table is over every round; each round's ratio is printed too")
	flag.IntVar(&o.partitions, "partitions", 6, "partitions of the raw and state topics")
	flag.IntVar(&o.baselineConns, "baseline-conns", 16, "the baseline's Postgres connection pool size")
	flag.StringVar(&o.httpServer, "http-server", "", `paystream ingest's --http-server: "net/http" or "fasthttp" (default: ingest's own default)`)
	flag.IntVar(&o.ingestProcs, "ingest-gomaxprocs", 0, "run paystream ingest with GOMAXPROCS set to this (0: Go's default, the machine's CPUs); the other processes keep the default")
	flag.IntVar(&o.brokerPID, "broker-pid", rig.StackBrokerPID(), "pid of the Kafka broker, for its CPU (default: the local stack's; 0: not reported)")
	flag.Float64Var(&o.rate, "rate", 0, "send at this fixed arrival rate, requests per second (0: as fast as each target answers)")
	flag.BoolVar(&o.quick, "quick", false, "a smoke run: a tenth of -deliveries and of -warmup")
	flag.BoolVar(&o.keep, "keep", false, "keep the schemas after the run (topics are always deleted)")
	flag.StringVar(&o.jsonPath, "json", "", "also write the results as JSON to this file")
	flag.StringVar(&o.profileDir, "profile", "", "write CPU profiles of ingest, processor and sink (8 s from 3 s into the load) to this directory")
	flag.Parse()

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, o); err != nil {
		fmt.Fprintln(os.Stderr, "bench-e2e:", err)
		os.Exit(1)
	}
}

// bench is what both runs share.
type bench struct {
	options
	self          string // this program, run as the baseline
	dbURL         string
	brokers       []string
	admin         *pgx.Conn // schemas, WAL positions, checks
	postmasterPID int
	sourcesPath   string
	workload      *loadgen.Lifecycle
}

func run(ctx context.Context, o options) error {
	dbURL, brokers := os.Getenv("PAYSTREAM_TEST_DATABASE_URL"), os.Getenv("PAYSTREAM_TEST_KAFKA_BROKERS")
	if dbURL == "" || brokers == "" {
		return errors.New(`set PAYSTREAM_TEST_DATABASE_URL and PAYSTREAM_TEST_KAFKA_BROKERS (make bench-e2e does; or eval "$(deploy/stack.sh env)")`)
	}
	if o.quick {
		o.deliveries /= 10
		o.warmup /= 10
	}
	if o.profileDir != "" {
		if err := os.MkdirAll(o.profileDir, 0o755); err != nil {
			return err
		}
	}
	if o.rate < 0 {
		return fmt.Errorf("-rate %v: want a positive rate, or 0 for as fast as possible", o.rate)
	}
	if o.rounds < 1 {
		return fmt.Errorf("-rounds %d: want at least 1", o.rounds)
	}
	if o.ingestProcs < 0 {
		return fmt.Errorf("-ingest-gomaxprocs %d: want 0 (Go's default) or more", o.ingestProcs)
	}
	if o.httpServer != "" && o.httpServer != "fasthttp" && o.httpServer != "net/http" {
		return fmt.Errorf(`-http-server %q: want "fasthttp" or "net/http"`, o.httpServer)
	}
	if o.client != "fasthttp" && o.client != "net/http" {
		return fmt.Errorf(`-client %q: want "fasthttp" or "net/http"`, o.client)
	}
	unique := int(float64(o.deliveries) * (1 - o.repeats))
	payments := unique / loadgen.LifecycleSteps
	if payments <= 0 {
		return fmt.Errorf("-deliveries %d with -repeats %v leaves no payment", o.deliveries, o.repeats)
	}
	self, err := os.Executable()
	if err != nil {
		return fmt.Errorf("find own executable: %w", err)
	}
	if _, err := os.Stat(o.binary); err != nil {
		return fmt.Errorf("paystream binary: %w (make build)", err)
	}
	tmp, err := os.MkdirTemp("", "bench-e2e-")
	if err != nil {
		return err
	}
	defer func() { _ = os.RemoveAll(tmp) }()
	sourcesPath, err := writeSources(tmp)
	if err != nil {
		return err
	}
	lsrcs, err := loadgen.ParseSources([]byte(rig.SourcesYAML))
	if err != nil {
		return err
	}
	suffix := randomHex(3)
	workload, err := newWorkload(lsrcs[0], suffix, payments, o.repeats, o.bodyBytes)
	if err != nil {
		return err
	}
	admin, err := pgx.Connect(ctx, dbURL)
	if err != nil {
		return fmt.Errorf("connect to postgres: %w", err)
	}
	defer func() { _ = admin.Close(context.Background()) }()
	pm, err := postmasterPID(ctx, admin)
	if err != nil {
		fmt.Fprintln(os.Stderr, "bench-e2e: Postgres CPU not reported:", err)
	}
	b := &bench{options: o, self: self, dbURL: dbURL, brokers: strings.Split(brokers, ","), admin: admin,
		postmasterPID: pm, sourcesPath: sourcesPath, workload: workload}

	machine := describeMachine()
	kind := "full run"
	if o.quick {
		kind = "smoke run (-quick)"
	}
	fmt.Printf("bench-e2e %s: %d deliveries (%d repeats) of %d events, %d payments created → paid → refunded → late created, ~%d B bodies, %d connections (%s), %s\n",
		kind, workload.Len(), workload.Len()-payments*loadgen.LifecycleSteps, payments*loadgen.LifecycleSteps, payments, o.bodyBytes, o.concurrency, o.client, rateText(o.rate))
	fmt.Printf("machine: %d CPUs (%s), load average %s, commit %s, %s\n\n", machine.CPUs, machine.CPU, machine.LoadAvg, machine.Commit, runtime.Version())

	if o.warmup > 0 {
		if err := b.warmUp(ctx, lsrcs[0], o.warmup); err != nil {
			return fmt.Errorf("warm-up: %w", err)
		}
	}
	var pipes, bases []*result
	var rounds []roundResult
	for i := range o.rounds {
		rb, rsuffix := *b, suffix
		if o.rounds > 1 {
			rsuffix = fmt.Sprintf("%sr%d", suffix, i+1)
			fmt.Printf("== round %d of %d\n", i+1, o.rounds)
			if i > 0 {
				if rb.workload, err = newWorkload(lsrcs[0], rsuffix, payments, o.repeats, o.bodyBytes); err != nil {
					return err
				}
			}
		}
		pipe, base, err := rb.runRound(ctx, rsuffix, i%2 == 1)
		if err != nil {
			return err
		}
		pipes, bases = append(pipes, pipe), append(bases, base)
		rounds = append(rounds, roundResult{Paystream: pipe.EndToEndPerSec, Baseline: base.EndToEndPerSec, Ratio: pipe.EndToEndPerSec / base.EndToEndPerSec,
			PaystreamCPU: pipe.cpuTotal(), BaselineCPU: base.cpuTotal()})
		if o.rounds > 1 {
			fmt.Printf("   round %d: paystream %.0f, baseline %.0f deliveries/s end to end: %.2f×\n\n", i+1, pipe.EndToEndPerSec, base.EndToEndPerSec, rounds[i].Ratio)
		}
	}
	rep := report{Kind: kind, Machine: machine, Workload: workloadInfo{
		Deliveries: workload.Len(), Repeats: workload.Len() - payments*loadgen.LifecycleSteps, Payments: payments, Rounds: o.rounds,
		BodyBytes: o.bodyBytes, Connections: o.concurrency, Client: o.client, IngestHTTPServer: ingestHTTPServer(o.httpServer), IngestGOMAXPROCS: o.ingestProcs, Partitions: o.partitions, BaselineConns: o.baselineConns, Rate: o.rate,
	}, Paystream: mergeResults(pipes), Baseline: mergeResults(bases)}
	if o.rounds > 1 {
		rep.Rounds = rounds
	}
	fmt.Println()
	fmt.Print(rep.markdown())
	if o.jsonPath != "" {
		if err := rep.writeJSON(o.jsonPath); err != nil {
			return err
		}
		fmt.Printf("\nJSON written to %s\n", o.jsonPath)
	}
	return nil
}

// warmUp sends deliveries through paystream before the measured runs, with
// their own payments, schema and topics, and discards the measurements.
// Only the Kafka broker runs a JIT: on a freshly started stack its
// compiler threads take most of its CPU for minutes, which a benchmark of
// the broker's steady state should not count. Postgres and the Go
// processes need no warm-up (the baseline runs on the same Postgres).
func (b *bench) warmUp(ctx context.Context, src loadgen.Source, deliveries int) error {
	suffix := randomHex(3)
	payments := max(int(float64(deliveries)*(1-b.repeats))/loadgen.LifecycleSteps, 1)
	workload, err := newWorkload(src, suffix, payments, b.repeats, b.bodyBytes)
	if err != nil {
		return err
	}
	w := *b
	w.workload, w.profileDir, w.rate = workload, "", 0
	fmt.Printf("== warm-up: %d deliveries through paystream, not measured\n", workload.Len())
	r, err := w.runPipeline(ctx, suffix)
	if err != nil {
		return err
	}
	fmt.Printf("   %.0f deliveries/s, the broker's JIT compiler %.0f µs/delivery\n\n", r.EndToEndPerSec, r.CPU[jitCPU])
	return nil
}

// newWorkload is the lifecycle of payments payments, signed for src, with
// ids of run suffix.
func newWorkload(src loadgen.Source, suffix string, payments int, repeats float64, bodyBytes int) (*loadgen.Lifecycle, error) {
	builder, err := loadgen.NewBuilder(src, suffix, 1)
	if err != nil {
		return nil, err
	}
	return loadgen.NewLifecycle(loadgen.LifecycleConfig{Builder: builder, Payments: payments, Repeats: repeats, BodyBytes: bodyBytes})
}

// runRound runs b's workload through both designs, the baseline first if
// baselineFirst.
func (b *bench) runRound(ctx context.Context, suffix string, baselineFirst bool) (pipe, base *result, err error) {
	runPipe := func() (err error) {
		if pipe, err = b.runPipeline(ctx, suffix); err != nil {
			err = fmt.Errorf("pipeline: %w", err)
		}
		return err
	}
	runBase := func() (err error) {
		if base, err = b.runBaseline(ctx, suffix); err != nil {
			err = fmt.Errorf("baseline: %w", err)
		}
		return err
	}
	first, second := runPipe, runBase
	if baselineFirst {
		first, second = runBase, runPipe
	}
	if err := first(); err != nil {
		return nil, nil, err
	}
	if err := second(); err != nil {
		return nil, nil, err
	}
	return pipe, base, nil
}

// progress prints the load's progress on one line of stderr.
func progress(name string, total int) func(loadgen.Snapshot) {
	return func(s loadgen.Snapshot) {
		fmt.Fprintf(os.Stderr, "\r   %-9s %6d/%d sent  %6.0f req/s  p99 %-8s errors %d   ", name, s.Sent, total, s.RPS, loadgen.FormatDuration(s.P99), s.Errors)
		if s.Final {
			fmt.Fprintln(os.Stderr)
		}
	}
}

// timeout bounds the waits after the load: generous, to catch a hang.
const timeout = 10 * time.Minute

// rateText describes the arrival rate.
func rateText(rate float64) string {
	if rate <= 0 {
		return "as fast as each target answers"
	}
	return fmt.Sprintf("at a fixed %.0f requests/s", rate)
}

// sender returns the load generator's client to url, as -client says.
func (b *bench) sender(url string) (loadgen.Sender, error) {
	if b.client == "net/http" {
		return &loadgen.HTTPSender{BaseURL: url, Client: loadgen.NewClient(b.concurrency, 10*time.Second)}, nil
	}
	return loadgen.NewFastSender(url, b.concurrency, 10*time.Second)
}

// ingestHTTPServer is the HTTP server ingest runs with -http-server flag.
func ingestHTTPServer(flag string) string {
	if flag == "" {
		return ingest.HTTPServerFast // ingest's default
	}
	return flag
}
