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
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"runtime"
	"runtime/pprof"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/paystream/paystream/ingest"
	"github.com/paystream/paystream/internal/lab/loadgen"
	"github.com/paystream/paystream/internal/provider"
	"github.com/paystream/paystream/internal/provider/drivers"
	"github.com/paystream/paystream/internal/source"
)

// Goals of the ingest issue.
const (
	goalRatio = 0.50
	goalP99   = 25 * time.Millisecond
)

const sourcesYAML = `
sources:
  - name: bench
    driver: standardwebhooks
    secrets: ["whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"]
`

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
	flag.IntVar(&o.brokerPID, "broker-pid", stackBrokerPID(), "pid of the Kafka broker, to report its CPU (default: the local stack's; 0: not reported)")
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
	sources, err := source.Parse([]byte(sourcesYAML), drivers.Factories())
	if err != nil {
		return err
	}
	lsrcs, err := loadgen.ParseSources([]byte(sourcesYAML))
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

// cpuPerRequest returns the CPU microseconds (bench process and broker)
// one request of r cost.
func cpuPerRequest(c cpuUse, r *loadgen.Result) float64 {
	if r.Throughput() == 0 {
		return 0
	}
	return (c.process + c.broker) * 1e6 / r.Throughput()
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

// createTopics creates the bench's raw and DLQ topics and returns a
// function deleting them.
func createTopics(ctx context.Context, brokers []string, partitions int) (raw, dlq string, cleanup func(), err error) {
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...))
	if err != nil {
		return "", "", nil, err
	}
	adm := kadm.NewClient(cl)
	suffix, _ := runID()
	raw, dlq = "bench-ingest-raw-"+suffix, "bench-ingest-dlq-"+suffix
	cleanup = func() {
		dctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
		defer cancel()
		_, _ = adm.DeleteTopics(dctx, raw, dlq)
		cl.Close()
	}
	cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	for topic, n := range map[string]int32{raw: int32(partitions), dlq: 1} {
		resp, err := adm.CreateTopic(cctx, n, 1, nil, topic)
		if err == nil {
			err = resp.Err
		}
		if err != nil {
			cleanup()
			return "", "", nil, fmt.Errorf("create topic %s: %w", topic, err)
		}
	}
	// Wait until every partition has a leader.
	for {
		md, err := adm.Metadata(cctx, raw, dlq)
		ready := err == nil
		if ready {
			for _, t := range []string{raw, dlq} {
				td := md.Topics[t]
				if td.Err != nil || len(td.Partitions) == 0 {
					ready = false
				}
				for _, p := range td.Partitions {
					if p.Err != nil || p.Leader < 0 {
						ready = false
					}
				}
			}
		}
		if ready {
			return raw, dlq, cleanup, nil
		}
		select {
		case <-cctx.Done():
			cleanup()
			return "", "", nil, fmt.Errorf("topics not ready: %w", cctx.Err())
		case <-time.After(50 * time.Millisecond):
		}
	}
}

func endOffsets(ctx context.Context, brokers []string, topic string) (int64, error) {
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...))
	if err != nil {
		return 0, err
	}
	defer cl.Close()
	ends, err := kadm.NewClient(cl).ListEndOffsets(ctx, topic)
	if err != nil {
		return 0, err
	}
	var total int64
	var perr error
	ends.Each(func(o kadm.ListedOffset) {
		if o.Err != nil {
			perr = o.Err
		}
		total += o.Offset
	})
	return total, perr
}

// serve runs serveFn on a loopback listener until the returned stop is
// called, and returns the base URL.
func serve(ctx context.Context, serveFn func(context.Context, net.Listener) error) (string, func(), error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", nil, err
	}
	sctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- serveFn(sctx, ln) }()
	return "http://" + ln.Addr().String(), func() {
		cancel()
		if err := <-done; err != nil {
			fmt.Fprintln(os.Stderr, "bench-ingest: server:", err)
		}
	}, nil
}

// bareServe returns a server that answers 200 to requests src's driver
// verifies, 401 to others: net/http, the body limit and the signature
// check, nothing else.
func bareServe(src *source.Source) func(context.Context, net.Listener) error {
	ok := []byte(`{"received":true}` + "\n")
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodPost || r.URL.Path != "/webhooks/"+src.Name {
			http.NotFound(w, r)
			return
		}
		body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, src.MaxBodyBytes))
		if err != nil {
			http.Error(w, "bad body", http.StatusBadRequest)
			return
		}
		if err := src.Driver.Verify(&provider.Request{Header: r.Header, Query: r.URL.Query(), Body: body, Now: time.Now()}); err != nil {
			http.Error(w, "unauthorized", http.StatusUnauthorized)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write(ok)
	})
	return func(ctx context.Context, ln net.Listener) error {
		hs := &http.Server{Handler: h, ReadHeaderTimeout: 5 * time.Second, ReadTimeout: 15 * time.Second}
		go func() {
			<-ctx.Done()
			sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			_ = hs.Shutdown(sctx)
		}()
		if err := hs.Serve(ln); !errors.Is(err, http.ErrServerClosed) {
			return err
		}
		return nil
	}
}

func waitReady(ctx context.Context, url string) error {
	deadline := time.Now().Add(30 * time.Second)
	for {
		resp, err := http.Get(url)
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("ingest not ready at %s after 30s", url)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
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

// cpuSample is the CPU time used so far by this process, the broker and
// the whole machine, and when.
type cpuSample struct {
	at                     time.Time
	process, broker, total time.Duration
}

// cpuUse is CPU used over an interval, in cores (1.0 = one core busy).
type cpuUse struct{ process, broker, machine float64 }

// add returns u plus o weighted by its duration d, for per.
func (u cpuUse) add(o cpuUse, d time.Duration) cpuUse {
	s := d.Seconds()
	return cpuUse{u.process + o.process*s, u.broker + o.broker*s, u.machine + o.machine*s}
}

// per turns a sum of add calls back into cores over total.
func (u cpuUse) per(total time.Duration) cpuUse {
	s := total.Seconds()
	if s <= 0 {
		return cpuUse{}
	}
	return cpuUse{u.process / s, u.broker / s, u.machine / s}
}

// clockTick is USER_HZ, the unit of /proc's CPU times: 100 on Linux.
const clockTick = time.Second / 100

func readCPU(brokerPID int) cpuSample {
	s := cpuSample{at: time.Now()}
	var ru syscall.Rusage
	if syscall.Getrusage(syscall.RUSAGE_SELF, &ru) == nil {
		s.process = time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
	}
	// /proc/stat's first line: cpu user nice system idle iowait irq softirq steal guest guest_nice.
	if b, err := os.ReadFile("/proc/stat"); err == nil {
		line, _, _ := strings.Cut(string(b), "\n")
		fields := strings.Fields(line)
		var busy int64
		for i := 1; i < len(fields) && i <= 8; i++ {
			if i == 4 || i == 5 { // idle, iowait
				continue
			}
			n, _ := strconv.ParseInt(fields[i], 10, 64)
			busy += n
		}
		s.total = time.Duration(busy) * clockTick
	}
	if brokerPID > 0 {
		// /proc/PID/stat: utime and stime are fields 14 and 15; the
		// command name (field 2) may hold spaces, so count after its ')'.
		if b, err := os.ReadFile("/proc/" + strconv.Itoa(brokerPID) + "/stat"); err == nil {
			if i := strings.LastIndexByte(string(b), ')'); i > 0 {
				f := strings.Fields(string(b)[i+1:])
				if len(f) > 12 {
					ut, _ := strconv.ParseInt(f[11], 10, 64)
					st, _ := strconv.ParseInt(f[12], 10, 64)
					s.broker = time.Duration(ut+st) * clockTick
				}
			}
		}
	}
	return s
}

func (s cpuSample) since(before cpuSample) cpuUse {
	wall := s.at.Sub(before.at).Seconds()
	if wall <= 0 {
		return cpuUse{}
	}
	return cpuUse{
		process: (s.process - before.process).Seconds() / wall,
		broker:  (s.broker - before.broker).Seconds() / wall,
		machine: (s.total - before.total).Seconds() / wall,
	}
}

// stackBrokerPID returns the pid of the local stack's broker
// (deploy/stack.sh), or 0.
func stackBrokerPID() int {
	dir := os.Getenv("PAYSTREAM_STACK_DIR")
	if dir == "" {
		home, err := os.UserHomeDir()
		if err != nil {
			return 0
		}
		dir = home + "/.cache/paystream/stack"
	}
	b, err := os.ReadFile(dir + "/kafka/kafka.pid")
	if err != nil {
		return 0
	}
	pid, _ := strconv.Atoi(strings.TrimSpace(string(b)))
	if _, err := os.Stat("/proc/" + strconv.Itoa(pid)); err != nil {
		return 0
	}
	return pid
}
