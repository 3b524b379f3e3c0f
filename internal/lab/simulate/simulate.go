package simulate

import (
	"cmp"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	mrand "math/rand/v2"
	"net"
	"net/url"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/paystream/paystream/internal/lab/loadgen"
	"github.com/paystream/paystream/internal/provider"
	"github.com/paystream/paystream/internal/provider/drivers"
	"github.com/paystream/paystream/internal/source"
)

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
