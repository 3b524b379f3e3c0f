package main

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/alecthomas/kong"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/paystream/paystream/internal/envelope"
	"github.com/paystream/paystream/internal/kafkaconn"
)

// cli is the whole command line. Flags read the same PAYSTREAM_*
// environment variables as paystream's.
type cli struct {
	LogLevel  string `help:"Log level: debug, info, warn, error." default:"info" env:"PAYSTREAM_LOG_LEVEL" enum:"debug,info,warn,error"`
	LogFormat string `help:"Log format: text or json." default:"text" env:"PAYSTREAM_LOG_FORMAT" enum:"text,json"`

	Simulate simulateCmd `cmd:"" help:"Simulate every gateway's payment histories against a running paystream and, with --verify, check the invariants I1–I10."`
	Loadgen  loadgenCmd  `cmd:"" help:"Send correctly signed webhooks to an ingest at a target rate and report throughput and latency."`
}

// env carries what every command gets.
type env struct {
	log *slog.Logger
}

// kafkaFlags are paystream's Kafka connection flags (brokers, TLS, SASL),
// read into a kafkaconn.Config.
type kafkaFlags struct {
	KafkaBrokers            []string `help:"Kafka seed brokers, comma-separated." env:"PAYSTREAM_KAFKA_BROKERS" placeholder:"HOST:PORT"`
	KafkaTLS                bool     `name:"kafka-tls" help:"Connect with TLS (on when any other TLS flag is set)." env:"PAYSTREAM_KAFKA_TLS"`
	KafkaTLSCAFile          string   `name:"kafka-tls-ca-file" help:"PEM file of the brokers' CA (default: the system's roots)." env:"PAYSTREAM_KAFKA_TLS_CA_FILE" placeholder:"FILE"`
	KafkaTLSCertFile        string   `name:"kafka-tls-cert-file" help:"PEM client certificate (mutual TLS)." env:"PAYSTREAM_KAFKA_TLS_CERT_FILE" placeholder:"FILE"`
	KafkaTLSKeyFile         string   `name:"kafka-tls-key-file" help:"PEM private key of the client certificate." env:"PAYSTREAM_KAFKA_TLS_KEY_FILE" placeholder:"FILE"`
	KafkaTLSServerName      string   `name:"kafka-tls-server-name" help:"Name the brokers' certificates must carry." env:"PAYSTREAM_KAFKA_TLS_SERVER_NAME" placeholder:"NAME"`
	KafkaSASLMechanism      string   `name:"kafka-sasl-mechanism" help:"SASL mechanism, as paystream's (empty: no SASL)." env:"PAYSTREAM_KAFKA_SASL_MECHANISM" placeholder:"MECHANISM"`
	KafkaSASLUsername       string   `name:"kafka-sasl-username" help:"SASL user." env:"PAYSTREAM_KAFKA_SASL_USERNAME" placeholder:"USER"`
	KafkaSASLPassword       string   `name:"kafka-sasl-password" help:"SASL password (prefer the file, or the environment)." env:"PAYSTREAM_KAFKA_SASL_PASSWORD" placeholder:"PASSWORD"`
	KafkaSASLPasswordFile   string   `name:"kafka-sasl-password-file" help:"File holding the SASL password." env:"PAYSTREAM_KAFKA_SASL_PASSWORD_FILE" placeholder:"FILE"`
	KafkaSASLOAuthTokenFile string   `name:"kafka-sasl-oauth-token-file" help:"File holding the OAUTHBEARER token." env:"PAYSTREAM_KAFKA_SASL_OAUTH_TOKEN_FILE" placeholder:"FILE"`
}

// brokers returns the seed brokers, or an error naming the flag when none.
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

// connect validates the TLS and SASL settings, logs what is allowed but
// unsafe, connects once (unreachable brokers only warn, as in paystream) and
// returns the franz-go options of every client.
func (k kafkaFlags) connect(ctx context.Context, log *slog.Logger, brokers []string) ([]kgo.Opt, error) {
	cfg := kafkaconn.Config{
		Brokers: brokers, TLS: k.KafkaTLS, TLSCAFile: k.KafkaTLSCAFile, TLSCertFile: k.KafkaTLSCertFile,
		TLSKeyFile: k.KafkaTLSKeyFile, TLSServerName: k.KafkaTLSServerName, SASLMechanism: k.KafkaSASLMechanism,
		SASLUsername: k.KafkaSASLUsername, SASLPassword: k.KafkaSASLPassword, SASLPasswordFile: k.KafkaSASLPasswordFile,
		SASLOAuthTokenFile: k.KafkaSASLOAuthTokenFile,
	}
	opts, err := cfg.Opts()
	if err != nil {
		return nil, err
	}
	for _, w := range cfg.Warnings() {
		log.Warn(w)
	}
	if err := cfg.Check(ctx); errors.Is(err, kafkaconn.ErrUnreachable) {
		log.Warn("kafka not reachable yet; going on", "error", err)
	} else if err != nil {
		return nil, err
	}
	return opts, nil
}

// dbFlags name the Postgres database.
type dbFlags struct {
	DatabaseURL string `help:"Postgres connection URL." env:"PAYSTREAM_DATABASE_URL" placeholder:"postgres://..."`
}

// pool connects to the database, as application "paystream-lab" unless the
// URL names one.
func (d dbFlags) pool(ctx context.Context) (*pgxpool.Pool, error) {
	if d.DatabaseURL == "" {
		return nil, errors.New("no database: set --database-url or PAYSTREAM_DATABASE_URL")
	}
	cfg, err := pgxpool.ParseConfig(d.DatabaseURL)
	if err != nil {
		return nil, fmt.Errorf("parse database URL: %w", err) // pgx redacts the password
	}
	if cfg.ConnConfig.RuntimeParams["application_name"] == "" {
		cfg.ConnConfig.RuntimeParams["application_name"] = "paystream-lab"
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

// exitDrift is the exit status when verification found a violated
// invariant, as paystream reconcile's on drift.
const exitDrift = 3

// exitError is an error that asks run for a specific exit status.
type exitError struct {
	code int
	err  error
}

func (e exitError) Error() string { return e.err.Error() }
func (e exitError) Unwrap() error { return e.err }

// ExitCode is the process's exit status.
func (e exitError) ExitCode() int { return e.code }

// isTerminal reports whether f is a character device (a terminal).
func isTerminal(f *os.File) bool {
	fi, err := f.Stat()
	return err == nil && fi.Mode()&os.ModeCharDevice != 0
}

// newRunID returns a short id, and a number, that make this run's event
// and payment ids differ from other runs'.
func newRunID() (string, uint32) {
	var b [4]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:3]), binary.BigEndian.Uint32(b[:])
}

func run(args []string) int {
	var c cli
	parser, err := kong.New(&c,
		kong.Name("paystream-lab"),
		kong.Description("Tools that exercise a running paystream from outside: simulated gateways verified "+
			"against an oracle, and a load generator. Not part of the paystream binary."),
		kong.UsageOnError(),
		kong.Vars{"raw_topic": envelope.TopicRaw, "state_topic": envelope.TopicState},
		kong.ConfigureHelp(kong.HelpOptions{Compact: true}),
	)
	if err != nil {
		fmt.Fprintln(os.Stderr, "paystream-lab:", err)
		return 2
	}
	kctx, err := parser.Parse(args)
	if err != nil {
		parser.Errorf("%s", err)
		return 2
	}
	var lv slog.Level
	_ = lv.UnmarshalText([]byte(c.LogLevel))
	opts := &slog.HandlerOptions{Level: lv}
	e := &env{log: slog.New(slog.NewTextHandler(os.Stderr, opts))}
	if c.LogFormat == "json" {
		e.log = slog.New(slog.NewJSONHandler(os.Stderr, opts))
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	kctx.BindTo(ctx, (*context.Context)(nil))
	if err := kctx.Run(e); err != nil {
		fmt.Fprintln(os.Stderr, "paystream-lab:", err)
		var coded interface{ ExitCode() int }
		if errors.As(err, &coded) {
			return coded.ExitCode()
		}
		return 1
	}
	return 0
}
