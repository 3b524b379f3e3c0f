package main

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/paystream/paystream/ingest"
	"github.com/paystream/paystream/internal/source"
	"github.com/paystream/paystream/internal/topics"
	"github.com/paystream/paystream/migrations"
	"github.com/paystream/paystream/sink"
)

type migrateCmd struct {
	dbFlags
	topicFlags
	checkpointFlags
	topicLayoutFlags
	KafkaBrokers          []string `help:"Kafka seed brokers; when set, the topics are created (or their drift reported and safe configs fixed) and the raw topic's partition count is recorded." env:"PAYSTREAM_KAFKA_BROKERS" placeholder:"HOST:PORT"`
	Partitions            int32    `help:"Partitions of the raw and state topics when creating them." default:"12" env:"PAYSTREAM_PARTITIONS"`
	ReplicationFactor     int16    `help:"Replication factor when creating topics (-1: broker default). At 3 or more, topics get min.insync.replicas=2." default:"-1" env:"PAYSTREAM_REPLICATION_FACTOR"`
	Sources               string   `help:"Sources file: the raw and DLQ topics' max.message.bytes is sized for its largest max_body_bytes (without it, for the default 1 MiB)." env:"PAYSTREAM_SOURCES" type:"existingfile" placeholder:"FILE"`
	AcceptPartitionChange bool     `help:"Record the raw topic's live partition count even though it differs from the recorded one (after following the README's procedure for changing partition counts)." env:"PAYSTREAM_ACCEPT_PARTITION_CHANGE"`
	kafkaSecurityFlags
}

// topicLayoutFlags configure the topics paystream migrate (and dev) create.
type topicLayoutFlags struct {
	DLQPartitions int32         `help:"Partitions of the DLQ topic when creating it (its records are keyed by source)." default:"3" env:"PAYSTREAM_DLQ_PARTITIONS"`
	RawRetention  time.Duration `help:"Retention of the raw topic (retention.ms): how long webhooks can be re-read." default:"168h" env:"PAYSTREAM_RAW_RETENTION"`
	DLQRetention  time.Duration `help:"Retention of the DLQ topic (retention.ms): how long an operator has to look at a dead-lettered webhook." default:"720h" env:"PAYSTREAM_DLQ_RETENTION"`
}

func (c *migrateCmd) Help() string {
	return `Applies the SQL migrations embedded in this binary, in order, each once: safe to run again and
safe to run from two places at once (an advisory lock serializes them). Before them it creates
the sink's logical replication slot and publication for the schema, so every state event committed
from then on is kept for the sink: the server must run with wal_level=logical (migrate stops before
changing anything, saying what to set, when it does not) and the role needs REPLICATION.
With Kafka brokers configured it also creates the raw, state, DLQ and sink checkpoint topics with
their configs (retention,
max.message.bytes sized for the largest webhook body, compression.type=producer,
min.insync.replicas=2 at 3 or more replicas), reports the drift of existing topics and fixes the
configs that are safe to change (never partition counts), and records the raw topic's partition
count, which the processor checks before it starts and while it runs.`
}

func (c *migrateCmd) Run(ctx context.Context, e *env) error {
	// Kafka's settings are checked before anything changes; without
	// brokers the topics are left alone.
	var kafkaOpts []kgo.Opt
	if brokers, err := (kafkaFlags{KafkaBrokers: c.KafkaBrokers}).brokers(); err == nil {
		if kafkaOpts, err = c.opts(e.log, brokers); err != nil {
			return err
		}
		if err := c.checkKafka(ctx, e.log, brokers); err != nil {
			return err
		}
	}
	pool, err := c.pool(ctx)
	if err != nil {
		return err
	}
	defer pool.Close()
	// The slot first (it checks wal_level before changing anything): it
	// keeps every state event committed after it exists, those a
	// migration writes included, and no processor may write one before.
	slot, err := sink.SetupSlot(ctx, pool)
	if err != nil {
		return err
	}
	e.log.Info("sink replication slot ready", "slot", slot)
	applied, err := migrations.Apply(ctx, pool)
	if err != nil {
		return err
	}
	if len(applied) == 0 {
		e.log.Info("database schema up to date")
	}
	for _, name := range applied {
		e.log.Info("migration applied", "migration", name)
	}
	if kafkaOpts == nil {
		return nil // topics are optional here
	}
	sources := map[string]*source.Source{"default": {MaxBodyBytes: source.DefaultMaxBodyBytes}}
	if c.Sources != "" {
		if sources, err = loadSources(c.Sources); err != nil {
			return err
		}
	}
	layout, err := topicLayout(c.topicFlags, c.CheckpointTopic, c.topicLayoutFlags, c.Partitions, c.ReplicationFactor, sources)
	if err != nil {
		return err
	}
	adm, closeAdm, err := newAdmin(kafkaOpts)
	if err != nil {
		return err
	}
	defer closeAdm()
	if err := ensureTopics(ctx, e, adm, layout); err != nil {
		return err
	}
	n, err := topics.RecordPartitions(ctx, adm, pool, c.RawTopic, c.AcceptPartitionChange)
	if err != nil {
		return err
	}
	e.log.Info("raw topic partition count recorded", "topic", c.RawTopic, "partitions", n)
	return nil
}

// topicLayout sizes paystream's topics for sources.
func topicLayout(t topicFlags, checkpoint string, f topicLayoutFlags, partitions int32, rf int16, sources map[string]*source.Source) (topics.Layout, error) {
	maxRecord, err := ingest.MaxRecordBytes(sources)
	if err != nil {
		return topics.Layout{}, err
	}
	return topics.Layout{
		Raw: t.RawTopic, State: t.StateTopic, DLQ: t.DLQTopic, Latest: t.LatestTopic, Checkpoint: checkpoint,
		Partitions: partitions, DLQPartitions: f.DLQPartitions, ReplicationFactor: rf,
		RawRetention: f.RawRetention, DLQRetention: f.DLQRetention,
		MaxMessageBytes: maxRecord,
	}, nil
}

// newAdmin is an admin client connecting with opts (seed brokers, TLS,
// SASL: kafkaFlags.kafka).
func newAdmin(opts []kgo.Opt) (*kadm.Client, func(), error) {
	cl, err := kgo.NewClient(opts...)
	if err != nil {
		return nil, nil, fmt.Errorf("kafka client: %w", err)
	}
	return kadm.NewClient(cl), cl.Close, nil
}

// ensureTopics creates paystream's topics where missing and logs the drift
// of existing ones, fixing what is safe to fix.
func ensureTopics(ctx context.Context, e *env, adm *kadm.Client, l topics.Layout) error {
	specs, err := l.Specs()
	if err != nil {
		return err
	}
	res, err := topics.Ensure(ctx, adm, specs)
	for _, name := range res.Created {
		e.log.Info("topic created", "topic", name)
	}
	for _, d := range res.Drifts {
		if d.Fixed {
			e.log.Info("topic config fixed", "topic", d.Topic, "config", d.Setting, "was", d.Have, "now", d.Want)
		} else {
			e.log.Warn("topic drift left as is", "topic", d.Topic, "setting", d.Setting, "have", d.Have, "want", d.Want)
		}
	}
	return err
}

// checkRawPartitions refuses to start a processor on a raw topic whose
// partition count changed since paystream migrate recorded it. A count
// never recorded only warns: deployments that migrate without brokers.
func checkRawPartitions(ctx context.Context, e *env, kafkaOpts []kgo.Opt, pool *pgxpool.Pool, topic string) error {
	adm, closeAdm, err := newAdmin(kafkaOpts)
	if err != nil {
		return err
	}
	defer closeAdm()
	err = topics.CheckPartitions(ctx, adm, pool, topic)
	if errors.Is(err, topics.ErrNotRecorded) {
		e.log.Warn("raw topic partition count not checked", "error", err)
		return nil
	}
	return err
}
