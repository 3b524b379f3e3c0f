package e2e

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/paystream/paystream/internal/dlq"
	"github.com/paystream/paystream/internal/dlq/dlqtest"
	"github.com/paystream/paystream/internal/envelope"
	"github.com/paystream/paystream/internal/provider"
	"github.com/paystream/paystream/internal/testenv"
	"github.com/paystream/paystream/processor"
)

// TestDLQReplayAppliedOnce follows two dead-lettered webhooks through
// `paystream dlq replay` (the binary, after a driver fix) into the
// processor and the sink, and shows each event's effect applied exactly
// once — one delivery processed, one transition, its ledger movements, one
// state event — although each is put on the raw topic twice, as a replay
// whose marker was lost (or two operators racing) does: the second replay
// reads another replays topic, so the marker does not stop it. Payment A's
// two copies are produced before the processor runs, so they meet in one
// batch; payment B's second copy comes after its first was applied, so it
// meets the stored dedup key. Each second copy is a delivery ignored as
// duplicate_event.
func TestDLQReplayAppliedOnce(t *testing.T) {
	testenv.SkipIfShort(t)
	db := testenv.NewDB(t)
	brokers := testenv.Kafka(t)
	raw, dlqTopic, state := testenv.Topic(t, "raw", 3), testenv.Topic(t, "dlq", 2), testenv.Topic(t, "state", 3)
	group := testenv.Group(t)
	// Created by the first replay to each; deleted when the test ends.
	replays := "replays-" + strings.TrimPrefix(group, "g-")
	bypass := replays + "-bypass"
	t.Cleanup(func() { testenv.DeleteTopics(t, brokers, replays, bypass) })

	// A real ingest dead-letters both webhooks: the "gh" source's driver
	// refuses their ids (too long).
	in := dlqtest.Start(t, brokers, raw, dlqTopic)
	idA, idB := dlqtest.LongID("gh_a"), dlqtest.LongID("gh_b")
	in.PostHMAC(t, idA, dlqtest.PaidBody("payment.paid", "pay_dlq_a", 990))
	in.PostHMAC(t, idB, dlqtest.PaidBody("payment.paid", "pay_dlq_b", 1230))
	if n := testenv.EndOffsetSum(t, brokers, raw); n != 0 {
		t.Fatalf("raw topic has %d records before any replay, want 0 (both dead-lettered)", n)
	}
	fixed := filepath.Join(t.TempDir(), "fixed.yaml")
	if err := os.WriteFile(fixed, []byte(dlqtest.FixedSourcesYAML), 0o600); err != nil {
		t.Fatal(err)
	}
	replay := func(id, replaysTopic string) (string, int) {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		cmd := exec.CommandContext(ctx, binary, "dlq", "replay", "--event-id", id, "--sources", fixed,
			"--kafka-brokers", strings.Join(brokers, ","), "--dlq-topic", dlqTopic, "--raw-topic", raw,
			"--replays-topic", replaysTopic, "--quiet")
		cmd.Env = testenv.Environ()
		out, err := cmd.CombinedOutput()
		code := 0
		if err != nil {
			code = -1
			if ee, ok := err.(*exec.ExitError); ok {
				code = ee.ExitCode()
			}
		}
		return string(out), code
	}
	mustReplay := func(id, replaysTopic string) {
		t.Helper()
		if out, code := replay(id, replaysTopic); code != 0 || !strings.Contains(out, "replayed dlq record") {
			t.Fatalf("dlq replay --replays-topic %s: exit %d\n%s", replaysTopic, code, out)
		}
	}

	// A: replayed, refused a second time, then replayed again around the
	// marker; both copies wait on the raw topic for the processor.
	mustReplay(idA, replays)
	if out, code := replay(idA, replays); code == 0 || !strings.Contains(out, "already replayed") {
		t.Fatalf("second replay of A: exit %d, want a refusal saying it was already replayed\n%s", code, out)
	}
	mustReplay(idA, bypass)

	runSink(t, db.Pool, brokers, state)
	runProcessor(t, db.Pool, processor.Config{Brokers: brokers, Topic: raw, Group: group})
	waitCaughtUp(t, db.Pool, brokers, group, raw, time.Minute)
	if n := count(t, db.Pool, `SELECT count(*) FROM payment_transitions`); n != 1 {
		t.Fatalf("%d transitions after A's two copies, want 1", n)
	}

	// B: replayed while the processor runs and applied; then the second
	// copy arrives.
	mustReplay(idB, replays)
	waitCaughtUp(t, db.Pool, brokers, group, raw, time.Minute)
	if n := count(t, db.Pool, `SELECT count(*) FROM payment_transitions`); n != 2 {
		t.Fatalf("%d transitions after B's first copy, want 2", n)
	}
	mustReplay(idB, bypass)
	waitCaughtUp(t, db.Pool, brokers, group, raw, time.Minute)

	// The raw topic holds each event twice, identical but for their
	// positions; the histories are what the driver made of each, once.
	byKey := map[string][]provider.Event{}
	var order []string
	for _, r := range consumeAll(t, brokers, raw, 4, time.Minute) {
		env, err := envelope.DecodeRaw(r.Value)
		if err != nil {
			t.Fatalf("raw record %d/%d: %v", r.Partition, r.Offset, err)
		}
		if !hasHeader(r, dlq.HeaderReplayedFrom) {
			t.Errorf("raw record %d/%d has no %s header", r.Partition, r.Offset, dlq.HeaderReplayedFrom)
		}
		if len(byKey[env.PaymentKey]) == 0 {
			order = append(order, env.PaymentKey)
		}
		byKey[env.PaymentKey] = append(byKey[env.PaymentKey], env.Event)
	}
	slices.Sort(order) // A's payment first
	var hs []history
	for _, key := range order {
		evs := byKey[key]
		if len(evs) != 2 || evs[0].DedupKey != evs[1].DedupKey || evs[0].DedupKey == "" {
			t.Fatalf("%s: %d raw records with dedup keys %v, want two copies of one event", key, len(evs), dedupKeys(evs))
		}
		hs = append(hs, history{key: key, events: evs[:1]})
	}
	if len(hs) != 2 || !strings.HasSuffix(hs[0].key, "pay_dlq_a") || !strings.HasSuffix(hs[1].key, "pay_dlq_b") {
		t.Fatalf("raw records for payments %v, want A's and B's", order)
	}

	for _, h := range hs {
		var processed, duplicates int
		err := db.Pool.QueryRow(context.Background(), `
			SELECT count(*) FILTER (WHERE status = 'processed'),
			       count(*) FILTER (WHERE status = 'ignored' AND reason = 'duplicate_event')
			  FROM deliveries WHERE payment_key = $1`, h.key).Scan(&processed, &duplicates)
		if err != nil {
			t.Fatal(err)
		}
		if processed != 1 || duplicates != 1 {
			t.Errorf("%s: %d deliveries processed and %d ignored as duplicate_event, want 1 and 1", h.key, processed, duplicates)
		}
		var status string
		var held bool
		if err := db.Pool.QueryRow(context.Background(), `SELECT status, held FROM payments WHERE payment_key = $1`, h.key).Scan(&status, &held); err != nil {
			t.Fatalf("%s: %v", h.key, err)
		}
		if status != "paid" || held {
			t.Errorf("%s: status %s, held %v; want paid, not held", h.key, status, held)
		}
	}
	// The two paths to the dedup key: A's copies were written by one batch
	// transaction, B's by two.
	for i, want := range []int{1, 2} {
		if n := count(t, db.Pool, `SELECT count(DISTINCT xmin::text) FROM deliveries WHERE payment_key = $1`, hs[i].key); n != want {
			t.Errorf("%s: deliveries written by %d transactions, want %d", hs[i].key, n, want)
		}
	}
	recs := checkPipelineOnce(t, db, brokers, state, hs, time.Minute)
	t.Logf("payments %v: each event on the raw topic twice, applied once, %d state events on the topic", order, len(recs))
}

func hasHeader(r *kgo.Record, key string) bool {
	for _, h := range r.Headers {
		if h.Key == key {
			return true
		}
	}
	return false
}

func dedupKeys(evs []provider.Event) []string {
	out := make([]string, len(evs))
	for i, e := range evs {
		out[i] = e.DedupKey
	}
	return out
}
