package loadgen

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"time"
)

// GeneratorConfig configures a Generator.
type GeneratorConfig struct {
	// Builders sign for the sources to send to; payment i belongs to
	// Builders[i % len(Builders)]. Required.
	Builders []*Builder
	// Payments is how many distinct payments the events are about; each
	// payment's events go created, paid, then refunds (or repeated facts).
	// Defaults to 1000.
	Payments int
	// Duplicates is the fraction of requests, in [0, 1), that re-send an
	// event already sent (same ids and body, a fresh signature), as
	// gateways' retries do. Defaults to 0.
	Duplicates float64
	// Seed seeds the choice of duplicates. Defaults to a random seed.
	Seed uint64
}

// recentEvents is how many of the last events duplicates are drawn from.
const recentEvents = 4096

// Generator decides which event to send next. It is safe for concurrent
// use.
type Generator struct {
	cfg GeneratorConfig

	mu     sync.Mutex
	rng    *rand.Rand
	seq    uint64
	steps  []int   // next step of each payment
	recent []Event // ring of the last recentEvents new events
}

// NewGenerator validates cfg and returns a Generator.
func NewGenerator(cfg GeneratorConfig) (*Generator, error) {
	if len(cfg.Builders) == 0 {
		return nil, errors.New("generator config: Builders is required")
	}
	if cfg.Payments == 0 {
		cfg.Payments = 1000
	}
	if cfg.Payments < 0 {
		return nil, errors.New("generator config: Payments must be positive")
	}
	if cfg.Duplicates < 0 || cfg.Duplicates >= 1 {
		return nil, fmt.Errorf("generator config: Duplicates %v: want a fraction in [0, 1)", cfg.Duplicates)
	}
	seed := cfg.Seed
	if seed == 0 {
		seed = rand.Uint64()
	}
	return &Generator{
		cfg:    cfg,
		rng:    rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15)),
		steps:  make([]int, cfg.Payments),
		recent: make([]Event, 0, recentEvents),
	}, nil
}

// Next returns the next request, signed at now, and whether it re-sends an
// event already sent. Payments advance in turn, so the events of one
// payment are spread over the run in order.
func (g *Generator) Next(now time.Time) (req *Request, duplicate bool, err error) {
	ev, duplicate := g.next(now)
	req, err = g.cfg.Builders[ev.Payment%len(g.cfg.Builders)].Build(ev, now)
	return req, duplicate, err
}

func (g *Generator) next(now time.Time) (Event, bool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.cfg.Duplicates > 0 && len(g.recent) > 0 && g.rng.Float64() < g.cfg.Duplicates {
		return g.recent[g.rng.IntN(len(g.recent))], true
	}
	p := int(g.seq % uint64(len(g.steps)))
	ev := Event{Seq: g.seq, Payment: p, Step: g.steps[p], OccurredAt: now.Truncate(time.Millisecond)}
	g.seq++
	g.steps[p]++
	if len(g.recent) < recentEvents {
		g.recent = append(g.recent, ev)
	} else {
		g.recent[ev.Seq%recentEvents] = ev
	}
	return ev, false
}
