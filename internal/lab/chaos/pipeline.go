package chaos

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"log/slog"
	"net"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/paystream/paystream/sink"
)

// servers is where a scenario's pipeline runs: the shared stack or the
// private one.
type servers struct {
	databaseURL string
	brokers     []string
	private     *PrivateStack // nil on the shared stack
	newSchema   func() (url, schema string, err error)
}

// pipeline is one scenario's paystream: its own schema, topics, consumer
// group and processes, and the harness's views of their progress.
type pipeline struct {
	sc      Scenario
	srv     servers
	bin     string
	sources string // the sources file ingest and the processor read
	logDir  string
	log     *slog.Logger

	schema, url           string
	raw, state, dlq, ckpt string
	group                 string
	partitions            int
	ingestAddr            string
	ingest, sink          *proc
	processors            []*proc
	nextProcessor         int
	pgProxy, kafkaProxy   *proxy
	relayStop             context.CancelFunc // the in-process relay, when Kafka is proxied
	relayDone             chan error
	relayPool             *pgxpool.Pool
	pool                  *pgxpool.Pool // the harness's own, on the schema
	cl                    *kgo.Client
	adm                   *kadm.Client
	watch                 *stateWatcher
	processorURL          string
	mu                    sync.Mutex // processors
	tornDown              bool
	slot                  string
}

func randomSuffix() string {
	b := make([]byte, 4)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// setUp creates the schema and topics with `paystream migrate` and starts
// every component, returning once ingest is ready, the group owns every
// raw partition and the relay streams the slot. On error the pipeline
// must still be torn down.
func (p *pipeline) setUp(ctx context.Context) (err error) {
	id := randomSuffix()
	name := strings.ReplaceAll(p.sc.Name, "-", "_")
	if p.srv.newSchema != nil {
		if p.url, p.schema, err = p.srv.newSchema(); err != nil {
			return fmt.Errorf("create schema: %w", err)
		}
	} else {
		p.schema = "chaos_" + name + "_" + id
		p.url = withSearchPath(p.srv.databaseURL, p.schema)
		if err := createSchema(ctx, p.srv.databaseURL, p.schema); err != nil {
			return err
		}
	}
	prefix := "chaos-" + p.sc.Name + "-" + id
	p.raw, p.state, p.dlq, p.ckpt = prefix+"-raw", prefix+"-state", prefix+"-dlq", prefix+"-ckpt"
	p.group = prefix
	if p.pool, err = pgxpool.New(ctx, p.url); err != nil {
		return fmt.Errorf("connect to postgres: %w", err)
	}
	if p.slot, err = sink.Slot(ctx, p.pool); err != nil {
		return err
	}
	if p.cl, err = kgo.NewClient(kgo.SeedBrokers(p.srv.brokers...)); err != nil {
		return fmt.Errorf("kafka client: %w", err)
	}
	p.adm = kadm.NewClient(p.cl)

	migrate := exec.CommandContext(ctx, p.bin, append([]string{"migrate", "--database-url", p.url,
		"--partitions", strconv.Itoa(p.partitions), "--sources", p.sources,
		"--checkpoint-topic", p.ckpt}, p.common()...)...)
	migrate.Env = childEnv()
	if out, err := migrate.CombinedOutput(); err != nil {
		return fmt.Errorf("paystream migrate: %w\n%s", err, tail(string(out), 20))
	}

	p.processorURL = p.url
	if p.sc.ProxyPostgres {
		u, err := url.Parse(p.url)
		if err != nil {
			return fmt.Errorf("parse database URL: %w", err)
		}
		if p.pgProxy, err = newProxy("processor-postgres", u.Host); err != nil {
			return err
		}
		u.Host = p.pgProxy.addr()
		p.processorURL = u.String()
	}
	p.ingest = newProc("ingest", p.bin, p.logDir, append([]string{"ingest", "--sources", p.sources,
		"--http-addr", p.ingestAddr, "--metrics-addr", "127.0.0.1:0"}, p.common()...)...)
	if err := p.ingest.start(); err != nil {
		return err
	}
	for range max(p.sc.Processors, 1) {
		if _, err := p.addProcessor(); err != nil {
			return err
		}
	}
	if err := p.startSink(ctx); err != nil {
		return err
	}
	if p.watch, err = watchState(p.srv.brokers, p.state); err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	if err := p.waitIngestReady(ctx); err != nil {
		return err
	}
	if err := poll(ctx, 100*time.Millisecond, p.groupOwnsAll, p.processors...); err != nil {
		return fmt.Errorf("processor group %s: %w", p.group, err)
	}
	return poll(ctx, 100*time.Millisecond, p.sinkActive)
}

func createSchema(ctx context.Context, databaseURL, schema string) error {
	admin, err := pgx.Connect(ctx, databaseURL)
	if err != nil {
		return fmt.Errorf("connect to postgres: %w", err)
	}
	defer func() { _ = admin.Close(context.WithoutCancel(ctx)) }()
	if _, err := admin.Exec(ctx, "CREATE SCHEMA "+pgx.Identifier{schema}.Sanitize()); err != nil {
		return fmt.Errorf("create schema: %w", err)
	}
	return nil
}

// common are the flags every paystream command of the pipeline gets.
func (p *pipeline) common() []string {
	return []string{"--log-level", "warn", "--kafka-brokers", strings.Join(p.srv.brokers, ","),
		"--raw-topic", p.raw, "--state-topic", p.state, "--dlq-topic", p.dlq}
}

// addProcessor starts one more `paystream processor` in the group.
func (p *pipeline) addProcessor() (*proc, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.nextProcessor++
	// As docs/operations.md recommends: a static member id, stable across
	// restarts, so a restarted processor takes its partitions back at once
	// (it fences its killed predecessor) and the others are not rebalanced;
	// and a 6 s session (the broker's minimum), so a processor removed for
	// good gives its partitions up after 6 s rather than 45.
	name := fmt.Sprintf("processor-%d", p.nextProcessor)
	pr := newProc(name, p.bin, p.logDir, append([]string{"processor",
		"--database-url", p.processorURL, "--group", p.group, "--sources", p.sources,
		"--instance-id", name, "--session-timeout", "6s"}, p.common()...)...)
	if err := pr.start(); err != nil {
		return nil, err
	}
	p.processors = append(p.processors, pr)
	return pr, nil
}

// liveProcessors returns the processors running now.
func (p *pipeline) liveProcessors() []*proc {
	p.mu.Lock()
	defer p.mu.Unlock()
	var out []*proc
	for _, pr := range p.processors {
		if pr.alive() {
			out = append(out, pr)
		}
	}
	return out
}

// startSink starts the relay: `paystream sink` as a child process, or,
// when the scenario proxies the relay's Kafka connections, the same relay
// (package sink) inside the harness with franz-go's dialer pointed at the
// proxy (see proxy.kafkaDialer). Either way it reads the schema's slot
// directly, not through a proxy.
func (p *pipeline) startSink(ctx context.Context) error {
	if !p.sc.ProxyKafka {
		p.sink = newProc("sink", p.bin, p.logDir, append([]string{"sink", "--database-url", p.url,
			"--checkpoint-topic", p.ckpt, "--standby-retry", "200ms", "--heartbeat-interval", "1s"}, p.common()...)...)
		return p.sink.start()
	}
	var err error
	if p.kafkaProxy, err = newProxy("relay-kafka", p.srv.brokers[0]); err != nil {
		return err
	}
	if p.relayPool, err = pgxpool.New(ctx, p.url); err != nil {
		return fmt.Errorf("connect the relay to postgres: %w", err)
	}
	logf, err := os.Create(filepath.Join(p.logDir, "relay.log"))
	if err != nil {
		return err
	}
	relay, err := sink.New(p.relayPool, sink.Config{
		Brokers: p.srv.brokers, Topic: p.state, CheckpointTopic: p.ckpt,
		StandbyRetry: 200 * time.Millisecond, HeartbeatInterval: time.Second,
		KafkaOpts:  []kgo.Opt{kgo.Dialer(p.kafkaProxy.kafkaDialer())},
		Logger:     slog.New(slog.NewTextHandler(logf, &slog.HandlerOptions{Level: slog.LevelWarn})),
		Registerer: prometheus.NewRegistry(),
	})
	if err != nil {
		logf.Close()
		return fmt.Errorf("relay: %w", err)
	}
	rctx, cancel := context.WithCancel(context.Background())
	p.relayStop, p.relayDone = cancel, make(chan error, 1)
	go func() {
		err := relay.Run(rctx)
		logf.Close()
		p.relayDone <- err
	}()
	return nil
}

// tearDown stops everything and removes the schema, slot and topics
// (keep: the schema stays, for a look after a failure).
func (p *pipeline) tearDown(keep bool) {
	if p.tornDown {
		return
	}
	p.tornDown = true
	if p.watch != nil {
		p.watch.close()
	}
	if p.ingest != nil {
		p.ingest.stop()
	}
	for _, pr := range p.processors {
		pr.stop()
	}
	if p.sink != nil {
		p.sink.stop()
	}
	if p.relayStop != nil {
		p.relayStop()
		<-p.relayDone
		p.relayPool.Close()
	}
	for _, x := range []*proxy{p.pgProxy, p.kafkaProxy} {
		if x != nil {
			x.close()
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if p.pool != nil {
		// The slot keeps WAL for as long as it exists: drop it once its
		// relay is gone (the server may take a moment to notice).
		_ = poll(ctx, 200*time.Millisecond, func(ctx context.Context) error {
			_, err := p.pool.Exec(ctx, `SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE slot_name = $1`, p.slot)
			return err
		})
		_, _ = p.pool.Exec(ctx, "DROP PUBLICATION IF EXISTS "+pgx.Identifier{p.slot}.Sanitize())
		if !keep {
			_, _ = p.pool.Exec(ctx, "DROP SCHEMA IF EXISTS "+pgx.Identifier{p.schema}.Sanitize()+" CASCADE")
		}
		p.pool.Close()
	}
	if p.adm != nil {
		_, _ = p.adm.DeleteTopics(ctx, p.raw, p.state, p.dlq, p.ckpt)
		p.cl.Close()
	}
}

// freeAddr returns a loopback address nobody listens on right now.
func freeAddr() (string, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", fmt.Errorf("find a free port: %w", err)
	}
	defer ln.Close()
	return ln.Addr().String(), nil
}

// withSearchPath points a postgres:// URL at schema.
func withSearchPath(dsn, schema string) string {
	sep := "?"
	if strings.Contains(dsn, "?") {
		sep = "&"
	}
	return dsn + sep + "search_path=" + url.QueryEscape(schema)
}
