package testenv

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/testcontainers/testcontainers-go"
	tcpostgres "github.com/testcontainers/testcontainers-go/modules/postgres"
	"github.com/testcontainers/testcontainers-go/wait"
)

// Images of the containers started when the environment names no servers.
const (
	postgresImage = "postgres:16"
	kafkaImage    = "apache/kafka:4.1.1"
)

var (
	dockerOnce sync.Once
	dockerErr  error

	pgOnce sync.Once
	pgURL  string
	pgErr  error

	kafkaOnce    sync.Once
	kafkaBrokers []string
	kafkaErr     error

	startedMu sync.Mutex
	started   []testcontainers.Container
)

// dockerAvailable reports, once per binary, whether a Docker engine
// answers testcontainers' health check within a few seconds.
func dockerAvailable() error {
	dockerOnce.Do(func() {
		defer func() {
			// testcontainers panics on some broken setups.
			if r := recover(); r != nil {
				dockerErr = fmt.Errorf("no Docker engine answered: %v", r)
			}
		}()
		provider, err := testcontainers.ProviderDefault.GetProvider()
		if err != nil {
			dockerErr = fmt.Errorf("no Docker engine answered: %w", err)
			return
		}
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := provider.Health(ctx); err != nil { // Health closes provider
			dockerErr = fmt.Errorf("no Docker engine answered: %w", err)
		}
	})
	return dockerErr
}

// postgresContainer starts, once per binary, a Postgres container and
// returns its URL.
func postgresContainer() (string, error) {
	pgOnce.Do(func() {
		if pgErr = dockerAvailable(); pgErr != nil {
			return
		}
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
		defer cancel()
		ctr, err := tcpostgres.Run(ctx, postgresImage,
			tcpostgres.WithDatabase("paystream"),
			tcpostgres.WithUsername("paystream"),
			tcpostgres.WithPassword("paystream"),
			// The sink reads a logical replication slot; as in
			// docker-compose.yml and deploy/stack.sh.
			testcontainers.WithCmdArgs("-c", "wal_level=logical", "-c", "max_replication_slots=64",
				"-c", "max_wal_senders=64", "-c", "max_slot_wal_keep_size=2GB"),
			tcpostgres.BasicWaitStrategies(),
		)
		if ctr != nil {
			track(ctr)
		}
		if err != nil {
			pgErr = fmt.Errorf("the %s container did not start: %w", postgresImage, err)
			return
		}
		pgURL, pgErr = ctr.ConnectionString(ctx, "sslmode=disable")
	})
	return pgURL, pgErr
}

// kafkaContainer starts, once per binary, a single-node KRaft Kafka
// container and returns its seed broker.
//
// Kafka must advertise the address clients reach it at, the host's mapped
// port, which is known only once the container runs. So the container's
// command waits for a file that sets KAFKA_ADVERTISED_LISTENERS, which a
// post-start hook writes before waiting for the broker to come up.
func kafkaContainer() ([]string, error) {
	const (
		clientPort = "9092/tcp"
		envFile    = "/tmp/testenv-advertised.env"
	)
	kafkaOnce.Do(func() {
		if kafkaErr = dockerAvailable(); kafkaErr != nil {
			return
		}
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
		defer cancel()
		ctr, err := testcontainers.Run(ctx, kafkaImage,
			testcontainers.WithExposedPorts(clientPort),
			testcontainers.WithEnv(map[string]string{
				"CLUSTER_ID":                                     "cGF5c3RyZWFtdGVzdGVudg", // base64url of 16 bytes, as Kafka wants,
				"KAFKA_NODE_ID":                                  "1",
				"KAFKA_PROCESS_ROLES":                            "broker,controller",
				"KAFKA_LISTENERS":                                "PLAINTEXT://0.0.0.0:9092,BROKER://0.0.0.0:9093,CONTROLLER://0.0.0.0:9094",
				"KAFKA_LISTENER_SECURITY_PROTOCOL_MAP":           "PLAINTEXT:PLAINTEXT,BROKER:PLAINTEXT,CONTROLLER:PLAINTEXT",
				"KAFKA_INTER_BROKER_LISTENER_NAME":               "BROKER",
				"KAFKA_CONTROLLER_LISTENER_NAMES":                "CONTROLLER",
				"KAFKA_CONTROLLER_QUORUM_VOTERS":                 "1@localhost:9094",
				"KAFKA_OFFSETS_TOPIC_REPLICATION_FACTOR":         "1",
				"KAFKA_OFFSETS_TOPIC_NUM_PARTITIONS":             "1",
				"KAFKA_TRANSACTION_STATE_LOG_REPLICATION_FACTOR": "1",
				"KAFKA_TRANSACTION_STATE_LOG_MIN_ISR":            "1",
				"KAFKA_GROUP_INITIAL_REBALANCE_DELAY_MS":         "0",
			}),
			testcontainers.WithEntrypoint("sh", "-c"),
			testcontainers.WithCmd("while [ ! -f "+envFile+" ]; do sleep 0.1; done; . "+envFile+"; exec /etc/kafka/docker/run"),
			testcontainers.WithLifecycleHooks(testcontainers.ContainerLifecycleHooks{
				PostStarts: []testcontainers.ContainerHook{
					func(ctx context.Context, c testcontainers.Container) error {
						if err := wait.ForMappedPort(clientPort).WaitUntilReady(ctx, c); err != nil {
							return fmt.Errorf("wait for mapped port: %w", err)
						}
						endpoint, err := c.PortEndpoint(ctx, clientPort, "PLAINTEXT")
						if err != nil {
							return fmt.Errorf("client endpoint: %w", err)
						}
						info, err := c.Inspect(ctx)
						if err != nil {
							return fmt.Errorf("inspect: %w", err)
						}
						env := fmt.Sprintf("export KAFKA_ADVERTISED_LISTENERS='%s,BROKER://%s:9093'\n", endpoint, info.Config.Hostname)
						if err := c.CopyToContainer(ctx, []byte(env), envFile, 0o644); err != nil {
							return fmt.Errorf("write advertised listeners: %w", err)
						}
						return wait.ForLog("Kafka Server started").WithStartupTimeout(2*time.Minute).WaitUntilReady(ctx, c)
					},
				},
			}),
		)
		if ctr != nil {
			track(ctr)
		}
		if err != nil {
			kafkaErr = fmt.Errorf("the %s container did not start: %w", kafkaImage, err)
			return
		}
		endpoint, err := ctr.PortEndpoint(ctx, clientPort, "")
		if err != nil {
			kafkaErr = fmt.Errorf("the %s container's broker address: %w", kafkaImage, err)
			return
		}
		kafkaBrokers = []string{endpoint}
	})
	return kafkaBrokers, kafkaErr
}

// track remembers a container, even one that failed to start, for
// stopContainers.
func track(ctr testcontainers.Container) {
	startedMu.Lock()
	defer startedMu.Unlock()
	started = append(started, ctr)
}

// stopContainers terminates the containers this binary started.
func stopContainers() error {
	startedMu.Lock()
	defer startedMu.Unlock()
	var errs []error
	for _, c := range started {
		if err := testcontainers.TerminateContainer(c); err != nil {
			errs = append(errs, fmt.Errorf("terminate container: %w", err))
		}
	}
	started = nil
	return errors.Join(errs...)
}
