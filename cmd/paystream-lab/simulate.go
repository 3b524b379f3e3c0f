package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/paystream/paystream/internal/cmdline"
	"github.com/paystream/paystream/internal/lab/loadgen"
	"github.com/paystream/paystream/internal/lab/simulate"
)

type simulateCmd struct {
	kafkaFlags
	dbFlags
	Sources       string          `help:"Sources file ingest runs with: source names, drivers and secrets to sign with." env:"PAYSTREAM_SOURCES" type:"existingfile" placeholder:"FILE"`
	URL           string          `help:"Ingest's base URL." default:"http://127.0.0.1:8080" env:"PAYSTREAM_SIMULATE_URL"`
	Payments      int             `help:"Payments to simulate, spread over the sources in turn; each has 2 to 6 webhooks." default:"100"`
	Duplicates    float64         `help:"Fraction of deliveries, in [0,1), that re-send a webhook already sent (same ids and body, fresh signature)." default:"0.1"`
	Reorder       float64         `help:"Fraction of webhooks, in [0,1], sent later than their place in the payment's history." default:"0.1"`
	Rate          rateFlag        `help:"Target rate, e.g. 500, 500/s, 30000/m; 0 sends as fast as the workers can." default:"0" placeholder:"N/s"`
	Burst         int             `help:"Requests allowed at once above --rate (default 1% of the rate)." placeholder:"N"`
	Concurrency   int             `help:"Senders, each with at most one request in flight." default:"16" short:"c"`
	MaxDelay      time.Duration   `help:"Delay each delivery's first attempt by a random time up to this." default:"0s"`
	RetryLadder   []time.Duration `help:"Waits before each retry of a webhook not answered 2xx; after the last it is given up." default:"100ms,250ms,500ms,1s,2s,4s,8s,15s,30s" sep:","`
	Timeout       time.Duration   `help:"Per-request timeout." default:"10s"`
	Seed          int64           `help:"Seed of the histories and the plan (0: random; the report prints the one used)."`
	Driver        []string        `help:"Simulate only the sources of these drivers (repeatable or comma-separated). Defaults to every source the simulator can drive." placeholder:"NAME"`
	GatewayListen string          `help:"Address of the fake gateway API for refetching sources (Mercado Pago, Zoop, refetch: true); their api_base_url must point at it." placeholder:"HOST:PORT" env:"PAYSTREAM_SIMULATE_GATEWAY"`
	Poison        int             `help:"Plant this many unprocessable records on the raw topic halfway through (I10). Needs --kafka-brokers." placeholder:"N"`
	Verify        bool            `help:"After delivering, wait for the backlog to drain and check the invariants I1–I10; exit 3 on a violation. Needs --database-url and --kafka-brokers."`
	VerifyOnly    bool            `help:"Do not deliver: load --oracle and verify it."`
	Oracle        string          `help:"Save the oracle here after delivering (or load it, with --verify-only)." type:"path" placeholder:"FILE"`
	RawTopic      string          `help:"Raw webhook topic." default:"${raw_topic}" env:"PAYSTREAM_RAW_TOPIC"`
	StateTopic    string          `help:"Normalized payment-state topic." default:"${state_topic}" env:"PAYSTREAM_STATE_TOPIC"`
	Group         string          `help:"The processor's consumer group." default:"paystream-processor" env:"PAYSTREAM_GROUP"`
	DrainTimeout  time.Duration   `help:"How long --verify waits for the backlog to drain." default:"2m"`
	StallLimit    time.Duration   `help:"I9: the longest time with a backlog and no progress that passes." default:"1m"`
	JSON          bool            `help:"Print the report as one JSON object on stdout." name:"json"`
	Quiet         bool            `help:"No progress on stderr." short:"q"`
}

func (c *simulateCmd) Help() string {
	return `Plays every gateway of the sources file against a running paystream: realistic payment
histories (created, authorized, paid, failed, canceled, partial and full refunds, disputes
won and lost), each webhook signed as its gateway signs it, delivered at least once with
duplicates, reordering, delays and a retry ladder on anything but a 2xx. Sources that refetch
(Mercado Pago, Zoop) read the payments from a fake gateway API the command serves on
--gateway-listen. An oracle keeps each payment's true final state and ledger.

With --verify it then waits for the pipeline to drain, compares the database and the state
topic with the oracle and prints one line per invariant (I1–I10, docs/design.md), exiting 3
on any violation: "does my deployment hold up" in one command. Progress goes to stderr.

Examples:

  paystream-lab simulate --sources sources.yaml --payments 500 --duplicates 0.2 --reorder 0.3 \
    --verify --database-url "$PAYSTREAM_DATABASE_URL" --kafka-brokers 127.0.0.1:9092
  paystream-lab simulate --sources sources.yaml --gateway-listen 127.0.0.1:8089 --poison 3 \
    --kafka-brokers 127.0.0.1:9092 --database-url "$DB" --oracle run.json
  paystream-lab simulate --verify-only --oracle run.json --sources sources.yaml \
    --gateway-listen 127.0.0.1:8089 --database-url "$DB" --kafka-brokers 127.0.0.1:9092 --json

The second and third split a run across processes (restart things in between): the oracle file
holds the histories, what was acknowledged and what the offset sampler saw. Give a database URL
while delivering and the stored offsets are sampled too (I4, I5, I9).`
}

func (c *simulateCmd) Run(ctx context.Context, e *env) error {
	return c.run(ctx, e.log, os.Stdout, os.Stderr, isTerminal(os.Stderr))
}

// simulateReport is the --json output.
type simulateReport struct {
	Seed     int64                   `json:"seed"`
	Delivery *simulate.DeliveryStats `json:"delivery,omitempty"`
	Verify   *simulate.Report        `json:"verify,omitempty"`
	OK       *bool                   `json:"ok,omitempty"`
}

func (c *simulateCmd) run(ctx context.Context, log *slog.Logger, stdout, stderr io.Writer, tty bool) error {
	verify := c.Verify || c.VerifyOnly
	switch {
	case c.VerifyOnly && c.Oracle == "":
		return errors.New("--verify-only needs --oracle FILE (written by a run with --oracle)")
	case !c.VerifyOnly && c.Sources == "":
		return errors.New("no sources file: set --sources or PAYSTREAM_SOURCES")
	case c.Concurrency < 1:
		return errors.New("--concurrency must be at least 1")
	case c.Payments < 1:
		return errors.New("--payments must be at least 1")
	}
	var brokers []string
	if verify || c.Poison > 0 {
		var err error
		if brokers, err = c.brokers(); err != nil {
			return err
		}
	} else {
		brokers, _ = c.brokers() // optional: records where the raw topic started
	}
	var kafkaOpts []kgo.Opt // TLS, SASL
	if len(brokers) > 0 {
		var err error
		if kafkaOpts, err = c.connect(ctx, log, brokers); err != nil {
			return err
		}
	}
	var pool *pgxpool.Pool
	if verify || c.DatabaseURL != "" {
		var err error
		if pool, err = c.pool(ctx); err != nil {
			return err
		}
		defer pool.Close()
	}
	var drivers []string
	for _, d := range c.Driver {
		for n := range strings.SplitSeq(d, ",") {
			if n = strings.TrimSpace(n); n != "" {
				drivers = append(drivers, n)
			}
		}
	}
	cfg := simulate.Config{
		SourcesFile: c.Sources, IngestURL: c.URL, Payments: c.Payments, Duplicates: c.Duplicates, Reorder: c.Reorder,
		Rate: float64(c.Rate), Burst: c.Burst, Concurrency: c.Concurrency, MaxDelay: c.MaxDelay, RetryLadder: c.RetryLadder,
		RequestTimeout: c.Timeout, Seed: c.Seed, Drivers: drivers, GatewayListen: c.GatewayListen, Poison: c.Poison,
		KafkaBrokers: brokers, KafkaOpts: kafkaOpts, RawTopic: c.RawTopic,
	}
	if len(brokers) == 0 {
		cfg.RawTopic = ""
	}
	if pool != nil && !c.VerifyOnly {
		sampler, err := simulate.NewSampler(simulate.SamplerConfig{Pool: pool, Group: c.Group, Topic: c.RawTopic, Brokers: brokers, KafkaOpts: kafkaOpts})
		if err != nil {
			return err
		}
		cfg.Sampler = sampler
	}

	var (
		sim *simulate.Simulation
		err error
		out simulateReport
	)
	if c.VerifyOnly {
		sim, err = simulate.Load(c.Oracle, cfg, log)
	} else {
		sim, err = simulate.New(cfg, log)
	}
	if err != nil {
		return fmt.Errorf("simulate: %w", err)
	}
	defer sim.Close()
	out.Seed = sim.Seed()
	status := newStatusLine(stderr, tty, c.Quiet)

	if !c.VerifyOnly {
		stats, err := sim.Deliver(ctx, func(p simulate.Progress) {
			status.show(p.Final, "simulate: %s sent %d/%d, acked %d, %s, %d network errors, %d retries, %d given up",
				loadgen.FormatDuration(p.Elapsed), p.Sent, p.Total, p.Acked, statusCounts(p.Status), p.NetErrors, p.Retries, p.GivenUp)
		})
		out.Delivery = &stats
		if err != nil {
			return fmt.Errorf("simulate: %w", err)
		}
		if !verify {
			sim.FinishSampling()
		}
		if c.Oracle != "" {
			if err := sim.Save(c.Oracle); err != nil {
				return fmt.Errorf("simulate: %w", err)
			}
		}
	}
	if verify {
		rep, err := sim.Verify(ctx, simulate.Target{
			Pool: pool, KafkaBrokers: brokers, KafkaOpts: kafkaOpts, RawTopic: c.RawTopic, StateTopic: c.StateTopic, Group: c.Group,
			DrainTimeout: c.DrainTimeout, StallLimit: c.StallLimit,
			Progress: func(msg string) { status.show(false, "simulate: %s", msg) },
		})
		if err != nil {
			return fmt.Errorf("simulate: %w", err)
		}
		status.show(true, "simulate: verified")
		out.Verify = &rep
		ok := rep.OK()
		out.OK = &ok
	}
	if c.JSON {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		err = enc.Encode(out)
	} else {
		err = printSimulate(stdout, c.URL, out)
	}
	if err != nil {
		return fmt.Errorf("print report: %w", err)
	}
	if out.OK != nil && !*out.OK {
		return cmdline.ExitError{Code: exitDrift, Err: fmt.Errorf("simulate: invariants violated: %s", strings.Join(out.Verify.Failed(), ", "))}
	}
	return nil
}

func statusCounts(m map[int]int) string {
	ok, other := 0, 0
	for code, n := range m {
		if code >= 200 && code < 300 {
			ok += n
		} else {
			other += n
		}
	}
	return fmt.Sprintf("%d 2xx, %d other", ok, other)
}

// statusLine writes progress to stderr: one updating line on a terminal,
// a plain line every few seconds otherwise.
type statusLine struct {
	w     io.Writer
	tty   bool
	quiet bool
	last  time.Time
	open  bool
}

func newStatusLine(w io.Writer, tty, quiet bool) *statusLine {
	return &statusLine{w: w, tty: tty, quiet: quiet}
}

func (s *statusLine) show(final bool, format string, args ...any) {
	if s.quiet {
		return
	}
	msg := fmt.Sprintf(format, args...)
	if s.tty {
		fmt.Fprintf(s.w, "\r\033[K%s", msg)
		s.open = true
		if final {
			fmt.Fprintln(s.w)
			s.open = false
		}
		return
	}
	if final || time.Since(s.last) >= 5*time.Second {
		fmt.Fprintln(s.w, msg)
		s.last = time.Now()
	}
}

func printSimulate(w io.Writer, url string, r simulateReport) error {
	fmt.Fprintf(w, "seed %d\n", r.Seed)
	if d := r.Delivery; d != nil {
		fmt.Fprintf(w, "delivered %d webhooks (%d events, %d duplicates) to %s in %s: %d attempts, %d 2xx, %d 5xx (%d 503), %d other, %d network errors, %d retries, %d given up; latency p50 %s p99 %s max %s\n",
			d.Planned, d.Events, d.Duplicates, url, loadgen.FormatDuration(d.Elapsed), d.Attempts, d.OK, d.Status5xx, d.Status503,
			d.OtherStatus, d.NetErrors, d.Retries, d.GivenUp, loadgen.FormatDuration(d.P50), loadgen.FormatDuration(d.P99), loadgen.FormatDuration(d.Max))
		if d.Poison > 0 {
			fmt.Fprintf(w, "planted %d poison records on the raw topic\n", d.Poison)
		}
	}
	if v := r.Verify; v != nil {
		fmt.Fprintf(w, "drained: %v after %s; %d payments (%d left out of state checks: a webhook never acknowledged)\n",
			v.Drained, loadgen.FormatDuration(v.DrainTime), v.Payments, v.Incomplete)
		tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
		for _, inv := range v.Invariants {
			verdict := "ok"
			switch {
			case !inv.OK:
				verdict = "FAIL"
			case inv.Skipped:
				verdict = "skip"
			}
			fmt.Fprintf(tw, "%s\t%s\t%s: %s\n", inv.ID, verdict, inv.Name, inv.Detail)
		}
		if err := tw.Flush(); err != nil {
			return err
		}
		if v.OK() {
			fmt.Fprintln(w, "all invariants hold")
		} else {
			fmt.Fprintf(w, "violated: %s\n", strings.Join(v.Failed(), ", "))
		}
	}
	return nil
}
