// Command ingest-bench measures paystream's ingest on a real Kafka broker
// against a bare net/http handler that only verifies the same Standard
// Webhooks HMAC, both driven over loopback by the same load generator
// (internal/lab/loadgen), and then ingest's latency at a fixed rate. `make
// bench-ingest` runs it with the local stack.
//
//	go run ./bench/ingest [-full 15s] [-fixed 20s] [-rate 5000] [-c 128] [-cpuprofile ingest.pprof]
//
// Brokers come from PAYSTREAM_TEST_KAFKA_BROKERS (else
// PAYSTREAM_KAFKA_BROKERS). The program creates its own topics and deletes
// them when done.
package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"os/signal"
	"runtime"
	"runtime/pprof"
	"strings"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/paystream/paystream/bench/internal/rig"
	"github.com/paystream/paystream/ingest"
	"github.com/paystream/paystream/internal/lab/loadgen"
	"github.com/paystream/paystream/internal/provider/drivers"
	"github.com/paystream/paystream/internal/source"
)

// Goals of the ingest issue.
const (
	goalRatio = 0.50
	goalP99   = 25 * time.Millisecond
)

type options struct {
	full, fixed, warmup time.Duration
	rounds              int
	rate                float64
	concurrency         int
	partitions          int
	payments            int
	cpuProfile          string
	brokerPID           int
	linger              time.Duration
	compression         string
	httpServer          string
	client              string
}

func main() {
	var o options
	flag.DurationVar(&o.full, "full", 15*time.Second, "total duration of each full-speed measurement (bare handler, ingest), split in -rounds alternating runs")
	flag.IntVar(&o.rounds, "rounds", 3, "alternating bare/ingest rounds the full-speed measurements are split in, so a load change on the machine hits both")
	flag.DurationVar(&o.fixed, "fixed", 20*time.Second, "duration of the fixed-rate ingest run")
	flag.DurationVar(&o.warmup, "warmup", 2*time.Second, "warm-up before each full-speed run")
	flag.Float64Var(&o.rate, "rate", 5000, "requests per second of the fixed-rate run")
	flag.IntVar(&o.concurrency, "c", 128, "load generator workers (enough to saturate both targets on 2 CPUs)")
	flag.IntVar(&o.partitions, "partitions", 3, "partitions of the raw topic")
	flag.IntVar(&o.payments, "payments", 10000, "distinct payment ids")
	flag.StringVar(&o.cpuProfile, "cpuprofile", "", "write a CPU profile of the first ingest full-speed round to this file")
	flag.IntVar(&o.brokerPID, "broker-pid", rig.StackBrokerPID(), "pid of the Kafka broker, to report its CPU (default: the local stack's; 0: not reported)")
	flag.DurationVar(&o.linger, "linger", -1, "override ingest's producer linger (experiments)")
	flag.StringVar(&o.compression, "compression", "", "override ingest's producer compression: none, snappy, lz4, zstd (experiments)")
	flag.StringVar(&o.httpServer, "http-server", ingest.HTTPServerFast, `ingest's HTTP server: "fasthttp" (ingest's default) or "net/http" (the bare handler is net/http either way)`)
	flag.StringVar(&o.client, "client", "fasthttp", `the load generator's HTTP client: "fasthttp" (a fraction of net/http's CPU per request, which the targets get instead) or "net/http" (as before 2026-12-02)`)
	flag.Parse()

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, o); err != nil {
		fmt.Fprintln(os.Stderr, "bench-ingest:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, o options) error {
	if o.client != "fasthttp" && o.client != "net/http" {
		return fmt.Errorf(`-client %q: want "fasthttp" or "net/http"`, o.client)
	}
	brokers := brokersFromEnv()
	if len(brokers) == 0 {
		return errors.New("no Kafka: set PAYSTREAM_TEST_KAFKA_BROKERS (make bench-ingest does, after deploy/stack.sh up)")
	}
	sources, err := source.Parse([]byte(rig.SourcesYAML), drivers.Factories())
	if err != nil {
		return err
	}
	lsrcs, err := loadgen.ParseSources([]byte(rig.SourcesYAML))
	if err != nil {
		return err
	}
	raw, dlq, cleanup, err := createTopics(ctx, brokers, o.partitions)
	if err != nil {
		return err
	}
	defer cleanup()

	// The ingest under test, on the real broker.
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	var kopts []kgo.Opt
	if o.linger >= 0 {
		kopts = append(kopts, kgo.ProducerLinger(o.linger))
	}
	if o.compression != "" {
		codec, ok := map[string]kgo.CompressionCodec{
			"none": kgo.NoCompression(), "snappy": kgo.SnappyCompression(), "lz4": kgo.Lz4Compression(), "zstd": kgo.ZstdCompression(),
		}[o.compression]
		if !ok {
			return fmt.Errorf("-compression %q: want none, snappy, lz4 or zstd", o.compression)
		}
		kopts = append(kopts, kgo.ProducerBatchCompression(codec))
	}
	srv, err := ingest.New(ingest.Config{
		Sources: sources, Brokers: brokers, Topic: raw, DLQTopic: dlq,
		Logger: log, Registerer: prometheus.NewRegistry(), KafkaOpts: kopts, HTTPServer: o.httpServer,
	})
	if err != nil {
		return err
	}
	ingestURL, stopIngest, err := serve(ctx, srv.Serve)
	if err != nil {
		srv.Close()
		return err
	}
	defer stopIngest()
	if err := waitReady(ctx, ingestURL+"/readyz"); err != nil {
		return err
	}

	// The bare handler: the same signature check, nothing else.
	bareURL, stopBare, err := serve(ctx, bareServe(sources["bench"]))
	if err != nil {
		return err
	}
	defer stopBare()

	fmt.Printf("bench-ingest: %d CPUs (GOMAXPROCS %d), Kafka %s (acks=all, idempotent producer), raw topic with %d partitions, ingest on %s, the bare handler on net/http\n",
		runtime.NumCPU(), runtime.GOMAXPROCS(0), strings.Join(brokers, ","), o.partitions, o.httpServer)
	fmt.Printf("note: the load generator, ingest, the bare handler and the Kafka broker all share this machine's %d CPUs;\n"+
		"      the load generator's own CPU is taken from what ingest and the broker could use.\n\n", runtime.NumCPU())

	drive := func(url string, rate float64, d time.Duration) (*loadgen.Result, cpuUse, error) {
		run, runNum := runID()
		b, err := loadgen.NewBuilder(lsrcs[0], run, runNum)
		if err != nil {
			return nil, cpuUse{}, err
		}
		gen, err := loadgen.NewGenerator(loadgen.GeneratorConfig{Builders: []*loadgen.Builder{b}, Payments: o.payments})
		if err != nil {
			return nil, cpuUse{}, err
		}
		var sender loadgen.Sender = &loadgen.HTTPSender{BaseURL: url, Client: loadgen.NewClient(o.concurrency, 10*time.Second)}
		if o.client == "fasthttp" {
			if sender, err = loadgen.NewFastSender(url, o.concurrency, 10*time.Second); err != nil {
				return nil, cpuUse{}, err
			}
		}
		before := readCPU(o.brokerPID)
		res, err := loadgen.Run(ctx, loadgen.Config{URL: url, Generator: gen, Rate: rate, Concurrency: o.concurrency, Duration: d, Sender: sender})
		if err == nil && ctx.Err() != nil {
			err = ctx.Err()
		}
		return res, readCPU(o.brokerPID).since(before), err
	}

	rounds := max(o.rounds, 1)
	fmt.Printf("full speed, %d workers, %s per target in %d alternating rounds (after %s of warm-up each):\n", o.concurrency, o.full, rounds, o.warmup)
	for _, u := range []string{bareURL, ingestURL} {
		if _, _, err := drive(u, 0, o.warmup); err != nil {
			return err
		}
	}
	bare, full := &loadgen.Result{}, &loadgen.Result{}
	var bareCPU, fullCPU cpuUse
	for round := range rounds {
		r, c, err := drive(bareURL, 0, o.full/time.Duration(rounds))
		if err != nil {
			return err
		}
		bare.Merge(r)
		bareCPU = bareCPU.add(c, r.Elapsed)
		var stopProfile func()
		if o.cpuProfile != "" && round == 0 {
			if stopProfile, err = startProfile(o.cpuProfile); err != nil {
				return err
			}
		}
		r, c, err = drive(ingestURL, 0, o.full/time.Duration(rounds))
		if stopProfile != nil {
			stopProfile()
		}
		if err != nil {
			return err
		}
		full.Merge(r)
		fullCPU = fullCPU.add(c, r.Elapsed)
	}
	printLine("bare HMAC handler", bare, bareCPU.per(bare.Elapsed))
	printLine("ingest", full, fullCPU.per(full.Elapsed))
	ratio := full.Throughput() / bare.Throughput()
	fmt.Printf("  %-18s %5.1f%% of the bare handler's throughput (goal ≥ %.0f%%: %s)\n", "ratio", 100*ratio, 100*goalRatio, verdict(ratio >= goalRatio))
	// Other work on the machine shifts the throughputs between rounds; the
	// CPU each request cost (this process, plus the broker for ingest)
	// shifts much less, so its ratio says what the throughput ratio would
	// be with the machine to ourselves.
	bareCost, fullCost := cpuPerRequest(bareCPU.per(bare.Elapsed), bare), cpuPerRequest(fullCPU.per(full.Elapsed), full)
	if bareCost > 0 && fullCost > 0 {
		fmt.Printf("  %-18s %.0fµs per request for the bare handler, %.0fµs for ingest (broker included): ratio %.1f%%\n",
			"cpu cost", bareCost, fullCost, 100*bareCost/fullCost)
	}
	fmt.Println()

	fmt.Printf("ingest at a fixed %.0f req/s, %d workers, %s:\n", o.rate, o.concurrency, o.fixed)
	fixed, fixedCPU, err := drive(ingestURL, o.rate, o.fixed)
	if err != nil {
		return err
	}
	printLine("ingest", fixed, fixedCPU)
	p99 := fixed.Latency.Quantile(0.99)
	reached := fixed.Throughput() >= 0.95*o.rate
	fmt.Printf("  %-18s p50 %s  p99 %s (goal ≤ %s: %s)%s\n", "latency",
		loadgen.FormatDuration(fixed.Latency.Quantile(0.5)), loadgen.FormatDuration(p99), loadgen.FormatDuration(goalP99),
		verdict(p99 <= goalP99 && reached), map[bool]string{true: "", false: "  — target rate NOT reached"}[reached])

	// Every 2xx must be in Kafka: compare with the topic's end offsets.
	acked := full.OK() + fixed.OK()
	stored, err := endOffsets(ctx, brokers, raw)
	if err != nil {
		return err
	}
	fmt.Printf("\ncheck: %d records on the raw topic ≥ %d answered 2xx in the measured ingest runs: %s\n", stored, acked, verdict(stored >= acked))
	if stored < acked {
		return errors.New("fewer records on the topic than 2xx answers")
	}
	return nil
}

func verdict(ok bool) string {
	if ok {
		return "OK"
	}
	return "MISSED"
}

func printLine(name string, r *loadgen.Result, cpu cpuUse) {
	other := ""
	if codes := r.StatusCodes(); len(codes) != 1 || codes[0] != http.StatusOK || len(r.Errors) > 0 {
		other = fmt.Sprintf("  status %v errors %v", r.Status, r.Errors)
	}
	broker := ""
	if cpu.broker > 0 {
		broker = fmt.Sprintf(", broker %3.0f%%", 100*cpu.broker)
	}
	fmt.Printf("  %-18s %7.0f req/s  p50 %-7s p90 %-7s p99 %-7s max %-7s  cpu (100%% = 1 core): bench process %3.0f%%%s, whole machine %3.0f%%%s\n",
		name, r.Throughput(),
		loadgen.FormatDuration(r.Latency.Quantile(0.5)), loadgen.FormatDuration(r.Latency.Quantile(0.9)),
		loadgen.FormatDuration(r.Latency.Quantile(0.99)), loadgen.FormatDuration(r.Latency.Max()),
		100*cpu.process, broker, 100*cpu.machine, other)
}

func brokersFromEnv() []string {
	for _, name := range []string{"PAYSTREAM_TEST_KAFKA_BROKERS", "PAYSTREAM_KAFKA_BROKERS"} {
		var out []string
		for b := range strings.SplitSeq(os.Getenv(name), ",") {
			if b = strings.TrimSpace(b); b != "" {
				out = append(out, b)
			}
		}
		if len(out) > 0 {
			return out
		}
	}
	return nil
}

func runID() (string, uint32) {
	var b [4]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:3]), uint32(b[0])<<24 | uint32(b[1])<<16 | uint32(b[2])<<8 | uint32(b[3])
}

func startProfile(path string) (func(), error) {
	f, err := os.Create(path)
	if err != nil {
		return nil, err
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		f.Close()
		return nil, err
	}
	return func() {
		pprof.StopCPUProfile()
		f.Close()
		fmt.Fprintf(os.Stderr, "bench-ingest: CPU profile of the first ingest full-speed round in %s (go tool pprof %s)\n", path, path)
	}, nil
}
