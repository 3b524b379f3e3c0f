package main

import (
	"context"
	"strings"
	"testing"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/paystream/paystream/internal/testenv"
	"github.com/paystream/paystream/processor"
)

// TestProcessorPoolSize: the processor's pool is sized from the raw topic's
// partitions (a worker and a sweeper connection each, plus three) unless
// the URL sets pool_max_conns. Before, it had pgx's default of
// max(4, CPUs) connections whatever the partition count, so a replica
// owning more than a few partitions queued its workers for connections.
func TestProcessorPoolSize(t *testing.T) {
	db := testenv.NewDB(t)
	brokers := testenv.Kafka(t)
	topic := testenv.Topic(t, "raw", 7)
	ctx := context.Background()

	seeds := []kgo.Opt{kgo.SeedBrokers(brokers...)}
	partitions, err := topicPartitions(ctx, seeds, topic)
	if err != nil {
		t.Fatal(err)
	}
	if partitions != 7 {
		t.Fatalf("topicPartitions = %d, want 7", partitions)
	}
	if _, err := topicPartitions(ctx, seeds, topic+"-missing"); err == nil {
		t.Error("topicPartitions of a missing topic succeeded")
	}

	for _, c := range []struct {
		url  string
		want int32
	}{
		{db.URL, 17},
		{db.URL + "&pool_max_conns=5", 5},
	} {
		pool, err := dbFlags{DatabaseURL: c.url}.sizedPool(ctx, processor.MaxConns(partitions))
		if err != nil {
			t.Fatal(err)
		}
		if got := pool.Config().MaxConns; got != c.want {
			t.Errorf("pool for %q: MaxConns = %d, want %d", strings.Split(c.url, "?")[1], got, c.want)
		}
		pool.Close()
	}
}
