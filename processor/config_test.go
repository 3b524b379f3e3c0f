package processor

import (
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
)

// TestNewNamesTheBadField: New refuses a Config that cannot work, once,
// with an error naming the field. (Before one validate step, a negative
// OffsetCopyInterval, MaxBufferedBatches, RefetchRetry or BatchMaxWait was
// accepted: the first makes Run panic in time.NewTicker, the second keeps
// every worker "full", the third spins the sweeper.)
func TestNewNamesTheBadField(t *testing.T) {
	t.Parallel()
	// New connects to nothing: a pool that would fail to connect will do.
	pool, err := pgxpool.New(t.Context(), "postgres://127.0.0.1:1/none")
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	for _, tc := range []struct {
		field string
		set   func(*Config)
	}{
		{"Brokers", func(c *Config) { c.Brokers = nil }},
		{"BatchMaxRecords", func(c *Config) { c.BatchMaxRecords = -1 }},
		{"BatchMaxWait", func(c *Config) { c.BatchMaxWait = -time.Millisecond }},
		{"Transactions", func(c *Config) { c.Transactions = -1 }},
		{"MaxBufferedBatches", func(c *Config) { c.MaxBufferedBatches = -1 }},
		{"OffsetCopyInterval", func(c *Config) { c.OffsetCopyInterval = -time.Second }},
		{"RetryBackoffMax", func(c *Config) { c.RetryBackoffMax = -time.Second }},
		{"DeferredWindow", func(c *Config) { c.DeferredWindow = -time.Hour }},
		{"RefetchRetry", func(c *Config) { c.RefetchRetry = -time.Second }},
		{"SessionTimeout", func(c *Config) { c.SessionTimeout = -time.Second }},
		{"DeliveryRetention", func(c *Config) { c.DeliveryRetention = time.Hour }},
		{"DedupRetention", func(c *Config) { c.DedupRetention = time.Hour }},
	} {
		cfg := Config{Brokers: []string{"127.0.0.1:1"}}
		tc.set(&cfg)
		_, err := New(pool, cfg)
		if err == nil || !strings.Contains(err.Error(), tc.field) {
			t.Errorf("%s out of range: New = %v, want an error naming %s", tc.field, err, tc.field)
		}
	}
	// Negative where the field's comment gives it a meaning.
	cfg := Config{Brokers: []string{"127.0.0.1:1"}, IdleInTransactionTimeout: -1, RetentionInterval: -1}
	if _, err := New(pool, cfg); err != nil {
		t.Errorf("negative IdleInTransactionTimeout and RetentionInterval (off): %v", err)
	}
}
