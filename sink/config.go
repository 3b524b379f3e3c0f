package sink

import (
	"cmp"
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
	cfg = cfg.withDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	m, err := newMetrics(cfg.Registerer)
	if err != nil {
		return nil, err
	}
	return &Relay{cfg: cfg, pool: pool, log: cfg.Logger, metrics: m}, nil
}

// withDefaults returns c with each field left at its zero value set to
// the default its comment states.
func (c Config) withDefaults() Config {
	c.Topic = cmp.Or(c.Topic, envelope.TopicState)
	c.CheckpointTopic = cmp.Or(c.CheckpointTopic, DefaultCheckpointTopic)
	c.MaxBatchEvents = cmp.Or(c.MaxBatchEvents, 5000)
	c.MaxBatchDelay = cmp.Or(c.MaxBatchDelay, 20*time.Millisecond)
	c.StatusInterval = cmp.Or(c.StatusInterval, 10*time.Second)
	c.HeartbeatInterval = cmp.Or(c.HeartbeatInterval, 10*time.Second)
	c.StandbyRetry = cmp.Or(c.StandbyRetry, time.Second)
	c.LostSlotRetry = cmp.Or(c.LostSlotRetry, 10*time.Second)
	c.TransactionTimeout = cmp.Or(c.TransactionTimeout, 30*time.Second)
	c.Logger = cmp.Or(c.Logger, slog.Default())
	c.Registerer = cmp.Or[prometheus.Registerer](c.Registerer, prometheus.NewRegistry())
	return c
}

// validate reports the first field of c (defaults applied) whose value
// cannot work, by name.
func (c *Config) validate() error {
	if len(c.Brokers) == 0 {
		return errors.New("sink config: Brokers is required")
	}
	positive := []struct {
		name string
		v    time.Duration
	}{
		{"MaxBatchDelay", c.MaxBatchDelay},
		{"StatusInterval", c.StatusInterval},
		{"HeartbeatInterval", c.HeartbeatInterval},
		{"StandbyRetry", c.StandbyRetry},
		{"LostSlotRetry", c.LostSlotRetry},
		{"TransactionTimeout", c.TransactionTimeout},
	}
	for _, d := range positive {
		if d.v < 0 {
			return fmt.Errorf("sink config: %s %s must be positive", d.name, d.v)
		}
	}
	if _, err := ParseFormat(string(c.StateFormat)); err != nil {
		return fmt.Errorf("sink config: StateFormat: %w", err)
	}
	switch {
	case len(c.Slot) > maxIdentifier:
		return fmt.Errorf("sink config: Slot %q is longer than %d bytes", c.Slot, maxIdentifier)
	case c.MaxBatchEvents < 0:
		return fmt.Errorf("sink config: MaxBatchEvents %d must be positive", c.MaxBatchEvents)
	case c.StateFormat == FormatAvro && c.SchemaRegistry == nil:
		return errors.New("sink config: SchemaRegistry is required with StateFormat avro")
	}
	return nil
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
