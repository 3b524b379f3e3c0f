package chaos

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"slices"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/paystream/paystream/internal/lab/simulate"
)

// Simulation settings every scenario uses: duplicates and reordering as
// gateways produce them, a few poison records for I10, and a retry ladder
// longer than simulate's default minute (gateways retry for days), so no
// fault here makes the simulated gateway give up.
const (
	duplicates = 0.10
	reorder    = 0.10
	poison     = 2
)

var retryLadder = append(slices.Clone(simulate.DefaultRetryLadder),
	30*time.Second, 30*time.Second, 30*time.Second, 30*time.Second, 30*time.Second, 30*time.Second)

// gateway is the fake gateway API's listener and the sources file
// (simulate.LabSources: one source per driver) that points the refetching
// sources at it. It is made before the pipeline, whose ingest and
// processor read the file.
type gateway struct {
	ln      net.Listener
	sources string
}

func newGateway(dir string) (*gateway, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("fake gateway API: %w", err)
	}
	path := filepath.Join(dir, "sources.yaml")
	if err := os.WriteFile(path, simulate.LabSources(ln.Addr().String()), 0o600); err != nil {
		ln.Close()
		return nil, err
	}
	return &gateway{ln: ln, sources: path}, nil
}

// workloadConfig is what newWorkload needs from the run.
type workloadConfig struct {
	gw         *gateway
	ingestURL  string
	deliveries int
	rate       float64
	seed       int64
	brokers    []string
	raw, group string
	pool       *pgxpool.Pool // the target schema's, for the sampler
	log        *slog.Logger
}

// simulation adapts package simulate to the harness.
type simulation struct {
	sim *simulate.Simulation
}

// newWorkload makes a simulation of at least cfg.deliveries deliveries.
func newWorkload(cfg workloadConfig) (*simulation, error) {
	sampler, err := simulate.NewSampler(simulate.SamplerConfig{Pool: cfg.pool, Group: cfg.group, Topic: cfg.raw, Brokers: cfg.brokers})
	if err != nil {
		return nil, err
	}
	sim, err := simulate.New(simulate.Config{
		SourcesFile: cfg.gw.sources, IngestURL: cfg.ingestURL,
		Duplicates: duplicates, Reorder: reorder, Rate: cfg.rate, Concurrency: 32, Seed: cfg.seed,
		RetryLadder: retryLadder, Poison: poison, KafkaBrokers: cfg.brokers, RawTopic: cfg.raw,
		Sampler: sampler, ProgressInterval: 100 * time.Millisecond, GatewayListener: cfg.gw.ln,
		Payments: max(1, cfg.deliveries/5), MinDeliveries: cfg.deliveries,
	}, cfg.log)
	if err != nil {
		return nil, err
	}
	return &simulation{sim: sim}, nil
}

func (s *simulation) deliver(ctx context.Context, progress func(acked, total int)) (deliveryCounts, error) {
	st, err := s.sim.Deliver(ctx, func(p simulate.Progress) { progress(p.Acked, p.Total) })
	return deliveryCounts{deliveries: st.Planned, acked: st.OK, unavailable: st.Status503,
		failed: st.Status5xx - st.Status503 + st.OtherStatus + st.NetErrors, givenUp: st.GivenUp}, err
}

func (s *simulation) close() { s.sim.Close() }

// verdict is what the verification found, as the table counts it.
type verdict struct {
	lost, duplicateEffects, stateEvents int
	invariants                          []InvariantLine
	drain                               time.Duration
	ok                                  bool
}

// verify runs the simulation's verification on the pipeline: it waits for
// the backlog to drain (up to drainTimeout), then checks I1–I10. The
// table's columns are violation counts: lost = I1 (an acknowledged
// webhook not exactly once in the deliveries, or a state change not once
// on the topic), duplicate effects = I2, duplicate or missing state events
// = I3 (an event id read twice) + I6 (a payment's versions out of order
// or with a gap).
func (s *simulation) verify(ctx context.Context, p *pipeline, drainTimeout, stallLimit time.Duration) (verdict, error) {
	rep, err := s.sim.Verify(ctx, simulate.Target{
		Pool: p.pool, Schema: p.schema, KafkaBrokers: p.srv.brokers,
		RawTopic: p.raw, StateTopic: p.state, Group: p.group,
		DrainTimeout: drainTimeout, StallLimit: stallLimit,
	})
	if err != nil {
		return verdict{}, err
	}
	v := verdict{drain: rep.DrainTime, ok: rep.OK()}
	for _, inv := range rep.Invariants {
		v.invariants = append(v.invariants, InvariantLine{ID: inv.ID, Name: inv.Name, OK: inv.OK, Detail: inv.Detail})
	}
	v.lost = violations(rep.Result("I1"))
	v.duplicateEffects = violations(rep.Result("I2"))
	v.stateEvents = violations(rep.Result("I3")) + violations(rep.Result("I6"))
	return v, nil
}

// violations is the number of violations an invariant found, -1 when the
// report has no such invariant, at least 1 when it failed.
func violations(r simulate.InvariantResult) int {
	switch {
	case r.ID == "":
		return -1
	case r.OK:
		return 0
	}
	return max(r.Violations, 1)
}
