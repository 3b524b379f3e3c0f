package sink_test

import (
	"context"
	"log/slog"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/paystream/paystream/internal/testenv"
	"github.com/paystream/paystream/sink"
)

// Environment of a child relay: the test binary runs itself with
// envChildRelay set to run one SlotRelay instead of the tests, so a test
// can SIGKILL a relay.
const (
	envChildRelay      = "PAYSTREAM_SINK_TEST_CHILD_RELAY" // the database URL (with search_path and application_name)
	envChildBrokers    = "PAYSTREAM_SINK_TEST_CHILD_BROKERS"
	envChildTopic      = "PAYSTREAM_SINK_TEST_CHILD_TOPIC"
	envChildCheckpoint = "PAYSTREAM_SINK_TEST_CHILD_CHECKPOINT_TOPIC"
)

func TestMain(m *testing.M) {
	if os.Getenv(envChildRelay) != "" {
		os.Exit(runChildRelay())
	}
	code := testenv.Wrap(m).Run()
	stopClusters()
	os.Exit(code)
}

// runChildRelay runs a SlotRelay configured by the environment until
// SIGTERM or SIGINT (a test's SIGKILL ends it harder).
func runChildRelay() int {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelInfo}))
	pool, err := pgxpool.New(ctx, os.Getenv(envChildRelay))
	if err != nil {
		log.Error("child relay: open pool", "error", err)
		return 1
	}
	defer pool.Close()
	r, err := sink.NewSlotRelay(pool, sink.SlotConfig{
		Brokers:           strings.Split(os.Getenv(envChildBrokers), ","),
		Topic:             os.Getenv(envChildTopic),
		CheckpointTopic:   os.Getenv(envChildCheckpoint),
		HeartbeatInterval: 100 * time.Millisecond,
		StandbyRetry:      50 * time.Millisecond,
		Logger:            log,
	})
	if err != nil {
		log.Error("child relay: new", "error", err)
		return 1
	}
	if err := r.Run(ctx); err != nil {
		log.Error("child relay: run", "error", err)
		return 1
	}
	return 0
}
