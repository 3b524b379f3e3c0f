package main

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/paystream/paystream/internal/testenv"
	"github.com/paystream/paystream/sink"
)

// TestMigrateTopicsAndProcessorPartitionCheck: `paystream migrate` with
// brokers creates the topics with their configs (read back with
// DescribeTopicConfigs; the sink's checkpoint topic compacted, with one
// partition), the sink's replication slot and publication, and records the
// raw topic's partition count; after
// partitions are added, `paystream processor` refuses to start, naming the
// two counts, until `migrate --accept-partition-change` re-records it.
func TestMigrateTopicsAndProcessorPartitionCheck(t *testing.T) {
	t.Parallel()
	brokers := strings.Join(testenv.Kafka(t), ",")
	db := testenv.NewDB(t)
	u := strings.TrimPrefix(testenv.Group(t), "g-")
	raw, state, dlq, ckpt := "raw-"+u, "state-"+u, "dlq-"+u, "ckpt-"+u
	cl, err := kgo.NewClient(kgo.SeedBrokers(testenv.Kafka(t)...))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	adm := kadm.NewClient(cl)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_, _ = adm.DeleteTopics(ctx, raw, state, dlq, ckpt)
	})
	slot, err := sink.Slot(t.Context(), db.Pool)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx := context.Background()
		_, _ = db.Pool.Exec(ctx, `SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE slot_name = $1`, slot)
		_, _ = db.Pool.Exec(ctx, "DROP PUBLICATION IF EXISTS "+pgx.Identifier{slot}.Sanitize())
	})
	env := []string{"PAYSTREAM_KAFKA_BROKERS=" + brokers, "PAYSTREAM_DATABASE_URL=" + db.URL,
		"PAYSTREAM_RAW_TOPIC=" + raw, "PAYSTREAM_STATE_TOPIC=" + state, "PAYSTREAM_DLQ_TOPIC=" + dlq,
		"PAYSTREAM_CHECKPOINT_TOPIC=" + ckpt}
	if r := paystream.Run(t, env, "migrate", "--partitions", "3", "--raw-retention", "240h"); r.Code != 0 {
		t.Fatalf("migrate: exit %d\n%s", r.Code, r.Stderr)
	}
	rcs, err := adm.DescribeTopicConfigs(t.Context(), raw, dlq, ckpt)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]map[string]string{
		raw:  {"retention.ms": "864000000", "max.message.bytes": "1463640", "compression.type": "producer"},
		dlq:  {"retention.ms": "2592000000", "max.message.bytes": "1463640", "compression.type": "producer"},
		ckpt: {"cleanup.policy": "compact", "compression.type": "producer"},
	}
	if len(rcs) != len(want) {
		t.Errorf("configs of %d topics, want %d", len(rcs), len(want))
	}
	for _, rc := range rcs {
		for _, c := range rc.Configs {
			if w, ok := want[rc.Name][c.Key]; ok && c.MaybeValue() != w {
				t.Errorf("%s: %s = %q, want %q", rc.Name, c.Key, c.MaybeValue(), w)
			}
		}
	}
	if tds, err := adm.ListTopics(t.Context(), ckpt); err != nil || len(tds[ckpt].Partitions) != 1 {
		t.Errorf("checkpoint topic %s: %d partitions (%v), want 1", ckpt, len(tds[ckpt].Partitions), err)
	}
	// The sink's slot and publication exist, so the processor's first
	// state event is kept for the sink.
	var slots, pubs int
	if err := db.Pool.QueryRow(t.Context(), `SELECT (SELECT count(*) FROM pg_replication_slots WHERE slot_name = $1 AND plugin = 'pgoutput'),
		(SELECT count(*) FROM pg_publication WHERE pubname = $1)`, slot).Scan(&slots, &pubs); err != nil || slots != 1 || pubs != 1 {
		t.Errorf("after migrate: %d slots and %d publications named %s (%v), want 1 each", slots, pubs, slot, err)
	}
	var recorded int
	if err := db.Pool.QueryRow(t.Context(), `SELECT partitions FROM topic_layout WHERE topic = $1`, raw).Scan(&recorded); err != nil || recorded != 3 {
		t.Fatalf("recorded partitions of %s: %d, %v; want 3", raw, recorded, err)
	}

	if _, err := adm.CreatePartitions(t.Context(), 1, raw); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 10*time.Second, func() bool {
		tds, err := adm.ListTopics(t.Context(), raw)
		return err == nil && len(tds[raw].Partitions) == 4
	}, "4 partitions in metadata")
	r := paystream.Run(t, env, "processor")
	if r.Code == 0 || !strings.Contains(r.Stderr, "has 4 partitions, 3 were recorded") {
		t.Fatalf("processor after adding a partition: exit %d, want a refusal naming both counts\n%s", r.Code, r.Stderr)
	}
	if r := paystream.Run(t, env, "migrate"); r.Code == 0 || !strings.Contains(r.Stderr, "partition count changed") {
		t.Fatalf("migrate without --accept-partition-change: exit %d, want a refusal\n%s", r.Code, r.Stderr)
	}
	if r := paystream.Run(t, env, "migrate", "--accept-partition-change"); r.Code != 0 {
		t.Fatalf("migrate --accept-partition-change: exit %d\n%s", r.Code, r.Stderr)
	}
	if err := db.Pool.QueryRow(t.Context(), `SELECT partitions FROM topic_layout WHERE topic = $1`, raw).Scan(&recorded); err != nil || recorded != 4 {
		t.Fatalf("re-recorded partitions: %d, %v; want 4", recorded, err)
	}
}
