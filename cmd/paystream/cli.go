package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/pprof"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/alecthomas/kong"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/paystream/paystream/internal/kafkaconn"
)

// cli is the whole command line. Every flag can also be set through the
// PAYSTREAM_* environment variable named in its help.
type cli struct {
	LogLevel  string `help:"Log level: debug, info, warn, error." default:"info" env:"PAYSTREAM_LOG_LEVEL" enum:"debug,info,warn,error"`
	LogFormat string `help:"Log format: text or json." default:"text" env:"PAYSTREAM_LOG_FORMAT" enum:"text,json"`

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
// (internal/kafkaconn). Commands whose brokers flag reads differently
// (migrate, dev) embed them next to their own.
type kafkaSecurityFlags struct {
	KafkaTLS                bool   `name:"kafka-tls" help:"Connect to the brokers with TLS, checking their certificates against the system's roots or a CA file (on when any other TLS flag is set)." env:"PAYSTREAM_KAFKA_TLS"`
	KafkaTLSCAFile          string `name:"kafka-tls-ca-file" help:"PEM file of the CA the brokers' certificates chain to (default: the system's roots)." env:"PAYSTREAM_KAFKA_TLS_CA_FILE" placeholder:"FILE"`
	KafkaTLSCertFile        string `name:"kafka-tls-cert-file" help:"PEM client certificate, for brokers that authenticate clients by certificate (mutual TLS); read again at each connection." env:"PAYSTREAM_KAFKA_TLS_CERT_FILE" placeholder:"FILE"`
	KafkaTLSKeyFile         string `name:"kafka-tls-key-file" help:"PEM private key of the client certificate." env:"PAYSTREAM_KAFKA_TLS_KEY_FILE" placeholder:"FILE"`
	KafkaTLSServerName      string `name:"kafka-tls-server-name" help:"Name the brokers' certificates must carry (default: the host dialed)." env:"PAYSTREAM_KAFKA_TLS_SERVER_NAME" placeholder:"NAME"`
	KafkaSASLMechanism      string `name:"kafka-sasl-mechanism" help:"SASL mechanism: PLAIN, SCRAM-SHA-256, SCRAM-SHA-512, OAUTHBEARER or AWS_MSK_IAM (with AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_SESSION_TOKEN from the environment). Empty: no SASL." env:"PAYSTREAM_KAFKA_SASL_MECHANISM" placeholder:"MECHANISM"`
	KafkaSASLUsername       string `name:"kafka-sasl-username" help:"SASL user (PLAIN, SCRAM)." env:"PAYSTREAM_KAFKA_SASL_USERNAME" placeholder:"USER"`
	KafkaSASLPassword       string `name:"kafka-sasl-password" help:"SASL password (PLAIN, SCRAM). Prefer a password file (--kafka-sasl-password-file); if you must, set this through the environment, never on the command line (ps shows it)." env:"PAYSTREAM_KAFKA_SASL_PASSWORD" placeholder:"PASSWORD"`
	KafkaSASLPasswordFile   string `name:"kafka-sasl-password-file" help:"File holding the SASL password (PLAIN, SCRAM), read at each authentication." env:"PAYSTREAM_KAFKA_SASL_PASSWORD_FILE" placeholder:"FILE"`
	KafkaSASLOAuthTokenFile string `name:"kafka-sasl-oauth-token-file" help:"File holding the OAUTHBEARER token, read at each authentication: keep it fresh (a sidecar, a projected token)." env:"PAYSTREAM_KAFKA_SASL_OAUTH_TOKEN_FILE" placeholder:"FILE"`
}

// config is the connection to brokers as the flags say.
func (s kafkaSecurityFlags) config(brokers []string) kafkaconn.Config {
	return kafkaconn.Config{
		Brokers: brokers, TLS: s.KafkaTLS, TLSCAFile: s.KafkaTLSCAFile,
		TLSCertFile: s.KafkaTLSCertFile, TLSKeyFile: s.KafkaTLSKeyFile, TLSServerName: s.KafkaTLSServerName,
		SASLMechanism: s.KafkaSASLMechanism, SASLUsername: s.KafkaSASLUsername, SASLPassword: s.KafkaSASLPassword,
		SASLPasswordFile: s.KafkaSASLPasswordFile, SASLOAuthTokenFile: s.KafkaSASLOAuthTokenFile,
	}
}

// set reports whether any TLS or SASL flag is set.
func (s kafkaSecurityFlags) set() bool { return s != kafkaSecurityFlags{} }

// opts validates the connection to brokers the flags describe and returns
// the franz-go options every Kafka client of the command gets: the seed
// brokers, TLS and SASL. What is allowed but unsafe (PLAIN without TLS) is
// logged as a warning.
func (s kafkaSecurityFlags) opts(log *slog.Logger, brokers []string) ([]kgo.Opt, error) {
	cfg := s.config(brokers)
	opts, err := cfg.Opts()
	if err != nil {
		return nil, err
	}
	for _, w := range cfg.Warnings() {
		log.Warn(w)
	}
	return opts, nil
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

func (k kafkaFlags) brokers() ([]string, error) {
	var out []string
	for _, b := range k.KafkaBrokers {
		if b = strings.TrimSpace(b); b != "" {
			out = append(out, b)
		}
	}
	if len(out) == 0 {
		return nil, errors.New("no Kafka brokers: set --kafka-brokers or PAYSTREAM_KAFKA_BROKERS")
	}
	return out, nil
}

// checkKafka connects to brokers once, as every command that talks to
// Kafka does before its work: a wrong password, token, certificate or TLS
// setting ends the command with one line naming the flag to fix, before it
// serves or changes anything (franz-go would otherwise retry it, or report
// it deep in another error). Brokers that cannot be reached at all only
// get a warning: the command goes on as it always has (ingest answers 503
// until they are back).
func (s kafkaSecurityFlags) checkKafka(ctx context.Context, log *slog.Logger, brokers []string) error {
	err := s.config(brokers).Check(ctx)
	if errors.Is(err, kafkaconn.ErrUnreachable) {
		log.Warn("kafka not reachable yet; going on", "error", err)
		return nil
	}
	return err
}

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
func (d dbFlags) required() error {
	if d.DatabaseURL == "" {
		return errors.New("no database: set --database-url or PAYSTREAM_DATABASE_URL")
	}
	return nil
}

// sizedPool is pool with at most maxConns connections, unless the URL sets
// pool_max_conns itself (maxConns 0: pgx's default).
func (d dbFlags) sizedPool(ctx context.Context, maxConns int32) (*pgxpool.Pool, error) {
	if err := d.required(); err != nil {
		return nil, err
	}
	return openPool(ctx, d.DatabaseURL, func(cfg *pgxpool.Config) {
		if maxConns > 0 && !strings.Contains(d.DatabaseURL, "pool_max_conns") {
			cfg.MaxConns = maxConns
		}
	})
}

// applicationName names this process's Postgres sessions (pg_stat_activity,
// logs) unless the database URL sets application_name: "paystream" and the
// subcommand, set once by run.
var applicationName = "paystream"

func openPool(ctx context.Context, url string, opts ...func(*pgxpool.Config)) (*pgxpool.Pool, error) {
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		return nil, fmt.Errorf("parse database URL: %w", err) // pgx redacts the password
	}
	if cfg.ConnConfig.RuntimeParams["application_name"] == "" {
		cfg.ConnConfig.RuntimeParams["application_name"] = applicationName
	}
	for _, opt := range opts {
		opt(cfg)
	}
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("connect to postgres: %w", err)
	}
	pctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := pool.Ping(pctx); err != nil {
		pool.Close()
		return nil, fmt.Errorf("connect to postgres at %s:%d: %w", cfg.ConnConfig.Host, cfg.ConnConfig.Port, err)
	}
	return pool, nil
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

// isTerminal reports whether f is a character device (a terminal).
func isTerminal(f *os.File) bool {
	fi, err := f.Stat()
	return err == nil && fi.Mode()&os.ModeCharDevice != 0
}

func newLogger(level, format string) *slog.Logger {
	var lv slog.Level
	_ = lv.UnmarshalText([]byte(level))
	opts := &slog.HandlerOptions{Level: lv}
	if format == "json" {
		return slog.New(slog.NewJSONHandler(os.Stderr, opts))
	}
	return slog.New(slog.NewTextHandler(os.Stderr, opts))
}

func run(args []string) int {
	var c cli
	parser, err := kong.New(&c,
		kong.Name("paystream"),
		kong.Description("paystream turns payment-gateway webhooks — delivered at least once, out of order, "+
			"sometimes forged — into exactly-once payment effects: one transition, one ledger posting and one "+
			"normalized event per real change.\n\nQuick start: `paystream dev --sources deploy/sources.example.yaml`."),
		kong.UsageOnError(),
		kong.Vars(topicVars),
		kong.ConfigureHelp(kong.HelpOptions{Compact: true}),
	)
	if err != nil {
		fmt.Fprintln(os.Stderr, "paystream:", err)
		return 2
	}
	kctx, err := parser.Parse(args)
	if err != nil {
		parser.Errorf("%s", err)
		return 2
	}
	if cmd, _, _ := strings.Cut(kctx.Command(), " "); cmd != "" {
		applicationName = "paystream " + cmd
	}
	e := &env{log: newLogger(c.LogLevel, c.LogFormat), reg: newRegistry()}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	kctx.BindTo(ctx, (*context.Context)(nil))
	if err := kctx.Run(e); err != nil {
		fmt.Fprintln(os.Stderr, "paystream:", err)
		var coded interface{ ExitCode() int }
		if errors.As(err, &coded) {
			return coded.ExitCode()
		}
		return 1
	}
	return 0
}
