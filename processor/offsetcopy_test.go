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
	db := testenv.NewDB(t)
	brokers := testenv.Kafka(t)
	topic := testenv.Topic(t, "raw", 3)
	group := testenv.Group(t)
	adm := admin(t, brokers)

	// 1. Drain, then idle: no further traffic, the group's lag must reach 0
	// on every partition from the periodic copy alone.
	if err := produceSync(brokers, paymentRecords(t, topic, 0, 60)...); err != nil {
		t.Fatal(err)
	}
	p1, _ := newTestProcessor(t, db.Pool, Config{Brokers: brokers, Topic: topic, Group: group, BatchMaxRecords: 25,
		OffsetCopyInterval: 200 * time.Millisecond})
	r1 := start(t, p1)
	testenv.WaitFor(t, 60*time.Second, func() error { return storedAtEnd(adm, db.Pool, group, topic) })
	drained := time.Now()
	testenv.WaitFor(t, 30*time.Second, func() error { return groupBehind(adm, group, topic) })
	t.Logf("drained: group lag 0 on every partition %s after the stored offsets reached the end", time.Since(drained).Round(time.Millisecond))

	// 2. Restart with nothing new, after the group's Kafka offsets were lost
	// (retention, a crash before any copy): the new owner copies the offsets
	// it claimed from Postgres. The periodic copy is off (1h) so only that
	// seeding can do it.
	r1.stop()
	deleteGroupOffsets(t, adm, group, topic)
	if err := groupBehind(adm, group, topic); err == nil {
		t.Fatal("group offsets still there after DeleteOffsets: the restart check would prove nothing")
	}
	p2, _ := newTestProcessor(t, db.Pool, Config{Brokers: brokers, Topic: topic, Group: group, BatchMaxRecords: 25,
		OffsetCopyInterval: time.Hour})
	r2 := start(t, p2)
	testenv.WaitFor(t, 30*time.Second, func() error { return groupBehind(adm, group, topic) })

	// 3. Clean shutdown right after a drain: the last copy happens before the
	// processor leaves the group (the periodic copy is still off).
	if err := produceSync(brokers, paymentRecords(t, topic, 60, 30)...); err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, 60*time.Second, func() error { return storedAtEnd(adm, db.Pool, group, topic) })
	r2.stop()
	if err := groupBehind(adm, group, topic); err != nil {
		t.Errorf("after a clean shutdown: %v", err)
	}
	checkEffects(t, db.Pool, 90)
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
