package chaos

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"syscall"
	"time"
)

// Scenario is one chaos experiment: a pipeline shape and the faults
// injected while the simulation delivers its webhooks.
type Scenario struct {
	// Name selects the scenario (-scenarios, CHAOS=...).
	Name string
	// Does says what happens, for -list and docs/reliability.md.
	Does string
	// Private scenarios stop or kill a server: they run on the private
	// stack, never the shared one.
	Private bool
	// Processors is how many `paystream processor` run at the start
	// (default 1).
	Processors int
	// ProxyPostgres routes the processors' Postgres connections through a
	// toxiproxy proxy.
	ProxyPostgres bool
	// ProxyKafka routes the relay's Kafka connections through a toxiproxy
	// proxy; the relay then runs inside the harness (see startSink).
	ProxyKafka bool
	// Faults run in order, each once delivery progress reached its At
	// and the pipeline recovered from the fault before.
	Faults []Fault
	// StallLimit bounds, for I9, the longest time with a backlog and no
	// progress (0: simulate's default, a minute); an outage longer than
	// that stalls by design.
	StallLimit time.Duration
}

// Fault is one injected failure. Inject breaks something and repairs it
// (restarts the process, removes the toxic, starts the server) and
// returns; recovery is timed from its return.
type Fault struct {
	// At is the fraction of the deliveries acknowledged before it starts.
	At float64
	// Name says what it does, e.g. "SIGKILL processor".
	Name   string
	Inject func(ctx context.Context, p *pipeline) error
}

// Fault windows: long enough for every component to hit the fault
// (batches every few ms, relay transactions every 20 ms, Kafka requests
// timing out after 30 s at most).
const (
	resetWindow     = 5 * time.Second
	blackholeWindow = 15 * time.Second
	latencyWindow   = 20 * time.Second
	latencyMS       = 100
	latencyJitterMS = 50
	outageWindow    = 2 * time.Minute
	brokerDownFor   = 5 * time.Second
)

// Scenarios is the full suite, in the order `make chaos` runs it.
func Scenarios() []Scenario {
	var out []Scenario
	for _, c := range []string{"ingest", "processor", "sink"} {
		for _, sig := range []syscall.Signal{syscall.SIGTERM, syscall.SIGKILL} {
			out = append(out, Scenario{
				Name:   fmt.Sprintf("%s-%s", c, sigName(sig)),
				Does:   fmt.Sprintf("%s to `paystream %s` three times (at 20 %%, 45 %% and 70 %% of the deliveries), restarted at once each time", strings.ToUpper(sigName(sig)), c),
				Faults: bounces(c, sig),
			})
		}
	}
	return append(out,
		Scenario{Name: "broker-kill", Private: true,
			Does: fmt.Sprintf("SIGKILL of the Kafka broker at 20 %%, down %s, then started again", brokerDownFor),
			Faults: []Fault{{At: 0.2, Name: "SIGKILL broker, restart", Inject: func(ctx context.Context, p *pipeline) error {
				if err := p.srv.private.killKafka(ctx); err != nil {
					return err
				}
				if err := sleep(ctx, brokerDownFor); err != nil {
					return err
				}
				return p.srv.private.startKafka(ctx)
			}}}},
		Scenario{Name: "postgres-restart", Private: true,
			Does: "Postgres restarted (fast shutdown: sessions terminated, then started) at 20 %",
			Faults: []Fault{{At: 0.2, Name: "restart Postgres", Inject: func(ctx context.Context, p *pipeline) error {
				return p.srv.private.restartPG(ctx)
			}}}},
		proxyScenario("pg-reset", "processor↔Postgres", true, "every connection reset as soon as it carries data, for "+resetWindow.String(),
			resetWindow, toxicReset),
		proxyScenario("pg-blackhole", "processor↔Postgres", true, "every byte dropped, nothing answered, for "+blackholeWindow.String()+"; then the held connections are closed",
			blackholeWindow, toxicBlackholeUp, toxicBlackholeDown),
		proxyScenario("pg-latency", "processor↔Postgres", true, fmt.Sprintf("%d ± %d ms added each way, for %s", latencyMS, latencyJitterMS, latencyWindow),
			latencyWindow, toxicLatency(latencyMS, latencyJitterMS)...),
		proxyScenario("kafka-reset", "relay↔Kafka", false, "every connection reset as soon as it carries data, for "+resetWindow.String(),
			resetWindow, toxicReset),
		proxyScenario("kafka-blackhole", "relay↔Kafka", false, "every byte dropped, nothing answered, for "+blackholeWindow.String()+"; then the held connections are closed",
			blackholeWindow, toxicBlackholeUp, toxicBlackholeDown),
		proxyScenario("kafka-latency", "relay↔Kafka", false, fmt.Sprintf("%d ± %d ms added each way, for %s", latencyMS, latencyJitterMS, latencyWindow),
			latencyWindow, toxicLatency(latencyMS, latencyJitterMS)...),
		Scenario{Name: "group-churn", Processors: 3,
			Does: "three processors; a fourth joins at 20 %, one gets SIGTERM at 35 %, one SIGKILL at 50 %, one more joins at 65 %",
			Faults: []Fault{
				{At: 0.20, Name: "add processor", Inject: addProcessor},
				{At: 0.35, Name: "SIGTERM processor", Inject: removeProcessor(syscall.SIGTERM)},
				{At: 0.50, Name: "SIGKILL processor", Inject: removeProcessor(syscall.SIGKILL)},
				{At: 0.65, Name: "add processor", Inject: addProcessor},
			}},
		Scenario{Name: "postgres-outage", Private: true, StallLimit: outageWindow + time.Minute,
			Does: fmt.Sprintf("Postgres stopped at 20 %% for %s, then started", outageWindow),
			Faults: []Fault{{At: 0.2, Name: "Postgres down " + outageWindow.String(), Inject: func(ctx context.Context, p *pipeline) error {
				if err := p.srv.private.stopPostgres(ctx); err != nil {
					return err
				}
				if err := sleep(ctx, outageWindow); err != nil {
					return err
				}
				return p.srv.private.startPostgres(ctx)
			}}}},
	)
}

func sigName(sig syscall.Signal) string {
	if sig == syscall.SIGKILL {
		return "sigkill"
	}
	return "sigterm"
}

// bounces are three signals to one component, at 20, 45 and 70 % of the
// deliveries, each followed at once by a restart.
func bounces(component string, sig syscall.Signal) []Fault {
	var out []Fault
	for _, at := range []float64{0.20, 0.45, 0.70} {
		out = append(out, Fault{At: at, Name: fmt.Sprintf("%s %s", sigName(sig), component),
			Inject: func(ctx context.Context, p *pipeline) error { return bounce(ctx, p, component, sig) }})
	}
	return out
}

// bounce signals the component's process, waits until it exited (SIGTERM:
// up to a minute, then SIGKILL, which is reported) and starts it again.
func bounce(ctx context.Context, p *pipeline, component string, sig syscall.Signal) error {
	var pr *proc
	switch component {
	case "ingest":
		pr = p.ingest
	case "sink":
		pr = p.sink
	default:
		live := p.liveProcessors()
		if len(live) == 0 {
			return errors.New("no processor running")
		}
		pr = live[0]
	}
	killed, err := pr.signal(sig, time.Minute)
	if err != nil {
		return err
	}
	if killed {
		p.log.Warn("did not exit within a minute of SIGTERM; killed", "process", pr.name)
	}
	return pr.start()
}

func addProcessor(_ context.Context, p *pipeline) error {
	_, err := p.addProcessor()
	return err
}

// removeProcessor signals the oldest live processor and does not restart
// it: the group rebalances onto the others.
func removeProcessor(sig syscall.Signal) func(context.Context, *pipeline) error {
	return func(_ context.Context, p *pipeline) error {
		live := p.liveProcessors()
		if len(live) < 2 {
			return fmt.Errorf("%d processors running, want at least 2 to remove one", len(live))
		}
		_, err := live[0].signal(sig, time.Minute)
		return err
	}
}

// proxyScenario is one toxic on one proxied path for a window at 20 %.
func proxyScenario(name, path string, postgres bool, what string, window time.Duration, toxics ...string) Scenario {
	sc := Scenario{Name: name, ProxyPostgres: postgres, ProxyKafka: !postgres,
		Does: fmt.Sprintf("%s through toxiproxy: at 20 %%, %s", path, what)}
	sc.Faults = []Fault{{At: 0.2, Name: name, Inject: func(ctx context.Context, p *pipeline) error {
		x := p.kafkaProxy
		if postgres {
			x = p.pgProxy
		}
		if err := x.add(toxics...); err != nil {
			return err
		}
		err := sleep(ctx, window) // the fault's length, not a wait for something
		x.clear()
		return err
	}}}
	return sc
}

func sleep(ctx context.Context, d time.Duration) error {
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-time.After(d):
		return nil
	}
}

// Select returns the scenarios named (comma-separated; "all" or empty for
// every one), in the suite's order.
func Select(names []string) ([]Scenario, error) {
	all := Scenarios()
	if len(names) == 0 || (len(names) == 1 && (names[0] == "all" || names[0] == "")) {
		return all, nil
	}
	want := map[string]bool{}
	for _, n := range names {
		want[n] = true
	}
	var out []Scenario
	for _, sc := range all {
		if want[sc.Name] {
			out = append(out, sc)
			delete(want, sc.Name)
		}
	}
	for n := range want {
		return nil, fmt.Errorf("unknown scenario %q (-list names them)", n)
	}
	return out, nil
}
