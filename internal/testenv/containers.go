package testenv

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/moby/moby/api/types/container"
	"github.com/moby/moby/api/types/network"
	"github.com/testcontainers/testcontainers-go"
	tcpostgres "github.com/testcontainers/testcontainers-go/modules/postgres"
	"github.com/testcontainers/testcontainers-go/wait"
)

// Environment variables naming the images of the containers started when
// the environment names no servers, and their defaults, the public images
// docker-compose.yml uses. deploy/images.sh builds offline stand-ins
// (eval "$(deploy/images.sh env)" sets both).
const (
	EnvPostgresImage = "PAYSTREAM_TEST_POSTGRES_IMAGE"
	EnvKafkaImage    = "PAYSTREAM_TEST_KAFKA_IMAGE"

	DefaultPostgresImage = "postgres:16"
	DefaultKafkaImage    = "apache/kafka:4.1.1"
)

// containerLabel marks every container testenv starts, so leftovers of a
// killed test binary can be found: docker ps -aq --filter label=paystream.testenv.
const containerLabel = "paystream.testenv"

// hostOverrideEnv is testcontainers' setting for the address published
// ports are reached at. Unset, testenv sets it to loopback and publishes the
// containers' ports on loopback only: testcontainers would otherwise guess the
// default gateway when it finds itself in a container (/.dockerenv), and
// Docker would publish on every interface. Set it to reach a remote engine.
const hostOverrideEnv = "TESTCONTAINERS_HOST_OVERRIDE"

// loopback is the only address testenv publishes ports on and dials.
var loopback = netip.MustParseAddr("127.0.0.1")

// publishOnLoopback binds the container's ports to 127.0.0.1 unless the
// caller pointed testcontainers at another host.
func publishOnLoopback(ports ...string) testcontainers.CustomizeRequestOption {
	return testcontainers.WithHostConfigModifier(func(hc *container.HostConfig) {
		if os.Getenv(hostOverrideEnv) != loopback.String() {
			return
		}
		if hc.PortBindings == nil {
			hc.PortBindings = network.PortMap{}
		}
		for _, p := range ports {
			hc.PortBindings[network.MustParsePort(p)] = []network.PortBinding{{HostIP: loopback}}
		}
	})
}

// imageFromEnv returns the image named by the environment variable env, or
// def when it is unset or empty.
func imageFromEnv(env, def string) string {
	if v := strings.TrimSpace(os.Getenv(env)); v != "" {
		return v
	}
	return def
}

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
		if _, set := os.LookupEnv(hostOverrideEnv); !set {
			os.Setenv(hostOverrideEnv, loopback.String())
		}
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
		image := imageFromEnv(EnvPostgresImage, DefaultPostgresImage)
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
		defer cancel()
		ctr, err := tcpostgres.Run(ctx, image,
			testcontainers.WithLabels(map[string]string{containerLabel: "postgres"}),
			publishOnLoopback("5432/tcp"),
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
			pgErr = fmt.Errorf("the %s container did not start: %w", image, err)
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
		image := imageFromEnv(EnvKafkaImage, DefaultKafkaImage)
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
		defer cancel()
		ctr, err := testcontainers.Run(ctx, image,
			testcontainers.WithLabels(map[string]string{containerLabel: "kafka"}),
			testcontainers.WithExposedPorts(clientPort),
			publishOnLoopback(clientPort),
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
			kafkaErr = fmt.Errorf("the %s container did not start: %w", image, err)
			return
		}
		endpoint, err := ctr.PortEndpoint(ctx, clientPort, "")
		if err != nil {
			kafkaErr = fmt.Errorf("the %s container's broker address: %w", image, err)
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
