// Command chaos runs paystream's chaos suite: every scenario of package
// internal/lab/chaos, each with its own pipeline and at least -deliveries
// simulated webhook deliveries, faults injected while they flow, and the
// simulation's verification at the end. It prints one table row per
// scenario (the table of docs/reliability.md) and, with -json, writes
// every result with its faults and invariants. `make chaos` runs it.
//
//	go run ./bench/chaos [-scenarios processor-sigkill,pg-reset] [-deliveries 20000] [-rate 500] [-json out.json]
//	go run ./bench/chaos -list
//
// The shared stack comes from PAYSTREAM_TEST_DATABASE_URL and
// PAYSTREAM_TEST_KAFKA_BROKERS (`eval "$(deploy/stack.sh env)"`); the
// scenarios that stop or kill a server start a private stack of their own
// with deploy/stack.sh on other ports (-private-*), and stop it at the end.
// Exit status 1 if any scenario failed.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/paystream/paystream/internal/lab/chaos"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "chaos:", err)
		os.Exit(1)
	}
}

func run() error {
	stack := chaos.DefaultPrivateStack("deploy/stack.sh")
	cfg := chaos.Config{Logger: slog.New(slog.NewTextHandler(os.Stderr, nil))}
	var (
		scenarios = flag.String("scenarios", "all", "comma-separated scenarios to run (-list names them)")
		list      = flag.Bool("list", false, "list the scenarios and exit")
		jsonPath  = flag.String("json", "", "also write every result as JSON to this file")
		noPrivate = flag.Bool("no-private", false, "skip the scenarios that need the private stack (broker and Postgres faults)")
		workDir   = flag.String("workdir", "", "directory for the processes' logs (default: a new temporary directory, kept)")
	)
	flag.StringVar(&cfg.Binary, "binary", "bin/paystream", "paystream binary to run as ingest, processor and sink")
	flag.IntVar(&cfg.Deliveries, "deliveries", 20_000, "webhook deliveries per scenario, at least")
	flag.Float64Var(&cfg.Rate, "rate", 500, "deliveries per second (0: as fast as ingest answers)")
	flag.IntVar(&cfg.Partitions, "partitions", 6, "partitions of the raw and state topics")
	flag.Int64Var(&cfg.Seed, "seed", 0, "simulation seed (0: random; the JSON records the one used)")
	flag.BoolVar(&cfg.Keep, "keep", false, "keep each scenario's schema after it ran")
	flag.DurationVar(&cfg.RecoveryTimeout, "recovery-timeout", 5*time.Minute, "longest wait for the pipeline to catch up after a fault")
	flag.StringVar(&stack.Dir, "private-dir", stack.Dir, "the private stack's data directory")
	flag.IntVar(&stack.PGPort, "private-pg-port", stack.PGPort, "the private stack's Postgres port")
	flag.IntVar(&stack.KafkaPort, "private-kafka-port", stack.KafkaPort, "the private stack's Kafka port")
	flag.IntVar(&stack.ControllerPort, "private-controller-port", stack.ControllerPort, "the private stack's KRaft controller port")
	flag.Usage = func() {
		fmt.Fprintf(os.Stderr, `Usage: chaos [flags]

Runs paystream's chaos scenarios and prints a table: deliveries, 2xx answers,
503 answers, deliveries lost, duplicate effects, duplicate or missing state
events, the longest recovery after a fault, and the drain after the last
delivery. Needs the shared stack (eval "$(deploy/stack.sh env)") and bin/paystream.

Example:
  go run ./bench/chaos -scenarios processor-sigkill,pg-reset -deliveries 3000 -json bin/chaos.json

Flags:
`)
		flag.PrintDefaults()
	}
	flag.Parse()

	if *list {
		for _, sc := range chaos.Scenarios() {
			where := "shared stack"
			if sc.Private {
				where = "private stack"
			}
			fmt.Printf("%-18s %s (%s)\n", sc.Name, sc.Does, where)
		}
		return nil
	}
	selected, err := chaos.Select(strings.Split(*scenarios, ","))
	if err != nil {
		return err
	}
	cfg.DatabaseURL, cfg.Brokers = os.Getenv("PAYSTREAM_TEST_DATABASE_URL"), strings.Split(os.Getenv("PAYSTREAM_TEST_KAFKA_BROKERS"), ",")
	if cfg.DatabaseURL == "" || cfg.Brokers[0] == "" {
		return errors.New(`set PAYSTREAM_TEST_DATABASE_URL and PAYSTREAM_TEST_KAFKA_BROKERS (make chaos does; or eval "$(deploy/stack.sh env)")`)
	}
	if _, err := os.Stat(cfg.Binary); err != nil {
		return fmt.Errorf("paystream binary: %w (make build)", err)
	}
	if cfg.Binary, err = filepath.Abs(cfg.Binary); err != nil {
		return err
	}
	if !*noPrivate {
		if stack.Script, err = filepath.Abs(stack.Script); err != nil {
			return err
		}
		stack.Logger = cfg.Logger
		cfg.Private = &stack
	}
	if cfg.WorkDir = *workDir; cfg.WorkDir == "" {
		if cfg.WorkDir, err = os.MkdirTemp("", "paystream-chaos-"); err != nil {
			return err
		}
	}
	if cfg.Seed == 0 {
		cfg.Seed = time.Now().UnixNano()
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()

	fmt.Printf("chaos: %d scenarios, ≥%d deliveries each at %.0f/s, %d partitions, seed %d, logs in %s\n\n",
		len(selected), cfg.Deliveries, cfg.Rate, cfg.Partitions, cfg.Seed, cfg.WorkDir)
	fmt.Print(chaos.TableHeader)
	results, runErr := chaos.RunAll(ctx, cfg, selected, func(r chaos.Result) {
		fmt.Print(r.Row())
		if !r.OK && r.Skipped == "" {
			_ = chaos.WriteDetails(os.Stderr, []chaos.Result{r}) // at once, not only after the table
		}
	})
	fmt.Println()
	if err := chaos.WriteDetails(os.Stdout, results); err != nil {
		return err
	}
	if *jsonPath != "" {
		out, err := json.MarshalIndent(struct {
			Seed       int64          `json:"seed"`
			Deliveries int            `json:"deliveries_per_scenario"`
			Rate       float64        `json:"rate"`
			Results    []chaos.Result `json:"results"`
		}{cfg.Seed, cfg.Deliveries, cfg.Rate, results}, "", "  ")
		if err != nil {
			return err
		}
		if err := os.WriteFile(*jsonPath, out, 0o644); err != nil {
			return err
		}
	}
	if runErr != nil {
		return runErr
	}
	failed := 0
	for _, r := range results {
		if !r.OK && r.Skipped == "" {
			failed++
		}
	}
	if failed > 0 {
		return fmt.Errorf("%d of %d scenarios failed", failed, len(results))
	}
	return nil
}
