package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/paystream/paystream/internal/lab/loadgen"
)

type loadgenCmd struct {
	Sources     string        `help:"Sources file ingest runs with: source names, drivers and secrets to sign with." env:"PAYSTREAM_SOURCES" type:"existingfile" placeholder:"FILE" required:""`
	Source      []string      `help:"Send to these sources only (repeatable or comma-separated). Defaults to every source, payments spread evenly." placeholder:"NAME"`
	URL         string        `help:"Ingest's base URL." default:"http://127.0.0.1:8080" env:"PAYSTREAM_LOADGEN_URL"`
	Rate        rateFlag      `help:"Target rate over all workers, e.g. 500, 500/s, 30000/m; 0 sends as fast as the workers can." default:"0" placeholder:"N/s"`
	Concurrency int           `help:"Workers, each with at most one request in flight." default:"16" short:"c"`
	Duration    time.Duration `help:"Stop after this long (default 10s unless --requests is set)." short:"d"`
	Requests    int64         `help:"Stop after this many requests." short:"n" placeholder:"N"`
	Payments    int           `help:"Distinct payment ids; each goes created → paid → refunds (or repeated facts) as it gets events." default:"1000"`
	Duplicates  float64       `help:"Fraction of requests, in [0,1), that re-send an event already sent (same ids and body, fresh signature), like gateway retries." default:"0"`
	Timeout     time.Duration `help:"Per-request timeout." default:"10s"`
	Client      string        `help:"HTTP client: net/http, or fasthttp (HTTP/1.1 only, about two thirds of net/http's CPU per request: for a load generator sharing the machine with ingest)." enum:"net/http,fasthttp" default:"net/http"`
	JSON        bool          `help:"Print the final report as JSON on stdout." name:"json"`
	Quiet       bool          `help:"No progress on stderr." short:"q"`
}

func (c *loadgenCmd) Help() string {
	return `Sends correctly signed webhooks to a running ingest, signing each request the way its gateway
would with the driver's own signing code and the secrets in the sources file (drivers:
` + strings.Join(loadgen.Drivers, ", ") + `; standardwebhooks needs a whsec_ or whsk_
secret). Progress goes to stderr (one updating line on a terminal, plain lines otherwise); the
final report (throughput, latency p50/p90/p99/max, status code counts, errors) goes to stdout.

Examples:

  paystream-lab loadgen --sources deploy/sources.example.yaml --rate 1000/s --duration 30s
  paystream-lab loadgen --sources sources.yaml --source stripe-br -c 64 -n 100000 --duplicates 0.05
  paystream-lab loadgen --sources sources.yaml --rate 0 -d 1m --json > report.json

Latency is measured per request from sending it to reading the whole answer. When the target rate
is not reached (the report says so), the workers were all busy: raise --concurrency. On a small
machine the load generator competes with ingest and Kafka for CPU (--client fasthttp takes less
of it); see 'make bench-ingest'.`
}

// rateFlag is a request rate: "500", "500/s", "30000/m", "0".
type rateFlag float64

// UnmarshalText parses a rate.
func (r *rateFlag) UnmarshalText(b []byte) error {
	s := strings.TrimSpace(string(b))
	per := 1.0
	if n, unit, ok := strings.Cut(s, "/"); ok {
		s = n
		switch unit {
		case "s", "sec":
		case "m", "min":
			per = 60
		case "h":
			per = 3600
		default:
			return fmt.Errorf("rate %q: unit must be /s, /m or /h", string(b))
		}
	}
	v, err := strconv.ParseFloat(s, 64)
	if err != nil || v < 0 || v != v || v > 1e9 {
		return fmt.Errorf("rate %q: want a number of requests per second such as 500 or 500/s (0: no limit)", string(b))
	}
	*r = rateFlag(v / per)
	return nil
}

func (c *loadgenCmd) Run(ctx context.Context) error {
	return c.run(ctx, os.Stdout, os.Stderr, isTerminal(os.Stderr))
}

func (c *loadgenCmd) run(ctx context.Context, stdout, stderr io.Writer, tty bool) error {
	if c.Duration < 0 || c.Requests < 0 {
		return errors.New("--duration and --requests must be positive")
	}
	if c.Duration == 0 && c.Requests == 0 {
		c.Duration = 10 * time.Second
	}
	if c.Concurrency < 1 {
		return errors.New("--concurrency must be at least 1")
	}
	if c.Payments < 1 {
		return errors.New("--payments must be at least 1")
	}
	if c.Duplicates < 0 || c.Duplicates >= 1 {
		return fmt.Errorf("--duplicates %v: want a fraction in [0, 1)", c.Duplicates)
	}
	srcs, err := loadgen.LoadSources(c.Sources)
	if err != nil {
		return err
	}
	var want []string
	for _, s := range c.Source {
		for n := range strings.SplitSeq(s, ",") {
			if n = strings.TrimSpace(n); n != "" {
				want = append(want, n)
			}
		}
	}
	var names []string
	for _, s := range srcs {
		names = append(names, s.Name)
	}
	for _, n := range want {
		if !slices.Contains(names, n) {
			return fmt.Errorf("--source %s: not in %s (sources: %s)", n, c.Sources, strings.Join(names, ", "))
		}
	}
	run, runNum := newRunID()
	var builders []*loadgen.Builder
	var used []string
	for _, s := range srcs {
		if len(want) > 0 && !slices.Contains(want, s.Name) {
			continue
		}
		b, err := loadgen.NewBuilder(s, run, runNum)
		if err != nil {
			return err
		}
		builders = append(builders, b)
		used = append(used, s.Name+" ("+s.Driver+")")
	}
	gen, err := loadgen.NewGenerator(loadgen.GeneratorConfig{Builders: builders, Payments: c.Payments, Duplicates: c.Duplicates})
	if err != nil {
		return err
	}

	cfg := loadgen.Config{
		URL:         c.URL,
		Generator:   gen,
		Rate:        float64(c.Rate),
		Concurrency: c.Concurrency,
		Duration:    c.Duration,
		Requests:    c.Requests,
		Client:      loadgen.NewClient(c.Concurrency, c.Timeout),
	}
	if c.Client == "fasthttp" {
		if cfg.Sender, err = loadgen.NewFastSender(c.URL, c.Concurrency, c.Timeout); err != nil {
			return fmt.Errorf("--url: %w", err)
		}
	}
	if !c.Quiet {
		fmt.Fprintf(stderr, "loadgen: run %s → %s, sources %s\n", run, c.URL, strings.Join(used, ", "))
		cfg.Progress, cfg.ProgressInterval = progressPrinter(stderr, tty)
	}
	res, err := loadgen.Run(ctx, cfg)
	if err != nil {
		return err
	}
	if c.JSON {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(res)
	}
	return res.WriteText(stdout)
}

// progressPrinter returns a Progress callback: one line rewritten in place
// twice a second on a terminal, a plain line every 5 seconds otherwise.
func progressPrinter(w io.Writer, tty bool) (func(loadgen.Snapshot), time.Duration) {
	line := func(s loadgen.Snapshot) string {
		return fmt.Sprintf("%6.1fs  sent %d  %.0f req/s  errors %d  p99 %s",
			s.Elapsed.Seconds(), s.Sent, s.RPS, s.Errors, loadgen.FormatDuration(s.P99))
	}
	if tty {
		return func(s loadgen.Snapshot) {
			if s.Final {
				fmt.Fprint(w, "\r\x1b[K")
				return
			}
			fmt.Fprint(w, "\r\x1b[K"+line(s))
		}, 500 * time.Millisecond
	}
	return func(s loadgen.Snapshot) {
		if !s.Final {
			fmt.Fprintln(w, "loadgen:"+line(s))
		}
	}, 5 * time.Second
}
