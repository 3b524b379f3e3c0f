package testenv

import (
	"context"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kgo"
)

// requireContainerRun skips t unless testenv starts its own servers, that
// is, unless both PAYSTREAM_TEST_* server variables are unset
// (`make test-containers`). With a server named, containers are never
// started and there is nothing of theirs to check.
func requireContainerRun(t *testing.T) {
	t.Helper()
	SkipIfShort(t)
	if strings.TrimSpace(os.Getenv(EnvDatabaseURL)) != "" || strings.TrimSpace(os.Getenv(EnvKafkaBrokers)) != "" {
		t.Skipf("servers come from %s / %s; this checks the containers started without them (make test-containers)",
			EnvDatabaseURL, EnvKafkaBrokers)
	}
}

func TestImageFromEnv(t *testing.T) {
	t.Setenv(EnvKafkaImage, "")
	if got := imageFromEnv(EnvKafkaImage, DefaultKafkaImage); got != DefaultKafkaImage {
		t.Errorf("unset: got %q, want the default %q", got, DefaultKafkaImage)
	}
	t.Setenv(EnvKafkaImage, " paystream-local/kafka:4.1.1 ")
	if got := imageFromEnv(EnvKafkaImage, DefaultKafkaImage); got != "paystream-local/kafka:4.1.1" {
		t.Errorf("set: got %q", got)
	}
}

// TestPostgresContainerServesTheSink checks what the sink needs of the
// Postgres container: wal_level=logical and a role that may create a
// logical replication slot.
func TestPostgresContainerServesTheSink(t *testing.T) {
	requireContainerRun(t)
	url, err := postgresContainer()
	if err != nil {
		t.Fatalf("postgres container (image %s): %v", imageFromEnv(EnvPostgresImage, DefaultPostgresImage), err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatalf("connect: %v", err)
	}
	defer conn.Close(ctx)

	var walLevel string
	var replication bool
	if err := conn.QueryRow(ctx, `SELECT current_setting('wal_level'),
		(SELECT rolreplication FROM pg_roles WHERE rolname = current_user)`).Scan(&walLevel, &replication); err != nil {
		t.Fatalf("settings: %v", err)
	}
	if walLevel != "logical" || !replication {
		t.Fatalf("wal_level=%s, role has REPLICATION=%v; the sink needs logical and true", walLevel, replication)
	}
	slot := "testenv_probe_" + randomSuffix(4)
	if _, err := conn.Exec(ctx, `SELECT pg_create_logical_replication_slot($1, 'pgoutput')`, slot); err != nil {
		t.Fatalf("create a logical replication slot: %v", err)
	}
	if _, err := conn.Exec(ctx, `SELECT pg_drop_replication_slot($1)`, slot); err != nil {
		t.Fatalf("drop the slot: %v", err)
	}
}

// TestKafkaContainerServesTransactions checks the Kafka container from the
// host as the pipeline uses it: through the advertised (mapped) address, a
// transactional producer's committed record is read back read_committed.
func TestKafkaContainerServesTransactions(t *testing.T) {
	requireContainerRun(t)
	brokers := Kafka(t) // starts the container: PAYSTREAM_TEST_KAFKA_BROKERS is unset
	topic := Topic(t, "containers", 1)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()

	producer, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.TransactionalID("testenv-"+randomSuffix(4)),
		kgo.DefaultProduceTopic(topic))
	if err != nil {
		t.Fatalf("producer: %v", err)
	}
	defer producer.Close()
	if err := producer.BeginTransaction(); err != nil {
		t.Fatalf("begin: %v", err)
	}
	if err := producer.ProduceSync(ctx, &kgo.Record{Value: []byte("committed")}).FirstErr(); err != nil {
		t.Fatalf("produce: %v", err)
	}
	if err := producer.EndTransaction(ctx, kgo.TryCommit); err != nil {
		t.Fatalf("commit: %v", err)
	}

	consumer, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.ConsumeTopics(topic),
		kgo.FetchIsolationLevel(kgo.ReadCommitted()), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	if err != nil {
		t.Fatalf("consumer: %v", err)
	}
	defer consumer.Close()
	fetches := consumer.PollRecords(ctx, 1)
	if err := fetches.Err(); err != nil {
		t.Fatalf("poll: %v", err)
	}
	if recs := fetches.Records(); len(recs) != 1 || string(recs[0].Value) != "committed" {
		t.Fatalf("read_committed got %d records, want the committed one", len(recs))
	}
}
