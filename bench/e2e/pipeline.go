package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/paystream/paystream/bench/internal/rig"
	"github.com/paystream/paystream/internal/lab/topicwatch"
	"github.com/paystream/paystream/sink"
)

// proc is a subprocess under test.
type proc struct {
	name   string
	cmd    *exec.Cmd
	exited chan struct{} // closed once the process has exited
}

// start runs bin with args as a subprocess named name, its output on our
// stderr.
func start(name, bin string, args ...string) (*proc, error) {
	return startEnv(name, nil, bin, args...)
}

// startEnv is start with env added to the subprocess's environment.
func startEnv(name string, env []string, bin string, args ...string) (*proc, error) {
	cmd := exec.Command(bin, args...)
	if env != nil {
		cmd.Env = append(os.Environ(), env...)
	}
	cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	p := &proc{name: name, cmd: cmd, exited: make(chan struct{})}
	go func() {
		_ = cmd.Wait()
		close(p.exited)
	}()
	return p, nil
}

func (p *proc) pid() int { return p.cmd.Process.Pid }

// alive reports whether the process is still running.
func (p *proc) alive() bool {
	select {
	case <-p.exited:
		return false
	default:
		return true
	}
}

// stop asks the process to shut down and waits for it.
func (p *proc) stop() {
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.exited:
	case <-time.After(30 * time.Second):
		_ = p.cmd.Process.Kill()
		<-p.exited
	}
}

// freeAddr returns a loopback address nobody listens on right now.
func freeAddr() (string, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	defer ln.Close()
	return ln.Addr().String(), nil
}

// waitHTTP waits until url answers 200, or until p exits.
func waitHTTP(ctx context.Context, p *proc, url string) error {
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	for {
		if resp, err := http.Get(url); err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
		}
		if !p.alive() {
			return fmt.Errorf("%s exited", p.name)
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%s not ready at %s: %w", p.name, url, ctx.Err())
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// pipelineRun is one run of paystream's pipeline: its schema, topics and
// processes.
type pipelineRun struct {
	b                       *bench
	schema, url             string
	raw, state, dlq         string
	group                   string
	ingest, processor, sink *proc
	ingestURL               string
	// ingestMetrics, processorMetrics and sinkMetrics serve /metrics and
	// /debug/pprof.
	ingestMetrics, processorMetrics, sinkMetrics string
	adm                                          *kadm.Client
	cl                                           *kgo.Client
}

// setUpPipeline creates a fresh schema, migrates it and fresh topics with
// `paystream migrate`, starts ingest, processor and sink, and waits until
// ingest is ready and the processor owns the raw topic's partitions. On
// error, the returned run (nil if nothing was created) must still be torn
// down.
func (b *bench) setUpPipeline(ctx context.Context, suffix string) (*pipelineRun, error) {
	r := &pipelineRun{b: b, schema: "bench_e2e_" + suffix, raw: "bench-e2e-raw-" + suffix,
		state: "bench-e2e-state-" + suffix, dlq: "bench-e2e-dlq-" + suffix, group: "bench-e2e-" + suffix}
	if _, err := b.admin.Exec(ctx, "CREATE SCHEMA "+r.schema); err != nil {
		return nil, fmt.Errorf("create schema: %w", err)
	}
	r.url = withSearchPath(b.dbURL, r.schema)
	cl, err := kgo.NewClient(kgo.SeedBrokers(b.brokers...))
	if err != nil {
		return r, err
	}
	r.cl, r.adm = cl, kadm.NewClient(cl)

	common := []string{"--log-level", "warn", "--kafka-brokers", strings.Join(b.brokers, ","),
		"--raw-topic", r.raw, "--state-topic", r.state, "--dlq-topic", r.dlq}
	migrate := exec.CommandContext(ctx, b.binary, append([]string{"migrate", "--database-url", r.url,
		"--partitions", strconv.Itoa(b.partitions), "--sources", b.sourcesPath}, common...)...)
	if out, err := migrate.CombinedOutput(); err != nil {
		return r, fmt.Errorf("paystream migrate: %w\n%s", err, out)
	}
	addr, err := freeAddr()
	if err != nil {
		return r, err
	}
	r.ingestURL = "http://" + addr
	if r.ingestMetrics, err = freeAddr(); err != nil {
		return r, err
	}
	ingestArgs := []string{"ingest", "--sources", b.sourcesPath, "--http-addr", addr, "--metrics-addr", r.ingestMetrics}
	if b.httpServer != "" {
		ingestArgs = append(ingestArgs, "--http-server", b.httpServer)
	}
	var ingestEnv []string
	if b.ingestProcs > 0 {
		ingestEnv = []string{"GOMAXPROCS=" + strconv.Itoa(b.ingestProcs)}
	}
	if r.ingest, err = startEnv("ingest", ingestEnv, b.binary, append(ingestArgs, common...)...); err != nil {
		return r, err
	}
	if r.processorMetrics, err = freeAddr(); err != nil {
		return r, err
	}
	if r.sinkMetrics, err = freeAddr(); err != nil {
		return r, err
	}
	if r.processor, err = start("processor", b.binary, append([]string{"processor", "--database-url", r.url, "--group", r.group,
		"--metrics-addr", r.processorMetrics}, common...)...); err != nil {
		return r, err
	}
	if r.sink, err = start("sink", b.binary, append([]string{"sink", "--database-url", r.url, "--metrics-addr", r.sinkMetrics}, common...)...); err != nil {
		return r, err
	}
	if err := waitHTTP(ctx, r.ingest, r.ingestURL+"/readyz"); err != nil {
		return r, err
	}
	return r, r.waitGroupStable(ctx)
}

// waitGroupStable waits until the processor's group is stable with every
// raw partition assigned, so the run does not time the group join.
func (r *pipelineRun) waitGroupStable(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	for {
		groups, err := r.adm.DescribeGroups(ctx, r.group)
		if err == nil {
			if g, ok := groups[r.group]; ok && g.State == "Stable" {
				assigned := 0
				for _, m := range g.Members {
					if c, ok := m.Assigned.AsConsumer(); ok {
						for _, t := range c.Topics {
							assigned += len(t.Partitions)
						}
					}
				}
				if assigned == r.b.partitions {
					return nil
				}
			}
		}
		if !r.processor.alive() {
			return errors.New("processor exited")
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("processor group %s not stable: %w", r.group, ctx.Err())
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// tearDown stops the processes and drops the schema and topics.
func (r *pipelineRun) tearDown() {
	for _, p := range []*proc{r.ingest, r.processor, r.sink} {
		if p != nil {
			p.stop()
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if r.adm != nil {
		_, _ = r.adm.DeleteTopics(ctx, r.raw, r.state, r.dlq)
		r.cl.Close()
	}
	if !r.b.keep {
		_, _ = r.b.admin.Exec(ctx, "DROP SCHEMA IF EXISTS "+r.schema+" CASCADE")
	}
	// The sink's slot and publication belong to the database, not the
	// schema: a slot left behind holds WAL, and the catalog rows vacuum
	// may remove, forever, and the server has a few dozen slots at most.
	// The sink has stopped, so the slot is free.
	var database string
	_ = r.b.admin.QueryRow(ctx, `SELECT current_database()`).Scan(&database)
	slot := sink.SlotName(database, r.schema)
	if _, err := r.b.admin.Exec(ctx, `SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE slot_name = $1`, slot); err != nil {
		fmt.Fprintf(os.Stderr, "bench-e2e: drop replication slot %s: %v\n", slot, err)
	}
	_, _ = r.b.admin.Exec(ctx, "DROP PUBLICATION IF EXISTS "+pgx.Identifier{slot}.Sanitize())
}

// consumed returns the raw records the processor has committed: the sum
// of its partitions' next offsets, which move in the same transaction as
// the records' inbox rows.
func (r *pipelineRun) consumed(ctx context.Context, conn *pgx.Conn) (int64, error) {
	var n int64
	err := conn.QueryRow(ctx, `SELECT COALESCE(sum(next_offset), 0)::bigint FROM `+r.schema+`.consumer_offsets WHERE group_id = $1`, r.group).Scan(&n)
	return n, err
}

// rawRecords returns the number of records on the raw topic.
func (r *pipelineRun) rawRecords(ctx context.Context) (int64, error) {
	return rig.Records(ctx, r.adm, r.raw)
}

// stateWatcher reads the state topic from its start and records when each
// state event arrived, by the webhook event id that caused it.
type stateWatcher struct {
	tw     *topicwatch.Watcher
	mu     sync.Mutex
	seen   map[string]bool // state event ids
	byTrig map[string]stateArrival
}

// stateArrival is one state event as the watcher saw it.
type stateArrival struct {
	paymentKey string
	version    int64
	at         time.Time
}

func watchState(brokers []string, topic string) (*stateWatcher, error) {
	w := &stateWatcher{seen: map[string]bool{}, byTrig: map[string]stateArrival{}}
	// The watcher reads committed Kafka transactions only (what a data
	// team's consumer sees), so an event counts as published when the
	// relay's transaction commits, not when its records are written.
	tw, err := topicwatch.Start(brokers, topic, w.record,
		// The watcher is the bench's instrument, not part of either
		// design, and its fetches are on the broker's CPU: fetch up to
		// 64 KiB at a time, waiting at most 10 ms (franz-go's least) for
		// them, which can only add to the accepted→published figures.
		kgo.FetchMinBytes(64<<10), kgo.FetchMaxWait(10*time.Millisecond))
	if err != nil {
		return nil, err
	}
	w.tw = tw
	return w, nil
}

// record notes the state events of one fetch, all arrived now.
func (w *stateWatcher) record(fetches kgo.Fetches) {
	now := time.Now()
	fetches.EachRecord(func(rec *kgo.Record) {
		var ev struct {
			EventID       string `json:"event_id"`
			PaymentKey    string `json:"payment_key"`
			Version       int64  `json:"version"`
			SourceEventID string `json:"source_event_id"`
		}
		if json.Unmarshal(rec.Value, &ev) != nil {
			return
		}
		w.mu.Lock()
		defer w.mu.Unlock()
		if w.seen[ev.EventID] {
			return // a relay re-send: the first arrival counts
		}
		w.seen[ev.EventID] = true
		if _, ok := w.byTrig[ev.SourceEventID]; !ok {
			w.byTrig[ev.SourceEventID] = stateArrival{paymentKey: ev.PaymentKey, version: ev.Version, at: now}
		}
	})
}

// count returns the number of distinct state events seen.
func (w *stateWatcher) count() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return len(w.seen)
}

// arrivals returns the state events seen, by the webhook event id that
// caused each.
func (w *stateWatcher) arrivals() map[string]stateArrival {
	w.mu.Lock()
	defer w.mu.Unlock()
	out := make(map[string]stateArrival, len(w.byTrig))
	for k, v := range w.byTrig {
		out[k] = v
	}
	return out
}

func (w *stateWatcher) close() { w.tw.Close() }

func withSearchPath(url, schema string) string {
	sep := "?"
	if strings.Contains(url, "?") {
		sep = "&"
	}
	return url + sep + "search_path=" + schema
}

// writeSources writes the bench's sources file and returns its path.
func writeSources(dir string) (string, error) {
	path := filepath.Join(dir, "sources.yaml")
	return path, os.WriteFile(path, []byte(rig.SourcesYAML), 0o600)
}
