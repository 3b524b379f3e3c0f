package sink

import (
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/sr"

	"github.com/paystream/paystream/internal/envelope"
)

// Config configures a Relay.
type Config struct {
	// Brokers are the Kafka seed brokers. Required.
	Brokers []string
	// Topic is the normalized topic. Defaults to paystream.payments.state.v1.
	Topic string
	// LatestTopic, when set, is the compacted latest-state topic: every
	// Kafka transaction also writes there the newest state event of each
	// payment it carries, so the topic is exactly as consistent as the
	// state topic. Run creates it (compacted, with the state topic's
	// partitions) when missing. Defaults to "": none.
	LatestTopic string
	// CheckpointTopic holds, per relay identity, the WAL position the committed
	// Kafka transactions reached. Run creates it (compacted, one
	// partition) when missing. Defaults to DefaultCheckpointTopic.
	CheckpointTopic string
	// Slot is the logical replication slot, and publication, the relay
	// reads. Defaults to SlotName of the pool's current database and
	// schema, or the slot an earlier relay of this database named after the
	// schema alone, if there is one.
	Slot string
	// TransactionalID is the Kafka transactional id; a relay that takes
	// the slot over fences the producer of the one before with it.
	// Defaults to the relay's Identity.TransactionalID.
	TransactionalID string
	// Deployment names the deployment in the relay's Kafka identity (its
	// transactional id and checkpoint key), beside the database's: set it
	// when two environments share a Kafka cluster and their databases may
	// share a Postgres system identifier (one cloned from the other's
	// backup). Defaults to none.
	Deployment string
	// MaxBatchEvents caps the state events of one Kafka transaction; a
	// Postgres transaction is never split, so one with more events goes
	// alone. Defaults to 5000.
	MaxBatchEvents int
	// MaxBatchDelay is how long the relay gathers committed Postgres
	// transactions before publishing them in one Kafka transaction.
	// Defaults to 20ms.
	MaxBatchDelay time.Duration
	// StatusInterval is how often the relay reports its position to
	// Postgres when it has nothing new to report; keep it well below the
	// server's wal_sender_timeout. Defaults to 10s.
	StatusInterval time.Duration
	// HeartbeatInterval is how often the active relay emits a heartbeat
	// message, so the slot's position moves and WAL is recycled on a quiet
	// database, and refreshes paystream_sink_slot_lag_bytes. Defaults to 10s.
	HeartbeatInterval time.Duration
	// StandbyRetry is how often a standby tries to take the slot. Defaults
	// to 1s.
	StandbyRetry time.Duration
	// LostSlotRetry is how often a relay whose slot is lost (ErrSlotLost)
	// checks whether `paystream republish` recreated it. Defaults to 10s.
	LostSlotRetry time.Duration
	// TransactionTimeout is the Kafka transaction timeout, and bounds
	// flushing and committing one. Defaults to 30s.
	TransactionTimeout time.Duration
	// StateFormat is the encoding of the state values on Topic and
	// LatestTopic: FormatJSON, the processor's JSON as it is, or
	// FormatAvro, which registers schemas/payment-state.v1.avsc with
	// SchemaRegistry under each topic's "<topic>-value" subject (setting
	// its compatibility to BACKWARD) and writes the Confluent wire format.
	// Defaults to FormatJSON.
	StateFormat Format
	// SchemaRegistry is the Schema Registry client of FormatAvro.
	// Required with it.
	SchemaRegistry *sr.Client
	// KafkaOpts are extra franz-go options, given to every Kafka client.
	KafkaOpts []kgo.Opt
	// KafkaClientOpts, when set, returns more options for one Kafka client
	// of the relay, named by its role (ClientRelay, ClientCheckpoint,
	// ClientAdmin). It is called each time such a client is created: the
	// place for per-client hooks such as kprom metrics, which two clients
	// alive at once cannot share.
	KafkaClientOpts func(client string) []kgo.Opt
	// Logger defaults to slog.Default().
	Logger *slog.Logger
	// Registerer receives the relay's metrics. Defaults to a private registry.
	Registerer prometheus.Registerer
}

// New validates cfg and returns a Relay on pool's database
// and schema.
func New(pool *pgxpool.Pool, cfg Config) (*Relay, error) {
	if pool == nil {
		return nil, errors.New("sink: pool is required")
	}
	if len(cfg.Brokers) == 0 {
		return nil, errors.New("sink config: Brokers is required")
	}
	if cfg.Topic == "" {
		cfg.Topic = envelope.TopicState
	}
	if cfg.CheckpointTopic == "" {
		cfg.CheckpointTopic = DefaultCheckpointTopic
	}
	if len(cfg.Slot) > maxIdentifier {
		return nil, fmt.Errorf("sink config: Slot %q is longer than %d bytes", cfg.Slot, maxIdentifier)
	}
	if cfg.MaxBatchEvents == 0 {
		cfg.MaxBatchEvents = 5000
	}
	defaults := []struct {
		name string
		d    *time.Duration
		def  time.Duration
	}{
		{"MaxBatchDelay", &cfg.MaxBatchDelay, 20 * time.Millisecond},
		{"StatusInterval", &cfg.StatusInterval, 10 * time.Second},
		{"HeartbeatInterval", &cfg.HeartbeatInterval, 10 * time.Second},
		{"StandbyRetry", &cfg.StandbyRetry, time.Second},
		{"LostSlotRetry", &cfg.LostSlotRetry, 10 * time.Second},
		{"TransactionTimeout", &cfg.TransactionTimeout, 30 * time.Second},
	}
	for _, d := range defaults {
		if *d.d == 0 {
			*d.d = d.def
		}
		if *d.d < 0 {
			return nil, fmt.Errorf("sink config: %s %s must be positive", d.name, *d.d)
		}
	}
	if cfg.MaxBatchEvents < 0 {
		return nil, fmt.Errorf("sink config: MaxBatchEvents %d must be positive", cfg.MaxBatchEvents)
	}
	if _, err := ParseFormat(string(cfg.StateFormat)); err != nil {
		return nil, fmt.Errorf("sink config: StateFormat: %w", err)
	}
	if cfg.StateFormat == FormatAvro && cfg.SchemaRegistry == nil {
		return nil, errors.New("sink config: SchemaRegistry is required with StateFormat avro")
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.Registerer == nil {
		cfg.Registerer = prometheus.NewRegistry()
	}
	m, err := newMetrics(cfg.Registerer)
	if err != nil {
		return nil, err
	}
	return &Relay{cfg: cfg, pool: pool, log: cfg.Logger, metrics: m}, nil
}

// The roles of a Relay's Kafka clients, as Config.KafkaClientOpts names them.
// Clients of different roles can be alive at once; two of one role never are.
const (
	// ClientRelay is the active relay's transactional producer; it lives
	// as long as the relay holds the slot.
	ClientRelay = "relay"
	// ClientCheckpoint reads the committed checkpoint back when the relay
	// takes the slot, and is closed once it has.
	ClientCheckpoint = "checkpoint"
	// ClientAdmin creates the checkpoint topic when it is missing and lists
	// its offsets before the checkpoint is read; short-lived.
	ClientAdmin = "admin"
)

// kafkaOpts returns the options of a new Kafka client of role client:
// KafkaOpts, the seed brokers, KafkaClientOpts(client) and extra.
func (r *Relay) kafkaOpts(client string, extra ...kgo.Opt) []kgo.Opt {
	opts := append(append([]kgo.Opt{}, r.cfg.KafkaOpts...), kgo.SeedBrokers(r.cfg.Brokers...))
	if r.cfg.KafkaClientOpts != nil {
		opts = append(opts, r.cfg.KafkaClientOpts(client)...)
	}
	return append(opts, extra...)
}
