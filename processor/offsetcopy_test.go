package processor

import (
	"context"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"

	"github.com/paystream/paystream/internal/testenv"
)

// TestOffsetsCopiedToKafka checks the group's offsets in Kafka, as the
// broker reports them to lag tools and KEDA, at the three moments they used
// to be wrong: after the processor drained the topic and went idle, after a
// clean shutdown, and after a restart with nothing new to consume.
func TestOffsetsCopiedToKafka(t *testing.T) {
	f := setup(t, 3)

	// 1. Drain, then idle: no further traffic, the group's lag must reach 0
	// on every partition from the periodic copy alone.
	if err := testenv.TryProduce(f.brokers, paymentRecords(t, f.topic, 0, 60)...); err != nil {
		t.Fatal(err)
	}
	p1, _ := newTestProcessor(t, f.db.Pool, Config{Brokers: f.brokers, Topic: f.topic, Group: f.group, BatchMaxRecords: 25,
		OffsetCopyInterval: 200 * time.Millisecond})
	r1 := testenv.Start(t, "processor", p1.Run)
	testenv.WaitFor(t, 60*time.Second, func() error { return storedAtEnd(f.adm, f.db.Pool, f.group, f.topic) })
	drained := time.Now()
	testenv.WaitFor(t, 30*time.Second, func() error { return groupBehind(f.adm, f.group, f.topic) })
	t.Logf("drained: group lag 0 on every partition %s after the stored offsets reached the end", time.Since(drained).Round(time.Millisecond))

	// 2. Restart with nothing new, after the group's Kafka offsets were lost
	// (retention, a crash before any copy): the new owner copies the offsets
	// it claimed from Postgres. The periodic copy is off (1h) so only that
	// seeding can do it.
	r1.Stop()
	deleteGroupOffsets(t, f.adm, f.group, f.topic)
	if err := groupBehind(f.adm, f.group, f.topic); err == nil {
		t.Fatal("group offsets still there after DeleteOffsets: the restart check would prove nothing")
	}
	p2, _ := newTestProcessor(t, f.db.Pool, Config{Brokers: f.brokers, Topic: f.topic, Group: f.group, BatchMaxRecords: 25,
		OffsetCopyInterval: time.Hour})
	r2 := testenv.Start(t, "processor", p2.Run)
	testenv.WaitFor(t, 30*time.Second, func() error { return groupBehind(f.adm, f.group, f.topic) })

	// 3. Clean shutdown right after a drain: the last copy happens before the
	// processor leaves the group (the periodic copy is still off).
	if err := testenv.TryProduce(f.brokers, paymentRecords(t, f.topic, 60, 30)...); err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, 60*time.Second, func() error { return storedAtEnd(f.adm, f.db.Pool, f.group, f.topic) })
	r2.Stop()
	if err := groupBehind(f.adm, f.group, f.topic); err != nil {
		t.Errorf("after a clean shutdown: %v", err)
	}
	checkEffects(t, f.db.Pool, 90)
}

// deleteGroupOffsets deletes the (empty) group's committed offsets of topic.
func deleteGroupOffsets(t *testing.T, adm *kadm.Client, group, topic string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	resp, err := adm.DeleteOffsets(ctx, group, kadm.TopicsSet{topic: {0: {}, 1: {}, 2: {}}})
	if err == nil {
		err = resp.Error()
	}
	if err != nil {
		t.Fatalf("delete group offsets: %v", err)
	}
}
