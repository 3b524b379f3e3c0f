package main

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/paystream/paystream/ingest"
	"github.com/paystream/paystream/internal/devpg"
	"github.com/paystream/paystream/internal/provider/standardwebhooks"
	"github.com/paystream/paystream/internal/source"
	"github.com/paystream/paystream/migrations"
	"github.com/paystream/paystream/processor"
	"github.com/paystream/paystream/sink"
)

type devCmd struct {
	DataDir      string   `help:"Directory for the embedded Kafka's and the private Postgres's data (kept between runs)." default:".data" env:"PAYSTREAM_DATA_DIR"`
	KafkaBrokers []string `help:"Use these Kafka brokers instead of the embedded one (the TLS and SASL flags apply to them only)." env:"PAYSTREAM_KAFKA_BROKERS" placeholder:"HOST:PORT"`
	DatabaseURL  string   `help:"Use this Postgres instead of a private cluster under --data-dir." env:"PAYSTREAM_DATABASE_URL" placeholder:"postgres://..."`
	Partitions   int32    `help:"Partitions of the raw and state topics." default:"3" env:"PAYSTREAM_PARTITIONS"`
	kafkaSecurityFlags
	topicFlags
	checkpointFlags
	topicLayoutFlags
	ingestFlags
}

func (c *devCmd) Help() string {
	return `Everything in one process, for trying paystream and for local development: an embedded Kafka
(franz-go's kfake, data under --data-dir/kafka) unless PAYSTREAM_KAFKA_BROKERS is set, and a private
PostgreSQL cluster started from the machine's binaries (data under --data-dir/postgres, with
wal_level=logical for the sink's replication slot) unless PAYSTREAM_DATABASE_URL is set. It
migrates, sets up the slot, starts ingest, processor and sink, and prints the webhook
URL with a ready-to-paste example request. Inspect the result with
'paystream inspect payment --data-dir DIR --source SOURCE --id PAYMENT_ID'.`
}

// devState is what a running dev instance leaves in its data dir for
// `paystream inspect --data-dir`.
type devState struct {
	DatabaseURL  string   `json:"database_url"`
	KafkaBrokers []string `json:"kafka_brokers"`
}

func devStatePath(dataDir string) string { return filepath.Join(dataDir, "dev.json") }

func (c *devCmd) Run(ctx context.Context, e *env) error {
	sources, err := loadSources(c.Sources)
	if err != nil {
		return err
	}
	// Listen first: a taken port fails at once, before Kafka and Postgres
	// start, and the banner shows the address really listened on (a port
	// of 0 picks a free one).
	ln, err := net.Listen("tcp", c.HTTPAddr)
	if err != nil {
		return fmt.Errorf("listen for webhooks (--http-addr, PAYSTREAM_HTTP_ADDR): %w", err)
	}
	defer ln.Close()
	dataDir, err := filepath.Abs(c.DataDir)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(dataDir, 0o755); err != nil {
		return fmt.Errorf("create data dir: %w", err)
	}

	brokers, err := (kafkaFlags{KafkaBrokers: c.KafkaBrokers}).brokers()
	var kafkaOpts []kgo.Opt
	if err == nil {
		if kafkaOpts, err = c.opts(e.log, brokers); err != nil {
			return err
		}
		if err := c.checkKafka(ctx, e.log, brokers); err != nil {
			return err
		}
	} else {
		if c.kafkaSecurityFlags.set() {
			e.log.Warn("the embedded Kafka takes no TLS or SASL: the --kafka-tls* and --kafka-sasl-* settings apply only with --kafka-brokers; ignored")
		}
		kafkaDir := filepath.Join(dataDir, "kafka")
		// No seeded topics: they are created below like on a real
		// broker, with their configs (max.message.bytes above all: kfake,
		// like Kafka, refuses batches over 1,048,588 bytes by default).
		cluster, err := kfake.NewCluster(
			kfake.DataDir(kafkaDir),
			kfake.NumBrokers(1),
		)
		if err != nil {
			return fmt.Errorf("start embedded kafka: %w", err)
		}
		defer cluster.Close()
		brokers = cluster.ListenAddrs()
		kafkaOpts = []kgo.Opt{kgo.SeedBrokers(brokers...)}
		e.log.Info("embedded kafka (kfake) started", "brokers", strings.Join(brokers, ","), "data", kafkaDir)
	}

	dbURL := c.DatabaseURL
	if dbURL == "" {
		pgDir := filepath.Join(dataDir, "postgres")
		cluster, err := devpg.Start(ctx, devpg.Config{
			DataDir: pgDir, Settings: devPostgresSettings, Replication: true,
			Logger: e.log.With("component", "devpg"),
		})
		if err != nil {
			return fmt.Errorf("start private postgres: %w", err)
		}
		defer func() {
			stopCtx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			if err := cluster.Stop(stopCtx); err != nil {
				e.log.Warn("stop private postgres", "error", err)
			}
		}()
		dbURL = cluster.URL()
		e.log.Info("private postgres started", "data", pgDir)
	}

	pool, err := openPool(ctx, dbURL)
	if err != nil {
		return err
	}
	defer pool.Close()
	if err := sink.CheckWALLevel(ctx, pool); err != nil {
		if c.DatabaseURL == "" {
			return fmt.Errorf("%w (the private Postgres under %s was started by an older paystream: stop it with pg_ctl stop -D %s, then run dev again)",
				err, filepath.Join(dataDir, "postgres"), filepath.Join(dataDir, "postgres"))
		}
		return err
	}
	// As migrate: the slot before the schema.
	if _, err := sink.SetupSlot(ctx, pool); err != nil {
		return err
	}
	if _, err := migrations.Apply(ctx, pool); err != nil {
		return err
	}
	layout, err := topicLayout(c.topicFlags, c.CheckpointTopic, c.topicLayoutFlags, c.Partitions, -1, sources)
	if err != nil {
		return err
	}
	adm, closeAdm, err := newAdmin(kafkaOpts)
	if err != nil {
		return err
	}
	err = ensureTopics(ctx, e, adm, layout)
	closeAdm()
	if err != nil {
		return err
	}
	state, _ := json.MarshalIndent(devState{DatabaseURL: dbURL, KafkaBrokers: brokers}, "", "  ")
	if err := os.WriteFile(devStatePath(dataDir), state, 0o600); err != nil {
		return fmt.Errorf("write dev state: %w", err)
	}

	tp, stopTracing, err := startTracing(ctx, e.log, "paystream-dev")
	if err != nil {
		return err
	}
	defer stopTracing()
	srv, err := newIngest(e, brokers, kafkaOpts, c.topicFlags, c.ingestFlags, sources, func(cfg *ingest.Config) {
		cfg.TracerProvider = tp
		cfg.ServeMetrics = true // dev: everything on its one loopback address
	})
	if err != nil {
		return err
	}
	proc, err := processor.New(pool, processor.Config{
		Brokers: brokers, Topic: c.RawTopic, Group: "paystream-dev", Refetch: refetchConfigs(sources),
		Logger: e.log.With("component", "processor"), Registerer: e.reg, TracerProvider: tp,
		KafkaOpts: append(slices.Clip(kafkaOpts), kafkaMetrics(e.reg, "processor")),
	})
	if err != nil {
		return err
	}
	relay, err := sink.New(pool, sink.Config{
		Brokers: brokers, KafkaOpts: kafkaOpts, Topic: c.StateTopic, CheckpointTopic: c.CheckpointTopic, LatestTopic: c.LatestTopic,
		Logger: e.log.With("component", "sink"), Registerer: e.reg,
		// No per-client kprom here yet (paystream sink has it). It was
		// taken out while chasing a stall after a SIGKILL and restart on
		// kfake, which turned out to be kfake not recovering a transaction
		// the kill left open (see TestDevSinkExactlyOnceOnKfake), not kprom.
	})
	if err != nil {
		return err
	}

	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var wg sync.WaitGroup
	errs := make(chan error, 3)
	for name, run := range map[string]func(context.Context) error{
		"ingest":    func(ctx context.Context) error { return srv.Serve(ctx, ln) },
		"processor": proc.Run,
		"sink":      relay.Run,
	} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := run(ctx); err != nil {
				errs <- fmt.Errorf("%s: %w", name, err)
				cancel()
			}
		}()
	}
	printDevBanner(bannerAddr(ln.Addr()), sources, c.DataDir)
	wg.Wait()
	close(errs)
	return <-errs
}

// devPostgresSettings are the private cluster's server settings: logical
// decoding for the sink's replication slot.
var devPostgresSettings = map[string]string{
	"wal_level":              "logical",
	"max_replication_slots":  "10",
	"max_wal_senders":        "10",
	"max_slot_wal_keep_size": "1GB",
}

// bannerAddr is the host:port a local client reaches addr at: the loopback
// address when addr listens on every interface.
func bannerAddr(addr net.Addr) string {
	host, port, err := net.SplitHostPort(addr.String())
	if err != nil {
		return addr.String()
	}
	if ip := net.ParseIP(host); ip == nil || ip.IsUnspecified() {
		host = "127.0.0.1"
	}
	return net.JoinHostPort(host, port)
}

// printDevBanner prints the webhook URL and an example request signed for
// the first Standard Webhooks source, so a newcomer can paste it.
func printDevBanner(addr string, sources map[string]*source.Source, dataDir string) {
	fmt.Fprintf(os.Stderr, "\npaystream dev is running.\n")
	names := make([]string, 0, len(sources))
	for name := range sources {
		names = append(names, name)
	}
	sort.Strings(names)
	for _, name := range names {
		fmt.Fprintf(os.Stderr, "  webhook URL: http://%s/webhooks/%s  (driver %s)\n", addr, name, sources[name].DriverName)
	}
	for _, name := range names {
		src := sources[name]
		if src.DriverName != "standardwebhooks" || len(src.Secrets) == 0 {
			continue
		}
		now := time.Now()
		id := fmt.Sprintf("msg_%d", now.UnixNano())
		body := fmt.Sprintf(`{"type":"payment.paid","timestamp":%q,"data":{"payment_id":"pay_demo_1","amount":1050,"currency":"BRL"}}`,
			now.UTC().Format(time.RFC3339))
		sig, err := standardwebhooks.Sign(src.Secrets[0], id, now, []byte(body))
		if err != nil {
			break
		}
		fmt.Fprintf(os.Stderr, "\nExample (valid for 5 minutes):\n\n  curl -sS -X POST http://%s/webhooks/%s \\\n    -H 'content-type: application/json' \\\n    -H 'webhook-id: %s' -H 'webhook-timestamp: %d' \\\n    -H 'webhook-signature: %s' \\\n    -d '%s'\n",
			addr, name, id, now.Unix(), sig, body)
		// As invoked (./bin/paystream under `make run`), so it can be pasted too.
		fmt.Fprintf(os.Stderr, "\nThen: %s inspect payment --data-dir %s --source %s --id pay_demo_1\n\n", os.Args[0], dataDir, name)
		break
	}
}
