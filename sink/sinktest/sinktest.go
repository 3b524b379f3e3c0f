// Package sinktest runs the real sink relay inside a test, for the tests of
// what reads the topics it writes (the consumer examples), so they meet the
// relay's transactions and record layout rather than a copy of them.
package sinktest

import (
	"context"
	"log/slog"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/paystream/paystream/sink"
)

// StartRelay sets up the replication slot of pool's schema and runs a relay
// with cfg until the test ends; the test fails if the relay cannot start or
// Run returns an error. A nil cfg.Logger discards the relay's logs (rather
// than the default logger's), which would bury the test's own output.
func StartRelay(t testing.TB, pool *pgxpool.Pool, cfg sink.Config) {
	t.Helper()
	if _, err := sink.SetupSlot(t.Context(), pool); err != nil {
		t.Fatal(err)
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	relay, err := sink.New(pool, cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, stop := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- relay.Run(ctx) }()
	t.Cleanup(func() {
		stop()
		if err := <-done; err != nil {
			t.Errorf("relay: %v", err)
		}
	})
}
