package simulate

import (
	"cmp"
	"context"
	"crypto/rand"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"math"
	mrand "math/rand/v2"
	"net"
	"net/http"
	"net/url"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
	"golang.org/x/time/rate"

	"github.com/paystream/paystream/internal/lab/loadgen"
	"github.com/paystream/paystream/internal/provider"
	"github.com/paystream/paystream/internal/provider/drivers"
	"github.com/paystream/paystream/internal/source"
)

// Config configures a Simulation.
type Config struct {
	// SourcesFile is the sources file the target's ingest runs with: the
	// simulator signs with its secrets. Required.
	SourcesFile string
	// IngestURL is ingest's base URL, e.g. http://127.0.0.1:8080. Required
	// to Deliver.
	IngestURL string
	// Payments is the number of payments, spread over the sources in turn.
	// Defaults to 100.
	Payments int
	// MinDeliveries, when positive, raises Payments until the plan holds
	// at least this many sends (histories differ in length, so a payment
	// count alone does not say how many webhooks a run sends).
	MinDeliveries int
	// Duplicates is the fraction of deliveries, in [0, 1), that re-send a
	// webhook already sent (same ids and body, a fresh signature).
	Duplicates float64
	// Reorder is the fraction of webhooks, in [0, 1], sent later than
	// their place in the payment's history, usually after a later step.
	Reorder float64
	// Rate is the target in requests per second; 0 sends as fast as
	// Concurrency allows.
	Rate float64
	// Burst is how many requests may go at once above Rate; defaults to
	// 1% of Rate (at least 1). Ignored without Rate.
	Burst int
	// Concurrency is the number of senders, each with one request in
	// flight. Defaults to 16.
	Concurrency int
	// MaxDelay delays each delivery's first attempt by a random time up to
	// MaxDelay, as gateways' queues do. Defaults to 0.
	MaxDelay time.Duration
	// RetryLadder is how long a delivery answered anything but a 2xx (or
	// not answered) waits before each retry; after the last wait's retry
	// fails it is given up. Defaults to DefaultRetryLadder.
	RetryLadder []time.Duration
	// RequestTimeout bounds one request. Defaults to 10s.
	RequestTimeout time.Duration
	// Seed makes the run reproducible: the same Seed and Config give the
	// same histories and plan. 0 picks one at random.
	Seed int64
	// Drivers restricts the run to the sources of these drivers; empty
	// means every source of the sources file the simulator can drive.
	Drivers []string
	// GatewayListen is the address (loopback) of the fake gateway API the
	// refetching sources' api_base_url must point at. GatewayListener,
	// when set, is used instead (tests listen on port 0 first).
	GatewayListen   string
	GatewayListener net.Listener
	// Poison plants this many unprocessable records (one each for its own
	// payment) on the raw topic halfway through the delivery, for I10.
	// Needs KafkaBrokers and RawTopic.
	Poison int
	// KafkaBrokers and RawTopic, when set, let Deliver record where the raw
	// topic's partitions started (I4) and plant the poison.
	KafkaBrokers []string
	RawTopic     string
	// KafkaOpts are extra franz-go options given to every Kafka client,
	// e.g. TLS and SASL from internal/kafkaconn. Defaults to none.
	KafkaOpts []kgo.Opt
	// Sampler, when set, is started by Deliver (unless already running)
	// and stopped by Verify once the backlog drained.
	Sampler *Sampler
	// ProgressInterval is how often Deliver calls progress. Defaults to 1s.
	ProgressInterval time.Duration
	// Client sends the webhooks. Defaults to a keep-alive client sized for
	// Concurrency with RequestTimeout.
	Client *http.Client
}

// DefaultRetryLadder is the retry ladder unless Config says otherwise:
// about a minute in all, a compressed version of gateways' days.
var DefaultRetryLadder = []time.Duration{
	100 * time.Millisecond, 250 * time.Millisecond, 500 * time.Millisecond, time.Second,
	2 * time.Second, 4 * time.Second, 8 * time.Second, 15 * time.Second, 30 * time.Second,
}

// Simulation is one simulated run: its histories, plan and oracle.
type Simulation struct {
	cfg     Config
	log     *slog.Logger
	oracle  *Oracle
	signers map[string]*signer // by source name
	plan    []int              // event indexes, in send order
	loaded  bool               // from Load: can Verify, not Deliver

	api       *gatewayAPI // nil when no chosen source refetches
	gwMu      sync.Mutex
	exposed   []int             // per payment, the last step the gateway shows; -1 none
	refetch   map[string]bool   // by source name
	scope     map[string]string // by source name: a zoop source's marketplace
	delivered atomic.Bool
}

// Oracle returns the simulation's oracle.
func (s *Simulation) Oracle() *Oracle { return s.oracle }

// New validates cfg, reads the sources, generates every payment's history
// and the delivery plan, and checks each webhook against its own driver
// (a webhook the driver cannot parse is the simulator's bug, and an error
// here). It starts the fake gateway API when a source refetches.
func New(cfg Config, log *slog.Logger) (*Simulation, error) {
	if err := cfg.check(); err != nil {
		return nil, err
	}
	cfg.setDefaults()
	if log == nil {
		log = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	srcs, built, err := readSources(cfg.SourcesFile)
	if err != nil {
		return nil, err
	}
	chosen, err := chooseSources(cfg.Drivers, srcs, built, log)
	if err != nil {
		return nil, err
	}
	s := &Simulation{cfg: cfg, log: log, signers: map[string]*signer{}, refetch: map[string]bool{}}
	for _, src := range chosen {
		sg, err := newSigner(src)
		if err != nil {
			return nil, err
		}
		s.signers[src.Name] = sg
		s.refetch[src.Name] = built[src.Name].Refetch != nil
	}
	for {
		if s.oracle, err = generate(cfg, chosen, built, s.signers); err != nil {
			return nil, err
		}
		s.plan = makePlan(cfg, s.oracle)
		if len(s.plan) >= cfg.MinDeliveries {
			break
		}
		cfg.Payments = cfg.Payments*cfg.MinDeliveries/max(len(s.plan), 1) + 1
	}
	s.cfg = cfg
	if err := s.startGateway(built, false); err != nil {
		return nil, err
	}
	return s, nil
}

// Load reads an oracle saved by Oracle.Save into a Simulation that can
// Verify (not Deliver), for a verification in another process. When
// cfg.SourcesFile has refetching sources and cfg.GatewayListen (or
// GatewayListener) is set, it serves the fake gateway API again, showing
// every payment's final state, so refetches still waiting can finish.
func Load(path string, cfg Config, log *slog.Logger) (*Simulation, error) {
	o, err := LoadOracle(path)
	if err != nil {
		return nil, err
	}
	if log == nil {
		log = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	cfg.setDefaults()
	s := &Simulation{cfg: cfg, log: log, oracle: o, loaded: true, refetch: map[string]bool{}}
	if cfg.SourcesFile != "" && (cfg.GatewayListen != "" || cfg.GatewayListener != nil) {
		_, built, err := readSources(cfg.SourcesFile)
		if err != nil {
			return nil, err
		}
		for _, p := range o.Payments {
			src, ok := built[p.Source]
			if !ok {
				return nil, fmt.Errorf("load: source %s of the oracle is not in %s", p.Source, cfg.SourcesFile)
			}
			s.refetch[p.Source] = src.Refetch != nil
		}
		if err := s.startGateway(built, true); err != nil {
			return nil, err
		}
	}
	return s, nil
}

// Close stops the fake gateway API, if any, and the Sampler if it still
// runs.
func (s *Simulation) Close() {
	if s.api != nil {
		s.api.close()
	}
	s.FinishSampling()
}

// Save writes the simulation's oracle to path (Oracle.Save), for Load.
func (s *Simulation) Save(path string) error { return s.oracle.Save(path) }

// Seed is the seed the simulation was generated from: with the same
// Config it gives the same histories and plan.
func (s *Simulation) Seed() int64 { return s.oracle.Seed }

// FinishSampling stops the Sampler, if any, and records what it saw in the
// oracle (Verify does it once the backlog drained; call it before saving
// an oracle to verify in another process).
func (s *Simulation) FinishSampling() {
	if s.cfg.Sampler == nil {
		return
	}
	sum := s.cfg.Sampler.Stop()
	s.oracle.mu.Lock()
	s.oracle.Samples = &sum
	s.oracle.mu.Unlock()
}

// GatewayURL is the fake gateway API's base URL, "" when none runs.
func (s *Simulation) GatewayURL() string {
	if s.api == nil {
		return ""
	}
	return s.api.url
}

func (cfg *Config) check() error {
	switch {
	case cfg.SourcesFile == "":
		return errors.New("simulate config: SourcesFile is required")
	case cfg.Payments < 0:
		return errors.New("simulate config: Payments must be positive")
	case cfg.MinDeliveries < 0:
		return errors.New("simulate config: MinDeliveries must not be negative")
	case cfg.Duplicates < 0 || cfg.Duplicates >= 1 || math.IsNaN(cfg.Duplicates):
		return fmt.Errorf("simulate config: Duplicates %v: want a fraction in [0, 1)", cfg.Duplicates)
	case cfg.Reorder < 0 || cfg.Reorder > 1 || math.IsNaN(cfg.Reorder):
		return fmt.Errorf("simulate config: Reorder %v: want a fraction in [0, 1]", cfg.Reorder)
	case cfg.Rate < 0 || math.IsInf(cfg.Rate, 0) || math.IsNaN(cfg.Rate):
		return fmt.Errorf("simulate config: Rate %v: want requests per second, or 0 for no limit", cfg.Rate)
	case cfg.Concurrency < 0 || cfg.Burst < 0 || cfg.MaxDelay < 0 || cfg.Poison < 0:
		return errors.New("simulate config: Concurrency, Burst, MaxDelay and Poison must not be negative")
	case cfg.Poison > 0 && (len(cfg.KafkaBrokers) == 0 || cfg.RawTopic == ""):
		return errors.New("simulate config: Poison needs KafkaBrokers and RawTopic")
	}
	for _, d := range cfg.RetryLadder {
		if d < 0 {
			return errors.New("simulate config: RetryLadder waits must not be negative")
		}
	}
	return nil
}

func (cfg *Config) setDefaults() {
	cfg.Payments = cmp.Or(cfg.Payments, 100)
	cfg.Concurrency = cmp.Or(cfg.Concurrency, 16)
	cfg.RequestTimeout = cmp.Or(cfg.RequestTimeout, 10*time.Second)
	cfg.ProgressInterval = cmp.Or(cfg.ProgressInterval, time.Second)
	if cfg.RetryLadder == nil {
		cfg.RetryLadder = DefaultRetryLadder
	}
	if cfg.Burst == 0 {
		cfg.Burst = max(1, int(math.Ceil(cfg.Rate/100)))
	}
	if cfg.Seed == 0 {
		var b [8]byte
		_, _ = rand.Read(b[:])
		cfg.Seed = int64(binary.LittleEndian.Uint64(b[:]) >> 1)
	}
	if cfg.Client == nil {
		cfg.Client = loadgen.NewClient(cfg.Concurrency, cfg.RequestTimeout)
	}
}

// readSources reads the sources file twice over: as loadgen reads it (to
// sign: secrets and driver options) and as ingest builds it (accounts,
// refetch settings, drivers to compute dedup keys with).
func readSources(path string) ([]loadgen.Source, map[string]*source.Source, error) {
	raw, err := os.ReadFile(path)
	if err != nil {
		return nil, nil, fmt.Errorf("read sources file: %w", err)
	}
	srcs, err := loadgen.ParseSources(raw)
	if err != nil {
		return nil, nil, err
	}
	built, err := source.Parse(raw, drivers.Factories())
	if err != nil {
		return nil, nil, err
	}
	return srcs, built, nil
}

// chooseSources keeps the sources the simulator can drive, of the drivers
// asked for. A source it cannot drive is an error when its driver was asked
// for by name, and skipped with a warning otherwise.
func chooseSources(want []string, srcs []loadgen.Source, built map[string]*source.Source, log *slog.Logger) ([]loadgen.Source, error) {
	var out []loadgen.Source
	for _, src := range srcs {
		named := slices.Contains(want, src.Driver)
		if len(want) > 0 && !named {
			continue
		}
		why := ""
		if _, ok := profiles[src.Driver]; !ok {
			why = "the simulator has no profile for its driver"
		} else if profiles[src.Driver].refetchOnly && built[src.Name].Refetch == nil {
			why = "it cannot refetch (no api_token), so its events would wait forever"
		}
		if why != "" {
			if named {
				return nil, fmt.Errorf("source %s (driver %s): %s", src.Name, src.Driver, why)
			}
			log.Warn("simulate: skipping source", "source", src.Name, "driver", src.Driver, "reason", why)
			continue
		}
		out = append(out, src)
	}
	for _, d := range want {
		if !slices.ContainsFunc(out, func(s loadgen.Source) bool { return s.Driver == d }) {
			return nil, fmt.Errorf("no source with driver %q in the sources file", d)
		}
	}
	if len(out) == 0 {
		return nil, errors.New("no source the simulator can drive in the sources file")
	}
	return out, nil
}

// generate draws every payment's history and computes each webhook's dedup
// key with the source's own driver.
func generate(cfg Config, srcs []loadgen.Source, built map[string]*source.Source, signers map[string]*signer) (*Oracle, error) {
	rng := mrand.New(mrand.NewPCG(uint64(cfg.Seed), uint64(cfg.Seed)^0x9e3779b97f4a7c15))
	var run [4]byte
	for i := range run {
		run[i] = byte(rng.Uint32())
	}
	x := RunIDs{Run: hex.EncodeToString(run[:]), RunNum: binary.BigEndian.Uint32(run[:])}
	o := &Oracle{Version: oracleVersion, IDs: x, Seed: cfg.Seed, CreatedAt: time.Now().UTC()}
	start := time.Now().Add(-6 * time.Hour).UTC().Truncate(time.Millisecond)
	now := time.Now()
	for p := range cfg.Payments {
		src := srcs[p%len(srcs)]
		prof := profiles[src.Driver]
		bs := built[src.Name]
		shape := prof.shapes[rng.IntN(len(prof.shapes))]
		amount := drawAmount(rng)
		h := History{
			Source: src.Name, Driver: src.Driver, PaymentID: prof.paymentID(x, p), Shape: shape, AmountMinor: amount,
			Steps: generateSteps(rng, shape, amount, start.Add(time.Duration(p)*time.Second),
				func(n int) string { return prof.refundID(x, p, n) }, prof.echoes),
		}
		h.PaymentKey = provider.PaymentKey(src.Name, bs.Account, h.PaymentID)
		if err := h.validate(); err != nil {
			return nil, err
		}
		o.Payments = append(o.Payments, &OraclePayment{History: h, Expected: Expect(h.Steps)})
		for i := range h.Steps {
			id := prof.eventID(x, p, i)
			req, err := signers[src.Name].build(&h, i, id, now)
			if err != nil {
				return nil, fmt.Errorf("build %s webhook of payment %s: %w", h.Steps[i].Kind, h.PaymentKey, err)
			}
			query, err := url.ParseQuery(req.RawQuery)
			if err != nil {
				return nil, fmt.Errorf("build %s webhook of payment %s: %w", h.Steps[i].Kind, h.PaymentKey, err)
			}
			ev, err := bs.Driver.Parse(&provider.Request{Header: req.Header, Query: query, Body: req.Body, Now: now})
			if err != nil {
				return nil, fmt.Errorf("the %s driver refuses the simulator's %s webhook: %w", src.Driver, h.Steps[i].Kind, err)
			}
			if ev.PaymentID != h.PaymentID {
				return nil, fmt.Errorf("the %s driver reads payment %q from the simulator's %s webhook of %q", src.Driver, ev.PaymentID, h.Steps[i].Kind, h.PaymentID)
			}
			o.Events = append(o.Events, &OracleEvent{Payment: p, Step: i, EventID: id, DedupKey: ev.DedupKey, Sends: 1})
		}
	}
	return o, nil
}

// makePlan orders the deliveries: payments advance in turn (every
// payment's first step, then every second step…), a Reorder fraction of
// them pushed later (usually past a later step of their payment), then
// Duplicates re-sends inserted after the delivery they repeat.
func makePlan(cfg Config, o *Oracle) []int {
	rng := mrand.New(mrand.NewPCG(uint64(cfg.Seed)^0x5eed, uint64(cfg.Seed)))
	plan := make([]int, len(o.Events))
	for i := range plan {
		plan[i] = i
	}
	slices.SortStableFunc(plan, func(a, b int) int {
		return cmp.Or(cmp.Compare(o.Events[a].Step, o.Events[b].Step), cmp.Compare(o.Events[a].Payment, o.Events[b].Payment))
	})
	window := max(2, 2*len(o.Payments))
	for k := range plan {
		if cfg.Reorder > 0 && rng.Float64() < cfg.Reorder {
			j := min(len(plan)-1, k+1+rng.IntN(window))
			plan[k], plan[j] = plan[j], plan[k]
		}
	}
	dups := loadgen.RepeatsFor(len(plan), cfg.Duplicates)
	for range dups {
		j := rng.IntN(len(plan))
		e := plan[j]
		at := j + 1 + rng.IntN(len(plan)-j)
		plan = slices.Insert(plan, at, e)
		o.Events[e].Sends++
	}
	return plan
}

// startGateway serves the fake gateway API when a chosen source refetches
// (see gatewayAPI). final shows every payment's last step at once (Load);
// otherwise each payment's state follows the webhooks sent.
func (s *Simulation) startGateway(built map[string]*source.Source, final bool) error {
	n, err := needs(built, s.refetch)
	if err != nil {
		return err
	}
	if !n.refetches {
		return nil
	}
	s.scope = n.scopes
	ln := s.cfg.GatewayListener
	if ln == nil {
		if s.cfg.GatewayListen == "" {
			return errors.New("a source refetches from the gateway API: set the fake gateway's address (GatewayListen, --gateway-listen) and point its api_base_url there")
		}
		var err error
		if ln, err = net.Listen("tcp", s.cfg.GatewayListen); err != nil {
			return fmt.Errorf("fake gateway API: %w", err)
		}
	}
	for name, refetch := range s.refetch {
		if !refetch {
			continue
		}
		u, err := url.Parse(built[name].Refetch.BaseURL)
		if err != nil || u.Host != ln.Addr().String() {
			ln.Close()
			return fmt.Errorf("source %s: api_base_url %q does not point at the fake gateway API on %s", name, built[name].Refetch.BaseURL, ln.Addr())
		}
	}
	api, err := serveGateway(ln, n)
	if err != nil {
		return fmt.Errorf("fake gateway API: %w", err)
	}
	s.api = api
	s.exposed = make([]int, len(s.oracle.Payments))
	for p := range s.exposed {
		s.exposed[p] = -1
	}
	if final {
		for p, op := range s.oracle.Payments {
			if err := s.expose(p, len(op.Steps)-1); err != nil {
				return err
			}
		}
	}
	s.log.Info("simulate: fake gateway API serving", "url", api.url, "zoop_marketplaces", api.marketplaces())
	return nil
}

// expose makes the gateway API show payment p as of its step, unless it
// already shows a later one.
func (s *Simulation) expose(p, step int) error {
	op := s.oracle.Payments[p]
	if s.api == nil || !s.refetch[op.Source] {
		return nil
	}
	s.gwMu.Lock()
	defer s.gwMu.Unlock()
	if step <= s.exposed[p] {
		return nil
	}
	scope := s.scope[op.Source]
	body, err := profiles[op.Driver].gateway(&op.History, step, scope)
	if err != nil {
		return err
	}
	if err := s.api.set(op.Driver, scope, op.PaymentID, body); err != nil {
		return err
	}
	s.exposed[p] = step
	return nil
}

// Progress is a delivery's progress so far.
type Progress struct {
	Elapsed time.Duration
	// Sent counts finished attempts (retries included); Acked the planned
	// sends acknowledged; Total the planned sends.
	Sent, Acked, Total int
	// Status counts answers by HTTP status code; NetErrors requests that
	// got none.
	Status    map[int]int
	NetErrors int
	// Retries counts attempts after a first one; GivenUp sends abandoned
	// after the whole retry ladder.
	Retries, GivenUp int
	Final            bool
}

// DeliveryStats is what Deliver did.
type DeliveryStats struct {
	Elapsed time.Duration `json:"elapsed_ns"`
	// Events is the distinct webhooks; Planned the sends (with
	// duplicates); Duplicates the planned re-sends.
	Events     int `json:"events"`
	Planned    int `json:"planned"`
	Duplicates int `json:"duplicates"`
	// Attempts counts HTTP requests, retries included.
	Attempts int `json:"attempts"`
	Retries  int `json:"retries"`
	// OK counts 2xx answers; Status5xx every 5xx answer, of which
	// Status503 the 503s; OtherStatus the other non-2xx answers; NetErrors
	// the requests that got no answer.
	OK          int         `json:"ok"`
	Status5xx   int         `json:"status_5xx"`
	Status503   int         `json:"status_503"`
	OtherStatus int         `json:"other_status"`
	NetErrors   int         `json:"net_errors"`
	Status      map[int]int `json:"status"`
	// GivenUp counts sends abandoned after the whole retry ladder.
	GivenUp int `json:"given_up"`
	// Poison is the number of poison records planted.
	Poison int `json:"poison"`
	// P50, P99 and Max are the answers' latencies.
	P50 time.Duration `json:"p50_ns"`
	P99 time.Duration `json:"p99_ns"`
	Max time.Duration `json:"max_ns"`
}

// delivery is the shared state of one Deliver.
type delivery struct {
	mu        sync.Mutex
	status    map[int]int
	netErrors int
	sent      int
	acked     int
	retries   int
	givenUp   int
	lat       loadgen.Histogram
}

// Deliver sends every planned webhook to IngestURL, like a gateway: each
// send is retried along the retry ladder until acknowledged with a 2xx or
// given up. Every 2xx is recorded in the oracle. progress, when not nil,
// is called every ProgressInterval and once at the end. It returns an error
// only for a configuration problem, a request it cannot build, a poison it
// cannot plant or ctx ending; failed sends are counted in DeliveryStats.
func (s *Simulation) Deliver(ctx context.Context, progress func(Progress)) (DeliveryStats, error) {
	if s.loaded {
		return DeliveryStats{}, errors.New("deliver: a loaded simulation can only verify")
	}
	if s.cfg.IngestURL == "" {
		return DeliveryStats{}, errors.New("deliver: IngestURL is required")
	}
	if !s.delivered.CompareAndSwap(false, true) {
		return DeliveryStats{}, errors.New("deliver: already delivered")
	}
	if len(s.cfg.KafkaBrokers) > 0 && s.cfg.RawTopic != "" {
		ends, err := endOffsets(ctx, kafkaClientOpts(s.cfg.KafkaBrokers, s.cfg.KafkaOpts), s.cfg.RawTopic)
		if err != nil {
			return DeliveryStats{}, fmt.Errorf("deliver: %w", err)
		}
		s.oracle.mu.Lock()
		s.oracle.StartOffsets = ends
		s.oracle.mu.Unlock()
	}
	if s.cfg.Sampler != nil {
		s.cfg.Sampler.Start()
	}
	var lim *rate.Limiter
	if s.cfg.Rate > 0 {
		lim = rate.NewLimiter(rate.Limit(s.cfg.Rate), s.cfg.Burst)
	}
	d := &delivery{status: map[int]int{}}
	start := time.Now()
	snapshot := func(final bool) Progress {
		d.mu.Lock()
		defer d.mu.Unlock()
		return Progress{Elapsed: time.Since(start), Sent: d.sent, Acked: d.acked, Total: len(s.plan),
			Status: maps.Clone(d.status), NetErrors: d.netErrors, Retries: d.retries, GivenUp: d.givenUp, Final: final}
	}
	progressDone := make(chan struct{})
	var progressWG sync.WaitGroup
	if progress != nil {
		progressWG.Go(func() {
			t := time.NewTicker(s.cfg.ProgressInterval)
			defer t.Stop()
			for {
				select {
				case <-progressDone:
					return
				case <-t.C:
					progress(snapshot(false))
				}
			}
		})
	}

	sendCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	var (
		next     atomic.Int64
		wg       sync.WaitGroup
		errOnce  sync.Once
		firstErr error
	)
	fail := func(err error) {
		errOnce.Do(func() { firstErr = err; cancel() })
	}
	poisonAt := int64(len(s.plan) / 2)
	for w := range s.cfg.Concurrency {
		rng := mrand.New(mrand.NewPCG(uint64(s.cfg.Seed), uint64(w)))
		wg.Go(func() {
			for sendCtx.Err() == nil {
				k := next.Add(1) - 1
				if k >= int64(len(s.plan)) {
					return
				}
				if k == poisonAt && s.cfg.Poison > 0 {
					if err := s.plantPoison(sendCtx); err != nil {
						fail(err)
						return
					}
				}
				if lim != nil && lim.Wait(sendCtx) != nil {
					return
				}
				if s.cfg.MaxDelay > 0 && !sleep(sendCtx, time.Duration(rng.Int64N(int64(s.cfg.MaxDelay)))) {
					return
				}
				if err := s.send(sendCtx, d, s.oracle.Events[s.plan[k]]); err != nil {
					fail(err)
					return
				}
			}
		})
	}
	wg.Wait()
	close(progressDone)
	progressWG.Wait()
	if firstErr == nil && ctx.Err() != nil {
		firstErr = ctx.Err()
	}
	stats := s.stats(d, time.Since(start))
	s.oracle.mu.Lock()
	s.oracle.Stats = stats
	s.oracle.mu.Unlock()
	if progress != nil {
		progress(snapshot(true))
	}
	if firstErr != nil {
		return stats, fmt.Errorf("deliver: %w", firstErr)
	}
	return stats, nil
}

// sleep waits d or until ctx ends; it reports whether d passed.
func sleep(ctx context.Context, d time.Duration) bool {
	if d <= 0 {
		return ctx.Err() == nil
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}

// send delivers one planned send of e, retrying along the ladder.
func (s *Simulation) send(ctx context.Context, d *delivery, e *OracleEvent) error {
	op := s.oracle.Payments[e.Payment]
	if err := s.expose(e.Payment, e.Step); err != nil {
		return err
	}
	sg := s.signers[op.Source]
	for attempt := 0; ; attempt++ {
		req, err := sg.build(&op.History, e.Step, e.EventID, time.Now())
		if err != nil {
			return fmt.Errorf("build webhook: %w", err)
		}
		hreq, err := req.HTTPRequest(ctx, s.cfg.IngestURL)
		if err != nil {
			return fmt.Errorf("build webhook: %w", err)
		}
		began := time.Now()
		resp, err := s.cfg.Client.Do(hreq)
		code := 0
		if err == nil {
			_, _ = io.Copy(io.Discard, resp.Body) // the status is the answer; a body cut short after it changes nothing
			resp.Body.Close()
			code = resp.StatusCode
		}
		if ctx.Err() != nil {
			return nil // abandoned: not the target's failure
		}
		ok := code >= 200 && code < 300
		d.mu.Lock()
		d.sent++
		if attempt > 0 {
			d.retries++
		}
		if code != 0 {
			d.status[code]++
			d.lat.Record(time.Since(began))
		} else {
			d.netErrors++
		}
		if ok {
			d.acked++
		}
		d.mu.Unlock()
		s.oracle.ack(e, ok)
		if ok {
			return nil
		}
		if attempt >= len(s.cfg.RetryLadder) {
			s.oracle.giveUp(e)
			d.mu.Lock()
			d.givenUp++
			d.mu.Unlock()
			s.log.Warn("simulate: delivery given up", "source", op.Source, "event_id", e.EventID, "attempts", attempt+1, "last_status", code)
			return nil
		}
		if !sleep(ctx, s.cfg.RetryLadder[attempt]) {
			return nil
		}
	}
}

func (s *Simulation) stats(d *delivery, elapsed time.Duration) DeliveryStats {
	d.mu.Lock()
	defer d.mu.Unlock()
	st := DeliveryStats{Elapsed: elapsed, Events: len(s.oracle.Events), Planned: len(s.plan),
		Duplicates: len(s.plan) - len(s.oracle.Events), Attempts: d.sent, Retries: d.retries,
		NetErrors: d.netErrors, Status: maps.Clone(d.status), GivenUp: d.givenUp, Poison: len(s.oracle.Poison),
		P50: d.lat.Quantile(0.5), P99: d.lat.Quantile(0.99), Max: d.lat.Max()}
	for code, n := range d.status {
		switch {
		case code >= 200 && code < 300:
			st.OK += n
		case code >= 500:
			st.Status5xx += n
			if code == http.StatusServiceUnavailable {
				st.Status503 += n
			}
		default:
			st.OtherStatus += n
		}
	}
	return st
}

// plantPoison produces cfg.Poison records no processor can decode, each
// keyed by a payment of its own, straight to the raw topic (ingest would
// refuse them: poison reaches the raw topic from an older or buggy ingest),
// with the key partitioner ingest uses.
func (s *Simulation) plantPoison(ctx context.Context) error {
	cl, err := kgo.NewClient(append(kafkaClientOpts(s.cfg.KafkaBrokers, s.cfg.KafkaOpts),
		kgo.RecordPartitioner(kgo.StickyKeyPartitioner(nil)), kgo.RequiredAcks(kgo.AllISRAcks()))...)
	if err != nil {
		return fmt.Errorf("plant poison: %w", err)
	}
	defer cl.Close()
	recs := make([]*kgo.Record, s.cfg.Poison)
	for i := range recs {
		key := fmt.Sprintf("simulate:poison_%s_%d", s.oracle.IDs.Run, i)
		recs[i] = &kgo.Record{Topic: s.cfg.RawTopic, Key: []byte(key), Value: []byte("\x00 simulate poison: not an envelope {")}
	}
	res := cl.ProduceSync(ctx, recs...)
	if err := res.FirstErr(); err != nil {
		return fmt.Errorf("plant poison: %w", err)
	}
	s.oracle.mu.Lock()
	defer s.oracle.mu.Unlock()
	for _, r := range res {
		s.oracle.Poison = append(s.oracle.Poison, PoisonRecord{Key: string(r.Record.Key), Partition: r.Record.Partition, Offset: r.Record.Offset})
	}
	s.log.Info("simulate: poison planted", "records", len(recs))
	return nil
}
