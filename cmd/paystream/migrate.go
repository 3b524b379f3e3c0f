package main

import (
	"context"
	"errors"
	"fmt"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/paystream/paystream/migrations"
)

type migrateCmd struct {
	dbFlags
	topicFlags
	KafkaBrokers      []string `help:"Kafka seed brokers; when set, the topics are created too." env:"PAYSTREAM_KAFKA_BROKERS" placeholder:"HOST:PORT"`
	Partitions        int32    `help:"Partitions of the raw and state topics when creating them." default:"12" env:"PAYSTREAM_PARTITIONS"`
	ReplicationFactor int16    `help:"Replication factor when creating topics (-1: broker default)." default:"-1" env:"PAYSTREAM_REPLICATION_FACTOR"`
}

func (c *migrateCmd) Help() string {
	return `Applies the SQL migrations embedded in this binary, in order, each once: safe to run again and
safe to run from two places at once (an advisory lock serializes them). With Kafka brokers
configured it also creates the raw, state and DLQ topics if they do not exist.`
}

func (c *migrateCmd) Run(ctx context.Context, e *env) error {
	pool, err := c.pool(ctx)
	if err != nil {
		return err
	}
	defer pool.Close()
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
	brokers, err := kafkaFlags{KafkaBrokers: c.KafkaBrokers}.brokers()
	if err != nil {
		return nil // topics are optional here
	}
	return ensureTopics(ctx, e, brokers, c.topicFlags, c.Partitions, c.ReplicationFactor)
}

// ensureTopics creates paystream's topics where missing.
func ensureTopics(ctx context.Context, e *env, brokers []string, t topicFlags, partitions int32, rf int16) error {
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...))
	if err != nil {
		return fmt.Errorf("kafka client: %w", err)
	}
	defer cl.Close()
	adm := kadm.NewClient(cl)
	for _, topic := range []string{t.RawTopic, t.StateTopic, t.DLQTopic} {
		n := partitions
		if topic == t.DLQTopic {
			n = 1
		}
		resp, err := adm.CreateTopic(ctx, n, rf, nil, topic)
		switch {
		case errors.Is(err, kerr.TopicAlreadyExists) || errors.Is(resp.Err, kerr.TopicAlreadyExists):
			continue
		case err != nil:
			return fmt.Errorf("create topic %s: %w", topic, err)
		case resp.Err != nil:
			return fmt.Errorf("create topic %s: %w", topic, resp.Err)
		}
		e.log.Info("topic created", "topic", topic, "partitions", n)
	}
	return nil
}
