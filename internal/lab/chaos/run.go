package chaos

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// Config is what a chaos run needs.
type Config struct {
	// Binary is the paystream binary run as ingest, processor and sink.
	Binary string
	// DatabaseURL and Brokers are the shared stack: the scenarios that
	// only break paystream's own processes and connections run there, each
	// in its own schema, topics and group.
	DatabaseURL string
	Brokers     []string
	// NewSchema, when set, gives each shared-stack scenario its schema
	// (tests use testenv.NewDB): a database URL whose search_path is the
	// schema, and the schema's name. By default the harness creates a
	// schema in DatabaseURL's database.
	NewSchema func() (url, schema string, err error)
	// Private is the stack for the scenarios that stop or kill a server;
	// nil skips them, saying so in their result.
	Private *PrivateStack
	// Deliveries is each scenario's number of webhook deliveries, at least
	// (the simulation rounds up to whole payment histories).
	Deliveries int
	// Rate is deliveries per second (0: as fast as ingest answers). A
	// paced run keeps traffic flowing while the faults happen.
	Rate float64
	// Partitions of the raw and state topics.
	Partitions int
	// Seed makes the simulated histories reproducible (0: random).
	Seed int64
	// WorkDir receives each scenario's process logs.
	WorkDir string
	// Keep leaves each scenario's schema in place.
	Keep bool
	// RecoveryTimeout bounds the wait for the pipeline to catch up after
	// each fault, and after the last delivery.
	RecoveryTimeout time.Duration
	Logger          *slog.Logger
}

// Result is one scenario's outcome: one row of the table.
type Result struct {
	Scenario string `json:"scenario"`
	// Skipped says why the scenario did not run (no private stack).
	Skipped string `json:"skipped,omitempty"`
	// Deliveries is the number of webhook deliveries the simulation made,
	// duplicates included; Acked of them were answered 2xx (a delivery is
	// retried until it is).
	Deliveries int `json:"deliveries"`
	Acked      int `json:"acked_2xx"`
	// Unavailable counts 503 answers, Failed other failed attempts
	// (refused connections while ingest restarts, timeouts, other codes).
	Unavailable int `json:"answered_503"`
	Failed      int `json:"failed_attempts"`
	// Lost, DuplicateEffects and StateEvents come from the simulation's
	// verification (invariants I1, I2, I3/I6); -1 when it could not say.
	Lost             int `json:"lost"`
	DuplicateEffects int `json:"duplicate_effects"`
	// StateEvents counts state events seen twice or never, for a
	// read_committed consumer.
	StateEvents int `json:"duplicate_or_missing_state_events"`
	// Recovery is the longest of the faults' recovery times.
	Recovery time.Duration `json:"recovery_ns"`
	// Drain is from the last acknowledged delivery to everything
	// processed and published.
	Drain      time.Duration   `json:"drain_ns"`
	Faults     []FaultResult   `json:"faults"`
	Invariants []InvariantLine `json:"invariants"`
	Elapsed    time.Duration   `json:"elapsed_ns"`
	// OK: every fault injected, the pipeline recovered and every
	// invariant held.
	OK bool `json:"ok"`
	// Error is what went wrong in the harness or the pipeline, if anything.
	Error string `json:"error,omitempty"`
	// Logs is the directory with the processes' logs.
	Logs string `json:"logs"`
	// Schema is the scenario's schema when it was kept (-keep, or the
	// scenario failed); dropped otherwise.
	Schema string `json:"schema,omitempty"`
}

// FaultResult is one injected fault.
type FaultResult struct {
	Name string `json:"name"`
	// Progress is the fraction of deliveries acknowledged when it started.
	Progress float64 `json:"progress"`
	// Recovery: from the repair (process restarted, toxic removed, server
	// back) until the pipeline had processed every raw record written
	// before the repair and published their state events; the restarted
	// process's own start-up counts, a server's does not.
	Recovery time.Duration `json:"recovery_ns"`
	// Took is the fault itself: from breaking to repaired (a SIGTERMed
	// ingest's shutdown grace, a server's start-up, a toxic's window).
	Took  time.Duration `json:"took_ns"`
	Error string        `json:"error,omitempty"`
}

// InvariantLine is one invariant the verification checked.
type InvariantLine struct {
	ID     string `json:"id"`
	Name   string `json:"name"`
	OK     bool   `json:"ok"`
	Detail string `json:"detail"`
}

// deliveryCounts is what the simulation's delivery reports.
type deliveryCounts struct {
	deliveries, acked, unavailable, failed, givenUp int
}

// Run runs one scenario and returns its row. It never panics on a broken
// pipeline: what went wrong is in Result.Error.
func Run(ctx context.Context, cfg Config, sc Scenario) (res Result) {
	res = Result{Scenario: sc.Name, Lost: -1, DuplicateEffects: -1, StateEvents: -1}
	start := time.Now()
	defer func() { res.Elapsed = time.Since(start) }()
	srv := servers{databaseURL: cfg.DatabaseURL, brokers: cfg.Brokers, newSchema: cfg.NewSchema}
	if sc.Private {
		if cfg.Private == nil {
			res.Skipped = "needs the private stack (it stops or kills a server)"
			return res
		}
		srv = servers{databaseURL: cfg.Private.DatabaseURL(), brokers: cfg.Private.Brokers(), private: cfg.Private}
	}
	log := cfg.Logger.With("scenario", sc.Name)
	logDir := filepath.Join(cfg.WorkDir, sc.Name)
	res.Logs = logDir
	if err := os.MkdirAll(logDir, 0o755); err != nil {
		res.Error = err.Error()
		return res
	}
	if err := run(ctx, cfg, sc, srv, logDir, log, &res); err != nil {
		res.Error = err.Error()
	}
	res.OK = res.Error == "" && res.Lost == 0 && res.DuplicateEffects == 0 && res.StateEvents == 0
	for _, f := range res.Faults {
		res.Recovery = max(res.Recovery, f.Recovery)
		if f.Error != "" {
			res.OK = false
		}
	}
	for _, inv := range res.Invariants {
		res.OK = res.OK && inv.OK
	}
	return res
}

func run(ctx context.Context, cfg Config, sc Scenario, srv servers, logDir string, log *slog.Logger, res *Result) (failed error) {
	p := &pipeline{sc: sc, srv: srv, bin: cfg.Binary, logDir: logDir, log: log, partitions: cfg.Partitions}
	var err error
	if p.ingestAddr, err = freeAddr(); err != nil {
		return err
	}
	gw, err := newGateway(logDir)
	if err != nil {
		return err
	}
	defer gw.ln.Close()
	p.sources = gw.sources
	defer func() {
		// A failed scenario's schema stays, for a look at what went wrong.
		keep := cfg.Keep || failed != nil
		if keep && p.schema != "" {
			res.Schema = p.schema
		}
		p.tearDown(keep)
	}()
	if err := p.setUp(ctx); err != nil {
		return fmt.Errorf("set up: %w", err)
	}
	log.Info("pipeline up", "schema", p.schema, "raw_topic", p.raw)
	w, err := newWorkload(workloadConfig{gw: gw, ingestURL: "http://" + p.ingestAddr, deliveries: cfg.Deliveries,
		rate: cfg.Rate, seed: cfg.Seed, brokers: srv.brokers, raw: p.raw, group: p.group, pool: p.pool, log: log})
	if err != nil {
		return fmt.Errorf("simulation: %w", err)
	}
	defer w.close()

	var acked, total atomic.Int64
	progressed := make(chan struct{}, 1)
	deliverCtx, cancelDeliver := context.WithCancel(ctx)
	defer cancelDeliver()
	var counts deliveryCounts
	var deliverErr error
	var lastAck time.Time
	delivered := make(chan struct{})
	go func() {
		defer close(delivered)
		counts, deliverErr = w.deliver(deliverCtx, func(a, t int) {
			acked.Store(int64(a))
			total.Store(int64(t))
			select {
			case progressed <- struct{}{}:
			default:
			}
		})
		lastAck = time.Now()
	}()

	progress := func() float64 {
		if total.Load() == 0 {
			return 0
		}
		return float64(acked.Load()) / float64(total.Load())
	}
	// waitProgress returns once the deliveries reached at, or ended.
	waitProgress := func(at float64) error {
		for progress() < at {
			select {
			case <-progressed:
			case <-delivered:
				if deliverErr != nil {
					return fmt.Errorf("delivery stopped: %w", deliverErr)
				}
				return nil // every delivery acknowledged
			case <-ctx.Done():
				return ctx.Err()
			}
		}
		return nil
	}
	// Faults, each once its progress is reached and the pipeline
	// recovered from the one before.
	var faultsErr error
	for _, f := range sc.Faults {
		if faultsErr = waitProgress(f.At); faultsErr != nil {
			break
		}
		fr := FaultResult{Name: f.Name, Progress: progress()}
		log.Info("fault", "fault", f.Name, "progress", fmt.Sprintf("%.0f%%", 100*fr.Progress))
		began := time.Now()
		err := f.Inject(ctx, p)
		fr.Took = time.Since(began)
		if err != nil {
			fr.Error = err.Error()
			res.Faults = append(res.Faults, fr)
			faultsErr = fmt.Errorf("%s: %w", f.Name, err)
			break
		}
		fr.Recovery, err = p.awaitRecovery(ctx, cfg.RecoveryTimeout)
		if err != nil {
			fr.Error = err.Error()
		}
		log.Info("recovered", "fault", f.Name, "after", fr.Recovery.Round(time.Millisecond), "error", fr.Error)
		res.Faults = append(res.Faults, fr)
	}
	if faultsErr != nil {
		cancelDeliver()
	}
	<-delivered
	res.Deliveries, res.Acked, res.Unavailable, res.Failed = counts.deliveries, counts.acked, counts.unavailable, counts.failed
	if faultsErr != nil {
		return faultsErr
	}
	if deliverErr != nil {
		return fmt.Errorf("deliver: %w", deliverErr)
	}
	if counts.givenUp > 0 {
		return fmt.Errorf("the simulated gateways gave up %d deliveries after their whole retry ladder", counts.givenUp)
	}
	log.Info("delivered; verifying", "since_last_ack", time.Since(lastAck).Round(time.Millisecond))
	v, err := w.verify(ctx, p, cfg.RecoveryTimeout, sc.StallLimit)
	if err != nil {
		return fmt.Errorf("verify: %w", err)
	}
	res.Drain = v.drain
	res.Lost, res.DuplicateEffects, res.StateEvents, res.Invariants = v.lost, v.duplicateEffects, v.stateEvents, v.invariants
	if !v.ok {
		var failed []string
		for _, inv := range v.invariants {
			if !inv.OK {
				failed = append(failed, inv.ID)
			}
		}
		return fmt.Errorf("verification failed: %s", strings.Join(failed, ", "))
	}
	return nil
}

// awaitRecovery waits until every component runs, ingest is ready and the
// pipeline caught up with what the raw topic held when the fault was
// repaired (see caughtUp), and returns how long that took.
func (p *pipeline) awaitRecovery(ctx context.Context, timeout time.Duration) (time.Duration, error) {
	repaired := time.Now()
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	if err := p.waitIngestReady(ctx); err != nil {
		return time.Since(repaired), fmt.Errorf("ingest not ready: %w", err)
	}
	var ends map[int32]int64
	if err := poll(ctx, 50*time.Millisecond, func(ctx context.Context) (err error) {
		if err := p.everyComponentUp(); err != nil {
			return err
		}
		ends, err = p.rawEnds(ctx)
		return err
	}); err != nil {
		return time.Since(repaired), err
	}
	if err := p.caughtUp(ctx, ends); err != nil {
		return time.Since(repaired), fmt.Errorf("not caught up within %s: %w", timeout, err)
	}
	return time.Since(repaired), nil
}

// RunAll runs the scenarios one after the other, calling each result's
// callback as it finishes. The private stack is started before the first
// scenario that needs it and stopped at the end.
func RunAll(ctx context.Context, cfg Config, scenarios []Scenario, done func(Result)) ([]Result, error) {
	var (
		results   []Result
		startOnce sync.Once
		stackErr  error
		started   bool
	)
	for _, sc := range scenarios {
		if ctx.Err() != nil {
			return results, ctx.Err()
		}
		if sc.Private && cfg.Private != nil {
			startOnce.Do(func() {
				cfg.Logger.Info("starting the private stack", "dir", cfg.Private.Dir,
					"postgres", cfg.Private.PGPort, "kafka", cfg.Private.KafkaPort)
				stackErr = cfg.Private.Up(ctx)
				started = stackErr == nil
			})
			if stackErr != nil {
				r := Result{Scenario: sc.Name, Lost: -1, DuplicateEffects: -1, StateEvents: -1,
					Error: fmt.Sprintf("private stack: %v", stackErr)}
				results = append(results, r)
				done(r)
				continue
			}
		}
		r := Run(ctx, cfg, sc)
		results = append(results, r)
		done(r)
	}
	if started {
		stopCtx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
		defer cancel()
		if err := cfg.Private.Down(stopCtx); err != nil {
			return results, fmt.Errorf("stop the private stack: %w", err)
		}
	}
	return results, nil
}
