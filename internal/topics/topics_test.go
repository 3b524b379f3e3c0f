package topics_test

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"

	"github.com/paystream/paystream/internal/testenv"
	"github.com/paystream/paystream/internal/topics"
)

func TestMain(m *testing.M) { testenv.Main(m) }

// layout returns a Layout of fresh topic names, deleted when the test ends.
func layout(t *testing.T, adm *kadm.Client) topics.Layout {
	t.Helper()
	g := strings.TrimPrefix(testenv.Group(t), "g-") // unique per test
	l := topics.Layout{Raw: "raw-" + g, State: "state-" + g, DLQ: "dlq-" + g, Checkpoint: "ckpt-" + g, Partitions: 3, MaxMessageBytes: 1_463_640}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if _, err := adm.DeleteTopics(ctx, l.Raw, l.State, l.DLQ, l.Checkpoint); err != nil {
			t.Errorf("delete topics: %v", err)
		}
	})
	return l
}

func ensure(t *testing.T, adm *kadm.Client, l topics.Layout) topics.Result {
	t.Helper()
	specs, err := l.Specs()
	if err != nil {
		t.Fatal(err)
	}
	res, err := topics.Ensure(t.Context(), adm, specs)
	if err != nil {
		t.Fatal(err)
	}
	return res
}

// configs reads a topic's configs back from the broker.
func configs(t *testing.T, adm *kadm.Client, topic string) map[string]string {
	t.Helper()
	rcs, err := adm.DescribeTopicConfigs(t.Context(), topic)
	if err != nil {
		t.Fatal(err)
	}
	rc, err := rcs.On(topic, nil)
	if err != nil || rc.Err != nil {
		t.Fatalf("configs of %s: %v %v", topic, err, rc.Err)
	}
	out := map[string]string{}
	for _, c := range rc.Configs {
		out[c.Key] = c.MaybeValue()
	}
	return out
}

func partitions(t *testing.T, adm *kadm.Client, topic string) int {
	t.Helper()
	n, err := topics.Partitions(t.Context(), adm, topic)
	if err != nil {
		t.Fatal(err)
	}
	return int(n)
}

// TestEnsureCreatesTopicsWithConfigs: Ensure creates the four topics
// (the sink's checkpoint topic compacted, with one partition) with their
// partitions and configs, as DescribeTopicConfigs reads them
// back; run again, it finds nothing to do.
func TestEnsureCreatesTopicsWithConfigs(t *testing.T) {
	t.Parallel()
	adm := testenv.Admin(t, testenv.Kafka(t))
	l := layout(t, adm)
	l.RawRetention = 10 * 24 * time.Hour
	res := ensure(t, adm, l)
	if len(res.Created) != 4 || len(res.Drifts) != 0 {
		t.Fatalf("first Ensure: %+v, want 4 topics created and no drift", res)
	}
	for _, c := range []struct {
		topic      string
		partitions int
		want       map[string]string
	}{
		{l.Raw, 3, map[string]string{"retention.ms": "864000000", "max.message.bytes": "1463640", "compression.type": "producer"}},
		{l.State, 3, map[string]string{"compression.type": "producer"}},
		{l.DLQ, topics.DefaultDLQPartitions, map[string]string{"retention.ms": strconv.FormatInt(topics.DefaultDLQRetention.Milliseconds(), 10), "max.message.bytes": "1463640", "compression.type": "producer"}},
		{l.Checkpoint, 1, map[string]string{"cleanup.policy": "compact", "compression.type": "producer"}},
	} {
		if n := partitions(t, adm, c.topic); n != c.partitions {
			t.Errorf("%s: %d partitions, want %d", c.topic, n, c.partitions)
		}
		have := configs(t, adm, c.topic)
		for k, v := range c.want {
			if have[k] != v {
				t.Errorf("%s: %s = %q, want %q", c.topic, k, have[k], v)
			}
		}
	}
	if res := ensure(t, adm, l); len(res.Created) != 0 || len(res.Drifts) != 0 {
		t.Errorf("second Ensure: %+v, want nothing to do", res)
	}
}

// TestEnsureReportsAndFixesDrift: on existing topics, Ensure raises a
// too-small max.message.bytes and a too-short retention, keeps a longer
// retention, compacts the checkpoint topic, and reports a partition count it
// never changes.
func TestEnsureReportsAndFixesDrift(t *testing.T) {
	t.Parallel()
	adm := testenv.Admin(t, testenv.Kafka(t))
	l := layout(t, adm)
	ensure(t, adm, l)
	set := func(topic, key, value string) {
		t.Helper()
		resps, err := adm.AlterTopicConfigs(t.Context(), []kadm.AlterConfig{{Op: kadm.SetConfig, Name: key, Value: &value}}, topic)
		if err == nil {
			_, err = resps.On(topic, nil)
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	set(l.Raw, "max.message.bytes", "1048588")
	set(l.Raw, "retention.ms", "3600000")
	set(l.DLQ, "retention.ms", "-1") // forever: longer than wanted, kept
	set(l.Checkpoint, "cleanup.policy", "delete")
	if _, err := adm.CreatePartitions(t.Context(), 2, l.Raw); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 10*time.Second, func() bool { return partitions(t, adm, l.Raw) == 5 }, "5 partitions in metadata")
	res := ensure(t, adm, l)
	got := map[string]topics.Drift{}
	for _, d := range res.Drifts {
		t.Log(d)
		got[d.Topic+" "+d.Setting] = d
	}
	for _, want := range []topics.Drift{
		{Topic: l.Raw, Setting: "max.message.bytes", Have: "1048588", Want: "1463640", Fixed: true},
		{Topic: l.Raw, Setting: "retention.ms", Have: "3600000", Want: "604800000", Fixed: true},
		{Topic: l.DLQ, Setting: "retention.ms", Have: "-1", Want: "2592000000", Fixed: false},
		{Topic: l.Raw, Setting: "partitions", Have: "5", Want: "3", Fixed: false},
		{Topic: l.Checkpoint, Setting: "cleanup.policy", Have: "delete", Want: "compact", Fixed: true},
	} {
		if d := got[want.Topic+" "+want.Setting]; d != want {
			t.Errorf("drift %+v, want %+v", d, want)
		}
	}
	if len(res.Drifts) != 5 {
		t.Errorf("%d drifts, want 5", len(res.Drifts))
	}
	// The controller has committed Ensure's changes when it returns; a
	// broker's answer to DescribeConfigs can lag them by a moment (seen
	// once under make test's load), so the read-back waits for them.
	testenv.WaitFor(t, 10*time.Second, func() error {
		if have := configs(t, adm, l.Checkpoint); have["cleanup.policy"] != "compact" {
			return fmt.Errorf("checkpoint topic's cleanup.policy after Ensure = %q, want compact", have["cleanup.policy"])
		}
		have := configs(t, adm, l.Raw)
		if have["max.message.bytes"] != "1463640" || have["retention.ms"] != "604800000" {
			return fmt.Errorf("raw configs after Ensure: max.message.bytes %s, retention.ms %s", have["max.message.bytes"], have["retention.ms"])
		}
		return nil
	})
	if n := partitions(t, adm, l.Raw); n != 5 {
		t.Errorf("raw has %d partitions after Ensure, want the 5 it had", n)
	}
}

// TestCheckPartitions: the processor's start check passes on the count
// migrate recorded, refuses once partitions are added, and passes again
// once migrate re-records it with the operator's acceptance.
func TestCheckPartitions(t *testing.T) {
	t.Parallel()
	adm := testenv.Admin(t, testenv.Kafka(t))
	db := testenv.NewDB(t)
	raw := testenv.Topic(t, "raw", 3)
	ctx := t.Context()
	if err := topics.CheckPartitions(ctx, adm, db.Pool, raw); !errors.Is(err, topics.ErrNotRecorded) {
		t.Fatalf("CheckPartitions before any record: %v, want ErrNotRecorded", err)
	}
	if n, err := topics.RecordPartitions(ctx, adm, db.Pool, raw, false); err != nil || n != 3 {
		t.Fatalf("RecordPartitions = %d, %v; want 3", n, err)
	}
	if err := topics.CheckPartitions(ctx, adm, db.Pool, raw); err != nil {
		t.Fatalf("CheckPartitions on the recorded count: %v", err)
	}
	if _, err := adm.CreatePartitions(ctx, 1, raw); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 10*time.Second, func() bool { return partitions(t, adm, raw) == 4 }, "4 partitions in metadata")
	err := topics.CheckPartitions(ctx, adm, db.Pool, raw)
	if !errors.Is(err, topics.ErrPartitionsChanged) || !strings.Contains(err.Error(), "has 4 partitions, 3 were recorded") {
		t.Fatalf("CheckPartitions after adding a partition: %v, want ErrPartitionsChanged naming both counts", err)
	}
	t.Logf("refusal: %v", err)
	if _, err := topics.RecordPartitions(ctx, adm, db.Pool, raw, false); !errors.Is(err, topics.ErrPartitionsChanged) {
		t.Fatalf("RecordPartitions without acceptance: %v, want ErrPartitionsChanged", err)
	}
	if n, err := topics.RecordPartitions(ctx, adm, db.Pool, raw, true); err != nil || n != 4 {
		t.Fatalf("RecordPartitions accepting the change = %d, %v; want 4", n, err)
	}
	if err := topics.CheckPartitions(ctx, adm, db.Pool, raw); err != nil {
		t.Fatalf("CheckPartitions after re-recording: %v", err)
	}
}

// TestSpecs: min.insync.replicas is set only at 3 or more replicas, and
// defaults fill in.
func TestSpecs(t *testing.T) {
	t.Parallel()
	l := topics.Layout{Raw: "r", State: "s", DLQ: "d", Partitions: 12, MaxMessageBytes: 2_000_000}
	specs, err := l.Specs()
	if err != nil {
		t.Fatal(err)
	}
	if specs[2].Partitions != topics.DefaultDLQPartitions || specs[0].ReplicationFactor != -1 ||
		specs[0].Configs["retention.ms"] != "604800000" || specs[0].Configs["max.message.bytes"] != "2000000" {
		t.Errorf("specs with defaults: %+v", specs)
	}
	if _, err := (topics.Layout{Raw: "r", State: "s", DLQ: "d"}).Specs(); err == nil {
		t.Error("Specs accepted a layout without partitions")
	}
}
