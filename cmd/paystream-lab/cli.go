package main

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"encoding/hex"
	"log/slog"

	"github.com/alecthomas/kong"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/paystream/paystream/internal/cmdline"
	"github.com/paystream/paystream/internal/envelope"
)

// cli is the whole command line. Flags read the same PAYSTREAM_*
// environment variables as paystream's (internal/cmdline).
type cli struct {
	cmdline.Logging

	Simulate simulateCmd `cmd:"" help:"Simulate every gateway's payment histories against a running paystream and, with --verify, check the invariants I1–I10."`
	Loadgen  loadgenCmd  `cmd:"" help:"Send correctly signed webhooks to an ingest at a target rate and report throughput and latency."`
}

// env carries what every command gets.
type env struct {
	log *slog.Logger
}

// kafkaFlags are paystream's Kafka connection flags: brokers, TLS, SASL.
type kafkaFlags struct {
	KafkaBrokers []string `help:"Kafka seed brokers, comma-separated." env:"PAYSTREAM_KAFKA_BROKERS" placeholder:"HOST:PORT"`
	cmdline.KafkaSecurity
}

// brokers returns the seed brokers, or an error naming the flag when none.
func (k kafkaFlags) brokers() ([]string, error) { return cmdline.Brokers(k.KafkaBrokers) }

// connect validates the TLS and SASL settings, logs what is allowed but
// unsafe, connects once (unreachable brokers only warn, as in paystream) and
// returns the franz-go options of every client.
func (k kafkaFlags) connect(ctx context.Context, log *slog.Logger, brokers []string) ([]kgo.Opt, error) {
	opts, err := k.Opts(log, brokers)
	if err != nil {
		return nil, err
	}
	if err := k.Check(ctx, log, brokers); err != nil {
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
	if err := cmdline.RequireDatabase(d.DatabaseURL); err != nil {
		return nil, err
	}
	return cmdline.OpenPool(ctx, d.DatabaseURL, "paystream-lab")
}

// exitDrift is the exit status when verification found a violated
// invariant, as paystream reconcile's on drift.
const exitDrift = 3

var isTerminal = cmdline.IsTerminal

// newRunID returns a short id, and a number, that make this run's event
// and payment ids differ from other runs'.
func newRunID() (string, uint32) {
	var b [4]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:3]), binary.BigEndian.Uint32(b[:])
}

func run(args []string) int {
	var c cli
	return cmdline.Run(args, "paystream-lab", &c, func(*kong.Context) any { return &env{log: c.Logger()} },
		kong.Description("Tools that exercise a running paystream from outside: simulated gateways verified "+
			"against an oracle, and a load generator. Not part of the paystream binary."),
		kong.Vars{"raw_topic": envelope.TopicRaw, "state_topic": envelope.TopicState},
	)
}
