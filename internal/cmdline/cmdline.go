// Package cmdline is the command-line plumbing paystream and paystream-lab
// share: the Kafka connection flags (TLS, SASL) and their checks, the
// database URL, the logger, exit statuses and the kong run loop. Flags read
// the same PAYSTREAM_* environment variables in both binaries.
package cmdline

import (
	"context"
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

	"github.com/paystream/paystream/internal/kafkaconn"
)

// Logging are the log flags every command takes.
type Logging struct {
	LogLevel  string `help:"Log level: debug, info, warn, error." default:"info" env:"PAYSTREAM_LOG_LEVEL" enum:"debug,info,warn,error"`
	LogFormat string `help:"Log format: text or json." default:"text" env:"PAYSTREAM_LOG_FORMAT" enum:"text,json"`
}

// Logger is a logger to stderr at the flags' level and in their format.
func (l Logging) Logger() *slog.Logger {
	var lv slog.Level
	_ = lv.UnmarshalText([]byte(l.LogLevel))
	opts := &slog.HandlerOptions{Level: lv}
	if l.LogFormat == "json" {
		return slog.New(slog.NewJSONHandler(os.Stderr, opts))
	}
	return slog.New(slog.NewTextHandler(os.Stderr, opts))
}

// KafkaSecurity says how to connect to the brokers: TLS and SASL
// (internal/kafkaconn). Commands embed it next to their brokers flag.
type KafkaSecurity struct {
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

// Config is the connection to brokers as the flags say.
func (s KafkaSecurity) Config(brokers []string) kafkaconn.Config {
	return kafkaconn.Config{
		Brokers: brokers, TLS: s.KafkaTLS, TLSCAFile: s.KafkaTLSCAFile,
		TLSCertFile: s.KafkaTLSCertFile, TLSKeyFile: s.KafkaTLSKeyFile, TLSServerName: s.KafkaTLSServerName,
		SASLMechanism: s.KafkaSASLMechanism, SASLUsername: s.KafkaSASLUsername, SASLPassword: s.KafkaSASLPassword,
		SASLPasswordFile: s.KafkaSASLPasswordFile, SASLOAuthTokenFile: s.KafkaSASLOAuthTokenFile,
	}
}

// Opts validates the connection to brokers the flags describe and returns
// the franz-go options every Kafka client of the command gets: the seed
// brokers, TLS and SASL. What is allowed but unsafe (PLAIN without TLS) is
// logged as a warning.
func (s KafkaSecurity) Opts(log *slog.Logger, brokers []string) ([]kgo.Opt, error) {
	cfg := s.Config(brokers)
	opts, err := cfg.Opts()
	if err != nil {
		return nil, err
	}
	for _, w := range cfg.Warnings() {
		log.Warn(w)
	}
	return opts, nil
}

// Check connects to brokers once, as every command that talks to Kafka
// does before its work: a wrong password, token, certificate or TLS setting
// ends the command with one line naming the flag to fix, before it serves
// or changes anything (franz-go would otherwise retry it, or report it deep
// in another error). Brokers that cannot be reached at all only get a
// warning: the command goes on (ingest answers 503 until they are back).
func (s KafkaSecurity) Check(ctx context.Context, log *slog.Logger, brokers []string) error {
	err := s.Config(brokers).Check(ctx)
	if errors.Is(err, kafkaconn.ErrUnreachable) {
		log.Warn("kafka not reachable yet; going on", "error", err)
		return nil
	}
	return err
}

// Brokers returns the seed brokers of a --kafka-brokers list, blanks
// trimmed, or an error naming the flag when there are none.
func Brokers(list []string) ([]string, error) {
	var out []string
	for _, b := range list {
		if b = strings.TrimSpace(b); b != "" {
			out = append(out, b)
		}
	}
	if len(out) == 0 {
		return nil, errors.New("no Kafka brokers: set --kafka-brokers or PAYSTREAM_KAFKA_BROKERS")
	}
	return out, nil
}

// RequireDatabase fails, naming the flag, when no database URL is set.
func RequireDatabase(url string) error {
	if url == "" {
		return errors.New("no database: set --database-url or PAYSTREAM_DATABASE_URL")
	}
	return nil
}

// OpenPool connects to the database at url, as application app unless the
// URL sets application_name, with opts applied to the pool's config, and
// pings it (10 seconds at most). Errors never carry the password.
func OpenPool(ctx context.Context, url, app string, opts ...func(*pgxpool.Config)) (*pgxpool.Pool, error) {
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		return nil, fmt.Errorf("parse database URL: %w", err) // pgx redacts the password
	}
	if cfg.ConnConfig.RuntimeParams["application_name"] == "" {
		cfg.ConnConfig.RuntimeParams["application_name"] = app
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

// ExitError is an error that asks Run for a specific exit status.
type ExitError struct {
	Code int
	Err  error
}

func (e ExitError) Error() string { return e.Err.Error() }
func (e ExitError) Unwrap() error { return e.Err }

// ExitCode is the process's exit status.
func (e ExitError) ExitCode() int { return e.Code }

// IsTerminal reports whether f is a character device (a terminal).
func IsTerminal(f *os.File) bool {
	fi, err := f.Stat()
	return err == nil && fi.Mode()&os.ModeCharDevice != 0
}

// Run is a binary's main: it parses args into grammar (kong, named name,
// with options, usage on errors and compact help), then runs the command
// chosen with a context that SIGINT and SIGTERM cancel and with what env
// returns bound. It returns the exit status: 2 for a bad command line, an
// error's ExitCode when it has one, else 1 on error, 0. Errors go to stderr
// after "name: ".
func Run(args []string, name string, grammar any, env func(*kong.Context) any, options ...kong.Option) int {
	options = append([]kong.Option{kong.Name(name), kong.UsageOnError(), kong.ConfigureHelp(kong.HelpOptions{Compact: true})}, options...)
	parser, err := kong.New(grammar, options...)
	if err != nil {
		fmt.Fprintln(os.Stderr, name+":", err)
		return 2
	}
	kctx, err := parser.Parse(args)
	if err != nil {
		parser.Errorf("%s", err)
		return 2
	}
	e := env(kctx)
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	kctx.BindTo(ctx, (*context.Context)(nil))
	if err := kctx.Run(e); err != nil {
		fmt.Fprintln(os.Stderr, name+":", err)
		var coded interface{ ExitCode() int }
		if errors.As(err, &coded) {
			return coded.ExitCode()
		}
		return 1
	}
	return 0
}
