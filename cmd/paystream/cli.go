package main

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/pprof"
	"strings"
	"time"

	"github.com/alecthomas/kong"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/paystream/paystream/internal/cmdline"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/twmb/franz-go/pkg/kgo"
)

// cli is the whole command line. Every flag can also be set through the
// PAYSTREAM_* environment variable named in its help.
type cli struct {
	cmdline.Logging

	Ingest    ingestCmd    `cmd:"" help:"Receive webhooks over HTTP, verify them and produce them to the raw topic."`
	Processor processorCmd `cmd:"" help:"Consume the raw topic and apply each event exactly once in Postgres."`
	Sink      sinkCmd      `cmd:"" help:"Relay committed state events from a replication slot to the normalized payment-state topic, exactly once for read_committed consumers."`
	Migrate   migrateCmd   `cmd:"" help:"Apply database migrations (idempotent) and create Kafka topics."`
	Dev       devCmd       `cmd:"" help:"Run ingest, processor and sink in one process with embedded Kafka and a private Postgres."`
	Inspect   inspectCmd   `cmd:"" help:"Show what paystream knows about a payment."`
	Replay    replayCmd    `cmd:"" help:"Re-drive a held payment's quarantined events after a fix, exactly once."`
	Retention retentionCmd `cmd:"" help:"Create the coming days' delivery partitions, drop expired ones and delete expired dedup keys."`
	Backfill  backfillCmd  `cmd:"" help:"Rebuild the compacted latest-state topic from Postgres (each payment's newest state event)."`
	Republish republishCmd `cmd:"" help:"After a Postgres failover lost the sink's replication slot: publish again the state events it may not have relayed, and recreate the slot."`
	Reconcile reconcileCmd `cmd:"" help:"Check ledger against payment state, waiting payments, state events on the topic and the DLQ; exit 3 on drift."`
	DLQ       dlqCmd       `cmd:"" name:"dlq" help:"List, show and replay dead-lettered webhooks (the DLQ topic)."`
	Tail      tailCmd      `cmd:"" help:"Print the payment-state topic as it grows (read_committed), for people and scripts."`
	Console   consoleCmd   `cmd:"" help:"Serve a read-only web console: a payment's story, the stuck work and the pipeline's health (docs/console.md)."`
	Alerts    alertsCmd    `cmd:"" help:"Print the Prometheus alert rules, their runbook links under --runbook-base-url."`
	Version   versionCmd   `cmd:"" help:"Print the version, the commit and the Go release paystream was built from."`
}

// kafkaFlags are shared by every command that talks to Kafka.
type kafkaFlags struct {
	KafkaBrokers []string `help:"Kafka seed brokers, comma-separated." env:"PAYSTREAM_KAFKA_BROKERS" placeholder:"HOST:PORT"`
	kafkaSecurityFlags
}

// kafkaSecurityFlags say how to connect to the brokers: TLS and SASL
// (internal/kafkaconn, flags shared with paystream-lab). Commands whose
// brokers flag reads differently (migrate, dev) embed them next to their
// own.
type kafkaSecurityFlags struct{ cmdline.KafkaSecurity }

// set reports whether any TLS or SASL flag is set.
func (s kafkaSecurityFlags) set() bool { return s != kafkaSecurityFlags{} }

// opts validates the connection to brokers and returns the franz-go
// options of every Kafka client of the command (cmdline.KafkaSecurity.Opts).
func (s kafkaSecurityFlags) opts(log *slog.Logger, brokers []string) ([]kgo.Opt, error) {
	return s.Opts(log, brokers)
}

// checkKafka connects to brokers once before the command's work
// (cmdline.KafkaSecurity.Check): bad settings end the command, brokers
// not reachable only warn.
func (s kafkaSecurityFlags) checkKafka(ctx context.Context, log *slog.Logger, brokers []string) error {
	return s.Check(ctx, log, brokers)
}

// kafka returns the seed brokers and the validated franz-go options that
// connect to them (seed brokers included), as opts does.
func (k kafkaFlags) kafka(log *slog.Logger) ([]string, []kgo.Opt, error) {
	brokers, err := k.brokers()
	if err != nil {
		return nil, nil, err
	}
	opts, err := k.opts(log, brokers)
	if err != nil {
		return nil, nil, err
	}
	return brokers, opts, nil
}

func (k kafkaFlags) brokers() ([]string, error) { return cmdline.Brokers(k.KafkaBrokers) }

// connect opens what a command working on Kafka and Postgres needs: the
// Kafka settings (brokers and client options, checked with one connection,
// see checkKafka) and a pool, which the caller closes.
func connect(ctx context.Context, e *env, k kafkaFlags, d dbFlags) ([]string, []kgo.Opt, *pgxpool.Pool, error) {
	brokers, opts, err := k.kafka(e.log)
	if err != nil {
		return nil, nil, nil, err
	}
	pool, err := d.pool(ctx)
	if err != nil {
		return nil, nil, nil, err
	}
	if err := k.checkKafka(ctx, e.log, brokers); err != nil {
		pool.Close()
		return nil, nil, nil, err
	}
	return brokers, opts, pool, nil
}

// dbFlags are shared by every command that talks to Postgres.
type dbFlags struct {
	DatabaseURL string `help:"Postgres connection URL." env:"PAYSTREAM_DATABASE_URL" placeholder:"postgres://..."`
}

func (d dbFlags) pool(ctx context.Context) (*pgxpool.Pool, error) {
	if err := d.required(); err != nil {
		return nil, err
	}
	return openPool(ctx, d.DatabaseURL)
}

// required fails when no database is configured.
func (d dbFlags) required() error { return cmdline.RequireDatabase(d.DatabaseURL) }

// sizedPool is pool with at most maxConns connections, unless the URL sets
// pool_max_conns itself (maxConns 0: pgx's default), and opts applied to
// its config.
func (d dbFlags) sizedPool(ctx context.Context, maxConns int32, opts ...func(*pgxpool.Config)) (*pgxpool.Pool, error) {
	if err := d.required(); err != nil {
		return nil, err
	}
	size := func(cfg *pgxpool.Config) {
		if maxConns > 0 && !strings.Contains(d.DatabaseURL, "pool_max_conns") {
			cfg.MaxConns = maxConns
		}
	}
	return openPool(ctx, d.DatabaseURL, append([]func(*pgxpool.Config){size}, opts...)...)
}

// applicationName names this process's Postgres sessions (pg_stat_activity,
// logs) unless the database URL sets application_name: "paystream" and the
// subcommand, set once by run.
var applicationName = "paystream"

func openPool(ctx context.Context, url string, opts ...func(*pgxpool.Config)) (*pgxpool.Pool, error) {
	return cmdline.OpenPool(ctx, url, applicationName, opts...)
}

// metricsFlags serve /metrics for the commands without an HTTP server.
type metricsFlags struct {
	MetricsAddr string `help:"Address serving /metrics and /healthz (empty disables)." env:"PAYSTREAM_METRICS_ADDR"`
}

// env carries what every command gets: a logger and a metrics registry.
type env struct {
	log *slog.Logger
	reg *prometheus.Registry
}

func newRegistry() *prometheus.Registry {
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}), buildInfoMetric(buildInfo()))
	return reg
}

// readyTimeout bounds one readiness check.
const readyTimeout = 2 * time.Second

// serveMetrics serves /metrics, /healthz (the process is up), /readyz (ready
// reports nil within readyTimeout; nil ready: always) and profiles on addr
// until ctx ends. An empty addr serves nothing.
func serveMetrics(ctx context.Context, e *env, addr string, ready func(context.Context) error) error {
	if addr == "" {
		return nil
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return fmt.Errorf("metrics listen: %w", err)
	}
	serveMetricsOn(ctx, e, ln, ready)
	return nil
}

// serveMetricsOn is serveMetrics on a listener already open, which it
// closes when ctx ends.
func serveMetricsOn(ctx context.Context, e *env, ln net.Listener, ready func(context.Context) error) {
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(e.reg, promhttp.HandlerOpts{}))
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte("ok\n")) })
	mux.HandleFunc("/readyz", func(w http.ResponseWriter, r *http.Request) {
		if ready != nil {
			rctx, cancel := context.WithTimeout(r.Context(), readyTimeout)
			defer cancel()
			if err := ready(rctx); err != nil {
				http.Error(w, "not ready: "+err.Error(), http.StatusServiceUnavailable)
				return
			}
		}
		_, _ = w.Write([]byte("ok\n"))
	})
	// Profiles for measuring before optimizing; the metrics address is an
	// operator's port, not a public one.
	mux.HandleFunc("/debug/pprof/", pprof.Index)
	mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	go func() {
		<-ctx.Done()
		_ = srv.Close()
	}()
	go func() { _ = srv.Serve(ln) }()
	e.log.Info("metrics listening", "addr", ln.Addr().String())
}

var isTerminal = cmdline.IsTerminal

func run(args []string) int {
	var c cli
	return cmdline.Run(args, "paystream", &c, func(kctx *kong.Context) any {
		if cmd, _, _ := strings.Cut(kctx.Command(), " "); cmd != "" {
			applicationName = "paystream " + cmd
		}
		return &env{log: c.Logger(), reg: newRegistry()}
	},
		kong.Description("paystream turns payment-gateway webhooks — delivered at least once, out of order, "+
			"sometimes forged — into exactly-once payment effects: one transition, one ledger posting and one "+
			"normalized event per real change.\n\nQuick start: `paystream dev --sources deploy/sources.example.yaml`."),
		kong.Vars(topicVars),
	)
}
