package main

import (
	"context"
	"fmt"
	"time"

	"github.com/paystream/paystream/ingest"
	"github.com/paystream/paystream/internal/envelope"
	"github.com/paystream/paystream/internal/provider/drivers"
	"github.com/paystream/paystream/internal/source"
	"github.com/paystream/paystream/processor"
	"github.com/paystream/paystream/sink"
)

type topicFlags struct {
	RawTopic   string `help:"Raw webhook topic." default:"${raw_topic}" env:"PAYSTREAM_RAW_TOPIC"`
	StateTopic string `help:"Normalized payment-state topic." default:"${state_topic}" env:"PAYSTREAM_STATE_TOPIC"`
	DLQTopic   string `help:"Dead-letter topic for authentic events that cannot be processed." default:"${dlq_topic}" env:"PAYSTREAM_DLQ_TOPIC"`
}

var topicVars = map[string]string{
	"raw_topic":   envelope.TopicRaw,
	"state_topic": envelope.TopicState,
	"dlq_topic":   envelope.TopicDLQ,
}

type ingestFlags struct {
	HTTPAddr       string        `help:"Address the webhook endpoint listens on." default:"127.0.0.1:8080" env:"PAYSTREAM_HTTP_ADDR"`
	Sources        string        `help:"Path of the sources file (YAML) listing the gateways allowed to post." env:"PAYSTREAM_SOURCES" type:"existingfile" placeholder:"FILE"`
	ProduceTimeout time.Duration `help:"How long a request waits for the broker's ack before answering 503." default:"5s" env:"PAYSTREAM_PRODUCE_TIMEOUT"`
}

type ingestCmd struct {
	kafkaFlags
	topicFlags
	ingestFlags
}

func (c *ingestCmd) Help() string {
	return `POST /webhooks/{source} answers 200 {"received":true} only after the broker acknowledged the
event (acks=all, idempotent producer); 401 when the signature is missing or wrong, 404 for an
unknown source, 413 over the body limit, 503 with Retry-After when the broker cannot take it.
Also serves GET /healthz, /readyz and /metrics.`
}

func (c *ingestCmd) Run(ctx context.Context, e *env) error {
	brokers, err := c.brokers()
	if err != nil {
		return err
	}
	sources, err := loadSources(c.Sources)
	if err != nil {
		return err
	}
	srv, err := newIngest(e, brokers, c.topicFlags, c.ingestFlags, sources)
	if err != nil {
		return err
	}
	return srv.Run(ctx)
}

func loadSources(path string) (map[string]*source.Source, error) {
	if path == "" {
		return nil, fmt.Errorf("no sources file: set --sources or PAYSTREAM_SOURCES (see deploy/sources.example.yaml)")
	}
	return source.Load(path, drivers.Factories())
}

func newIngest(e *env, brokers []string, t topicFlags, f ingestFlags, sources map[string]*source.Source) (*ingest.Server, error) {
	return ingest.New(ingest.Config{
		Addr:           f.HTTPAddr,
		Sources:        sources,
		Brokers:        brokers,
		Topic:          t.RawTopic,
		DLQTopic:       t.DLQTopic,
		ProduceTimeout: f.ProduceTimeout,
		Logger:         e.log.With("component", "ingest"),
		Registerer:     e.reg,
		Gatherer:       e.reg,
	})
}

type processorFlags struct {
	Group           string        `help:"Consumer group." default:"paystream-processor" env:"PAYSTREAM_GROUP"`
	BatchMaxRecords int           `help:"Most records applied in one transaction." default:"500" env:"PAYSTREAM_BATCH_MAX_RECORDS"`
	BatchMaxWait    time.Duration `help:"How long to wait to fill a batch." default:"20ms" env:"PAYSTREAM_BATCH_MAX_WAIT"`
	DeferredWindow  time.Duration `help:"How long an event may wait for its predecessor before it is overdue (refetched or surfaced for review)." default:"1h" env:"PAYSTREAM_DEFERRED_WINDOW"`
	SessionTimeout  time.Duration `help:"How long the group waits for a silent (crashed) member before reassigning its partitions." default:"45s" env:"PAYSTREAM_SESSION_TIMEOUT"`
}

type processorCmd struct {
	kafkaFlags
	dbFlags
	topicFlags
	metricsFlags
	processorFlags
	Sources string `help:"Sources file; the processor reads it only for the sources that refetch from their gateway's API (mercadopago, refetch: true)." env:"PAYSTREAM_SOURCES" type:"existingfile" placeholder:"FILE"`
}

func (c *processorCmd) Help() string {
	return `Each assigned partition gets one worker that applies its records in order, in batches; a batch is
one Postgres transaction holding the inbox rows, transitions, ledger postings, outbox events and the
partition's next offset. Scale by adding replicas, up to the raw topic's partition count.`
}

func (c *processorCmd) Run(ctx context.Context, e *env) error {
	brokers, err := c.brokers()
	if err != nil {
		return err
	}
	pool, err := c.pool(ctx)
	if err != nil {
		return err
	}
	defer pool.Close()
	if err := serveMetrics(ctx, e, c.MetricsAddr); err != nil {
		return err
	}
	var refetch map[string]*source.RefetchConfig
	if c.Sources != "" {
		sources, err := loadSources(c.Sources)
		if err != nil {
			return err
		}
		refetch = refetchConfigs(sources)
	}
	p, err := processor.New(pool, processor.Config{
		Refetch:         refetch,
		Brokers:         brokers,
		Topic:           c.RawTopic,
		Group:           c.Group,
		BatchMaxRecords: c.BatchMaxRecords,
		BatchMaxWait:    c.BatchMaxWait,
		SessionTimeout:  c.SessionTimeout,
		DeferredWindow:  c.DeferredWindow,
		Logger:          e.log.With("component", "processor"),
		Registerer:      e.reg,
	})
	if err != nil {
		return err
	}
	return p.Run(ctx)
}

type sinkCmd struct {
	kafkaFlags
	dbFlags
	topicFlags
	metricsFlags
}

func (c *sinkCmd) Help() string {
	return `One relay is active at a time (a Postgres advisory lock); extra replicas wait as standbys.
Events are produced keyed by payment with the header event-id = "{payment key}:{version}"; a crash
between the broker's ack and marking the row published re-sends it with the same event id.`
}

func (c *sinkCmd) Run(ctx context.Context, e *env) error {
	brokers, err := c.brokers()
	if err != nil {
		return err
	}
	pool, err := c.pool(ctx)
	if err != nil {
		return err
	}
	defer pool.Close()
	if err := serveMetrics(ctx, e, c.MetricsAddr); err != nil {
		return err
	}
	r, err := sink.New(pool, sink.Config{
		Brokers:    brokers,
		Topic:      c.StateTopic,
		Logger:     e.log.With("component", "sink"),
		Registerer: e.reg,
	})
	if err != nil {
		return err
	}
	return r.Run(ctx)
}

// refetchConfigs picks the sources that refetch from their gateway's API.
func refetchConfigs(sources map[string]*source.Source) map[string]*source.RefetchConfig {
	out := map[string]*source.RefetchConfig{}
	for name, s := range sources {
		if s.Refetch != nil {
			out[name] = s.Refetch
		}
	}
	return out
}
