package main

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/sr"
	"github.com/twmb/franz-go/plugin/kprom"

	"github.com/paystream/paystream/ingest"
	"github.com/paystream/paystream/internal/envelope"
	"github.com/paystream/paystream/internal/provider/drivers"
	"github.com/paystream/paystream/internal/source"
	"github.com/paystream/paystream/internal/topics"
	"github.com/paystream/paystream/processor"
	"github.com/paystream/paystream/sink"
)

type topicFlags struct {
	RawTopic    string `help:"Raw webhook topic." default:"${raw_topic}" env:"PAYSTREAM_RAW_TOPIC"`
	StateTopic  string `help:"Normalized payment-state topic." default:"${state_topic}" env:"PAYSTREAM_STATE_TOPIC"`
	LatestTopic string `help:"Compacted topic holding each payment's newest state event, written in the sink's transactions, for bootstrapping new consumers (empty: none)." default:"${latest_topic}" env:"PAYSTREAM_LATEST_TOPIC"`
	DLQTopic    string `help:"Dead-letter topic for authentic events that cannot be processed." default:"${dlq_topic}" env:"PAYSTREAM_DLQ_TOPIC"`
}

var topicVars = map[string]string{
	"raw_topic":        envelope.TopicRaw,
	"state_topic":      envelope.TopicState,
	"latest_topic":     envelope.TopicLatest,
	"dlq_topic":        envelope.TopicDLQ,
	"checkpoint_topic": sink.DefaultCheckpointTopic,
}

type ingestFlags struct {
	HTTPAddr             string        `help:"Address the webhook endpoint listens on." default:"127.0.0.1:8080" env:"PAYSTREAM_HTTP_ADDR"`
	Sources              string        `help:"Path of the sources file (YAML) listing the gateways allowed to post." env:"PAYSTREAM_SOURCES" type:"existingfile" placeholder:"FILE"`
	ProduceTimeout       time.Duration `help:"How long a request waits for the broker's ack before answering 503." default:"5s" env:"PAYSTREAM_PRODUCE_TIMEOUT"`
	MaxInFlight          int           `help:"Most webhook requests whose body is in handled at once (verifying, waiting for the broker); more are answered 503 with Retry-After. Bodies still arriving do not count." default:"2048" env:"PAYSTREAM_MAX_IN_FLIGHT"`
	MaxBufferedBodyBytes int64         `help:"Most body bytes the requests may hold together beyond the first 8 KiB of each, counted as they arrive (not as announced); a request whose body would pass it is answered 503 with Retry-After." default:"268435456" env:"PAYSTREAM_MAX_BUFFERED_BODY_BYTES"`
	MaxConns             int           `help:"Most connections open at once on --http-addr; a new one past it closes the longest-idle one, or is answered 503 with Retry-After when every one is serving a request. An idle connection costs about 24 KiB." default:"10000" env:"PAYSTREAM_MAX_CONNS"`
	IdleTimeout          time.Duration `help:"How long a keep-alive connection may wait for its next request; keep it above the idle timeout of the load balancer in front." default:"90s" env:"PAYSTREAM_IDLE_TIMEOUT"`
	HTTPServer           string        `help:"HTTP server of the webhook endpoint: fasthttp, or net/http (Go's own: the same answers for about 1.3 times the CPU per webhook; see README)." enum:"fasthttp,net/http" default:"fasthttp" env:"PAYSTREAM_HTTP_SERVER"`
	ProduceLinger        time.Duration `help:"How long the producer waits for more webhooks of a partition before sending them to the broker in one request (longer: fewer requests, less broker CPU, slower answers; 0: each at once)." default:"2ms" env:"PAYSTREAM_PRODUCE_LINGER"`
}

type ingestCmd struct {
	kafkaFlags
	topicFlags
	ingestFlags
	MetricsAddr       string        `help:"Address serving /metrics, /healthz and /debug/pprof/, for Prometheus and operators only (empty: none)." default:"127.0.0.1:9090" env:"PAYSTREAM_METRICS_ADDR"`
	MetricsOnHTTPAddr bool          `help:"Also serve /metrics on --http-addr, next to the webhooks, where anyone who reaches them can read it." env:"PAYSTREAM_METRICS_ON_HTTP_ADDR"`
	ShutdownGrace     time.Duration `help:"On SIGTERM, /readyz answers 503 at once and webhooks are still served this long, so load balancers stop routing here before the listener closes." default:"5s" env:"PAYSTREAM_SHUTDOWN_GRACE"`
	ShutdownTimeout   time.Duration `help:"After the grace, how long requests in flight have to finish (each produced and answered, or answered 503) and the producer to flush (0: --produce-timeout + 5s)." default:"0s" env:"PAYSTREAM_SHUTDOWN_TIMEOUT"`
}

func (c *ingestCmd) Help() string {
	return `POST /webhooks/{source} answers 200 {"received":true} only after the broker acknowledged the
event (acks=all, idempotent producer); 401 when the signature is missing or wrong, 404 for an
unknown source, 413 over the body limit, 503 with Retry-After when the broker cannot take it.
503 also when --max-in-flight requests or --max-buffered-body-bytes are already in flight.
Also serves GET /healthz and /readyz; /metrics is on --metrics-addr (127.0.0.1:9090), not next
to the webhooks unless --metrics-on-http-addr. At most --max-conns connections are open: a new
one closes the longest-idle one; bodies count toward --max-buffered-body-bytes as they arrive.

On SIGTERM: /readyz answers 503 at once, webhooks are still served for --shutdown-grace, then the
listener closes, requests in flight finish and the producer flushes (within --shutdown-timeout).
Set the orchestrator's termination grace period above the sum (e.g. Kubernetes'
terminationGracePeriodSeconds above 5s + 10s).`
}

func (c *ingestCmd) Run(ctx context.Context, e *env) error {
	brokers, kafkaOpts, err := c.kafka(e.log)
	if err != nil {
		return err
	}
	sources, err := loadSources(c.Sources)
	if err != nil {
		return err
	}
	// A wrong password stops ingest before it listens: nothing answered.
	if err := c.checkKafka(ctx, e.log, brokers); err != nil {
		return err
	}
	if err := serveMetrics(ctx, e, c.MetricsAddr, nil); err != nil {
		return err
	}
	tp, stopTracing, err := startTracing(ctx, e.log, "paystream-ingest")
	if err != nil {
		return err
	}
	defer stopTracing()
	srv, err := newIngest(e, brokers, kafkaOpts, c.topicFlags, c.ingestFlags, sources, func(cfg *ingest.Config) {
		cfg.TracerProvider = tp
		cfg.ServeMetrics = c.MetricsOnHTTPAddr
		cfg.ShutdownGrace, cfg.ShutdownTimeout = c.ShutdownGrace, c.ShutdownTimeout
	})
	if err != nil {
		return err
	}
	warnSmallTopics(ctx, e, kafkaOpts, srv.MaxRecordBytes(), c.RawTopic, c.DLQTopic)
	return srv.Run(ctx)
}

func loadSources(path string) (map[string]*source.Source, error) {
	if path == "" {
		return nil, fmt.Errorf("no sources file: set --sources or PAYSTREAM_SOURCES (see deploy/sources.example.yaml)")
	}
	return source.Load(path, drivers.Factories())
}

// newIngest is ingest on brokers, its Kafka client with kafkaOpts (TLS,
// SASL: kafkaFlags.kafka).
func newIngest(e *env, brokers []string, kafkaOpts []kgo.Opt, t topicFlags, f ingestFlags, sources map[string]*source.Source, opts ...func(*ingest.Config)) (*ingest.Server, error) {
	cfg := ingest.Config{
		Addr:                 f.HTTPAddr,
		Sources:              sources,
		Brokers:              brokers,
		Topic:                t.RawTopic,
		DLQTopic:             t.DLQTopic,
		ProduceTimeout:       f.ProduceTimeout,
		MaxInFlight:          f.MaxInFlight,
		MaxBufferedBodyBytes: f.MaxBufferedBodyBytes,
		MaxConns:             f.MaxConns,
		IdleTimeout:          f.IdleTimeout,
		Linger:               f.ProduceLinger,
		HTTPServer:           f.HTTPServer,
		Logger:               e.log.With("component", "ingest"),
		Registerer:           e.reg,
		Gatherer:             e.reg,
		KafkaOpts:            append(slices.Clip(kafkaOpts), kafkaMetrics(e.reg, "ingest")),
	}
	for _, opt := range opts {
		opt(&cfg)
	}
	if cfg.Linger == 0 {
		cfg.Linger = -1 // ingest.Config: negative sends each record at once
	}
	return ingest.New(cfg)
}

// warnSmallTopics warns when a topic's max.message.bytes is below ingest's
// largest record: its largest webhooks would be answered 503 forever.
func warnSmallTopics(ctx context.Context, e *env, kafkaOpts []kgo.Opt, need int32, names ...string) {
	adm, closeAdm, err := newAdmin(kafkaOpts)
	if err != nil {
		return
	}
	defer closeAdm()
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	for _, topic := range names {
		have, err := topics.MaxMessageBytes(ctx, adm, topic)
		switch {
		case err != nil:
			e.log.Warn("could not check the topic's max.message.bytes", "topic", topic, "error", err)
		case have < need:
			e.log.Warn("topic's max.message.bytes is below ingest's largest record: the largest webhooks will be answered 503; run paystream migrate --sources",
				"topic", topic, "max_message_bytes", have, "need", need)
		}
	}
}

type processorFlags struct {
	Group           string        `help:"Consumer group." default:"paystream-processor" env:"PAYSTREAM_GROUP"`
	BatchMaxRecords int           `help:"Most records applied in one transaction." default:"500" env:"PAYSTREAM_BATCH_MAX_RECORDS"`
	BatchMaxWait    time.Duration `help:"How long a fetched record may wait for its batch to fill (longer: larger batches, less database CPU, more latency)." default:"20ms" env:"PAYSTREAM_BATCH_MAX_WAIT"`
	Transactions    int           `help:"Batch transactions run at once; batches of several partitions that are ready while all are busy share the next one (fewer: fuller transactions, less database CPU per delivery)." default:"1" env:"PAYSTREAM_TRANSACTIONS"`
	DeferredWindow  time.Duration `help:"How long an event may wait for its predecessor before it is overdue (refetched or surfaced for review)." default:"1h" env:"PAYSTREAM_DEFERRED_WINDOW"`
	SessionTimeout  time.Duration `help:"How long the group waits for a silent (crashed) member before reassigning its partitions." default:"45s" env:"PAYSTREAM_SESSION_TIMEOUT"`
	InstanceID      string        `help:"Static group member id, stable across restarts and unique per replica (e.g. the pod name): a restart within --session-timeout keeps the partitions without rebalancing the others. Empty: a dynamic member." env:"PAYSTREAM_INSTANCE_ID"`
	DBMaxConns      int32         `help:"Most Postgres connections (0: 2 per raw topic partition + 3, enough to own every partition; pool_max_conns in the URL wins over the default)." default:"0" env:"PAYSTREAM_DB_MAX_CONNS"`
}

// topicPartitions returns the number of partitions of topic, asking with
// kafkaOpts.
func topicPartitions(ctx context.Context, kafkaOpts []kgo.Opt, topic string) (int, error) {
	adm, closeAdm, err := newAdmin(kafkaOpts)
	if err != nil {
		return 0, err
	}
	defer closeAdm()
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	md, err := adm.Metadata(ctx, topic)
	if err != nil {
		return 0, fmt.Errorf("read partitions of %s: %w", topic, err)
	}
	td, ok := md.Topics[topic]
	if !ok || td.Err != nil {
		return 0, fmt.Errorf("read partitions of %s: %w (run paystream migrate)", topic, cmp.Or(td.Err, errors.New("no such topic")))
	}
	return len(td.Partitions), nil
}

type processorCmd struct {
	kafkaFlags
	dbFlags
	topicFlags
	metricsFlags
	processorFlags
	retentionFlags
	Sources string `help:"Sources file; the processor reads it only for the sources that refetch from their gateway's API (mercadopago, zoop, refetch: true)." env:"PAYSTREAM_SOURCES" type:"existingfile" placeholder:"FILE"`
}

// serviceKafka returns the Kafka settings of a service working on Kafka
// and Postgres (brokers and client options), once every setting it needs
// is there and the brokers answered (see checkKafka): every missing
// setting is reported before anything is dialed.
func serviceKafka(ctx context.Context, e *env, k kafkaFlags, d dbFlags) ([]string, []kgo.Opt, error) {
	brokers, opts, err := k.kafka(e.log)
	if err != nil {
		return nil, nil, err
	}
	if err := d.required(); err != nil {
		return nil, nil, err
	}
	if err := k.checkKafka(ctx, e.log, brokers); err != nil {
		return nil, nil, err
	}
	return brokers, opts, nil
}

func (c *processorCmd) Help() string {
	return `Each assigned partition gets one worker that applies its records in order, in batches; a batch is
one Postgres transaction holding the deliveries, transitions, ledger movements, state events (WAL
messages for the sink) and the
partition's next offset. Scale by adding replicas, up to the raw topic's partition count.`
}

func (c *processorCmd) Run(ctx context.Context, e *env) error {
	brokers, kafkaOpts, err := serviceKafka(ctx, e, c.kafkaFlags, c.dbFlags)
	if err != nil {
		return err
	}
	maxConns := c.DBMaxConns
	if maxConns == 0 {
		partitions, err := topicPartitions(ctx, kafkaOpts, c.RawTopic)
		if err != nil {
			return err
		}
		maxConns = processor.MaxConns(partitions)
	}
	pool, err := c.sizedPool(ctx, maxConns)
	if err != nil {
		return err
	}
	defer pool.Close()
	if err := serveMetrics(ctx, e, c.MetricsAddr, pool.Ping); err != nil {
		return err
	}
	if err := checkRawPartitions(ctx, e, kafkaOpts, pool, c.RawTopic); err != nil {
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
	tp, stopTracing, err := startTracing(ctx, e.log, "paystream-processor")
	if err != nil {
		return err
	}
	defer stopTracing()
	p, err := processor.New(pool, processor.Config{
		Refetch:           refetch,
		Brokers:           brokers,
		Topic:             c.RawTopic,
		Group:             c.Group,
		BatchMaxRecords:   c.BatchMaxRecords,
		BatchMaxWait:      c.BatchMaxWait,
		Transactions:      c.Transactions,
		SessionTimeout:    c.SessionTimeout,
		InstanceID:        c.InstanceID,
		DeferredWindow:    c.DeferredWindow,
		DeliveryRetention: c.DeliveryRetention,
		DedupRetention:    c.DedupRetention,
		Logger:            e.log.With("component", "processor"),
		Registerer:        e.reg,
		KafkaOpts:         append(slices.Clip(kafkaOpts), kafkaMetrics(e.reg, "processor")),
		TracerProvider:    tp,
	})
	if err != nil {
		return err
	}
	return p.Run(ctx)
}

// checkpointFlags name the sink's checkpoint topic, for the commands that
// create it (migrate, dev) and the one that writes it (sink).
type checkpointFlags struct {
	CheckpointTopic string `help:"Compacted topic where the sink records, in each Kafka transaction, the WAL position it reached." default:"${checkpoint_topic}" env:"PAYSTREAM_CHECKPOINT_TOPIC"`
}

// stateFormatFlags choose the encoding of the state values the sink (and
// republish, backfill) writes.
type stateFormatFlags struct {
	StateFormat            string `help:"Encoding of the state values on the state and latest-state topics: json (the processor's JSON, schemas/payment-state.v1.json) or avro (schemas/payment-state.v1.avsc in the Confluent wire format, registered under <topic>-value with compatibility BACKWARD; needs --schema-registry-url). Republish and backfill must use the sink's." enum:"json,avro" default:"json" env:"PAYSTREAM_STATE_FORMAT"`
	SchemaRegistryURL      string `help:"Schema Registry (Confluent API) of --state-format avro." env:"PAYSTREAM_SCHEMA_REGISTRY_URL" placeholder:"URL"`
	SchemaRegistryUser     string `help:"HTTP basic auth user for the Schema Registry." env:"PAYSTREAM_SCHEMA_REGISTRY_USER" placeholder:"USER"`
	SchemaRegistryPassword string `help:"HTTP basic auth password for the Schema Registry (prefer the environment variable)." env:"PAYSTREAM_SCHEMA_REGISTRY_PASSWORD" placeholder:"PASSWORD"`
}

// stateFormat returns the format and, for avro, the registry client.
func (f stateFormatFlags) stateFormat() (sink.Format, *sr.Client, error) {
	format, err := sink.ParseFormat(f.StateFormat)
	if err != nil || format != sink.FormatAvro {
		return format, nil, err
	}
	if f.SchemaRegistryURL == "" {
		return "", nil, errors.New("--state-format avro needs --schema-registry-url")
	}
	opts := []sr.ClientOpt{sr.URLs(f.SchemaRegistryURL), sr.UserAgent("paystream")}
	if f.SchemaRegistryUser != "" {
		opts = append(opts, sr.BasicAuth(f.SchemaRegistryUser, f.SchemaRegistryPassword))
	}
	cl, err := sr.NewClient(opts...)
	if err != nil {
		return "", nil, fmt.Errorf("schema registry client: %w", err)
	}
	return format, cl, nil
}

type sinkFlags struct {
	stateFormatFlags
	HeartbeatInterval time.Duration `help:"How often the active relay writes a small heartbeat message into the WAL, so the slot's position moves (and Postgres recycles WAL) on a quiet database; it also refreshes paystream_sink_slot_lag_bytes." default:"10s" env:"PAYSTREAM_SINK_HEARTBEAT_INTERVAL"`
	StandbyRetry      time.Duration `help:"How often a standby replica tries to take the replication slot: the longest it waits after the active relay is gone." default:"1s" env:"PAYSTREAM_SINK_STANDBY_RETRY"`
	Deployment        string        `help:"Name of this deployment, part of the relay's Kafka transactional id and checkpoint key. Set it when two environments share a Kafka cluster and their databases may share a Postgres system identifier (a database cloned from another's backup)." env:"PAYSTREAM_DEPLOYMENT" placeholder:"NAME"`
}

type sinkCmd struct {
	kafkaFlags
	dbFlags
	topicFlags
	checkpointFlags
	sinkFlags
	metricsFlags
}

func (c *sinkCmd) Help() string {
	return `Relays the state events the processor writes into Postgres's WAL to the state topic, exactly
once for consumers that read with isolation.level=read_committed: each event id
"{payment key}:{version}" once, each payment's events in order on one partition (key = payment),
nothing from a rolled-back transaction. (A read_uncommitted consumer may also see records of
aborted Kafka transactions.)

The relay reads a logical replication slot (one per schema, created by paystream migrate) and
publishes whole Postgres transactions, in commit order, in one Kafka transaction together with a
checkpoint on --checkpoint-topic; it confirms the slot only after the Kafka commit, so no crash
repeats an event for those consumers. Only one connection can stream a slot: that replica is the active
relay (paystream_sink_active 1); extra replicas are standbys that retry the slot every
--standby-retry and take over, fencing the previous relay's Kafka producer.

Needs wal_level=logical, max_replication_slots and max_wal_senders on the server, and a role
with REPLICATION. While no relay runs, Postgres keeps the WAL since the slot's position, up to
max_slot_wal_keep_size (watch paystream_sink_slot_lag_bytes and paystream_sink_slot_lag_seconds).`
}

func (c *sinkCmd) Run(ctx context.Context, e *env) error {
	brokers, kafkaOpts, err := serviceKafka(ctx, e, c.kafkaFlags, c.dbFlags)
	if err != nil {
		return err
	}
	pool, err := c.pool(ctx)
	if err != nil {
		return err
	}
	defer pool.Close()
	if err := serveMetrics(ctx, e, c.MetricsAddr, pool.Ping); err != nil {
		return err
	}
	format, registry, err := c.stateFormat()
	if err != nil {
		return err
	}
	r, err := sink.New(pool, sink.Config{
		Brokers:           brokers,
		KafkaOpts:         kafkaOpts,
		StateFormat:       format,
		SchemaRegistry:    registry,
		Topic:             c.StateTopic,
		CheckpointTopic:   c.CheckpointTopic,
		LatestTopic:       c.LatestTopic,
		HeartbeatInterval: c.HeartbeatInterval,
		StandbyRetry:      c.StandbyRetry,
		Deployment:        c.Deployment,
		Logger:            e.log.With("component", "sink"),
		Registerer:        e.reg,
		KafkaClientOpts:   sinkKafkaMetrics(e.reg),
	})
	if err != nil {
		return err
	}
	return r.Run(ctx)
}

// sinkKafkaMetrics gives each Kafka client of the sink its own franz-go
// metrics (kprom), as paystream_sink_kafka_* labelled client="relay",
// "checkpoint" or "admin" (sink.ClientRelay ...): the relay's clients are
// alive at once, and two of them registering the same names and labels
// would panic. A client's series go when it is closed: an active relay
// shows its producer's (client="relay"), a standby none.
func sinkKafkaMetrics(reg prometheus.Registerer) func(client string) []kgo.Opt {
	return func(client string) []kgo.Opt {
		return []kgo.Opt{kgo.WithHooks(kprom.NewMetrics("paystream", kprom.Registerer(reg),
			kprom.Subsystem("sink_kafka"), kprom.WithStaticLabel(prometheus.Labels{"client": client})))}
	}
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
