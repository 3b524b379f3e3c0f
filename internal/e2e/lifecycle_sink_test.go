package e2e

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/paystream/paystream/internal/testenv"
	"github.com/paystream/paystream/sink"
)

// sinkGrace is the sink's terminationGracePeriodSeconds in
// deploy/k8s/base/sink.yaml: the kubelet SIGKILLs it after that.
const sinkGrace = 30 * time.Second

// TestSinkSIGTERMUnderLoad runs `paystream sink` (the binary) while a
// processor applies a steady flow of raw records, sends it SIGTERM
// mid-load, twice, restarting it each time, and checks each stop: exit
// status 0 within the manifests' grace period, no error logged, and the
// relay's Kafka transaction not left open (the broker describes its
// transactional id as committed, aborted or empty, never ongoing). Before
// each stop it scrapes the relay's /metrics: the active relay's producer
// reports franz-go's client metrics as paystream_sink_kafka_*
// {client="relay"} (and each restart reads the checkpoint back with its
// own admin and checkpoint clients, which would panic on a duplicate
// registration). After the drain every event's effects are in Postgres
// once, and a read_committed consumer sees every state event once, in
// order.
func TestSinkSIGTERMUnderLoad(t *testing.T) {
	testenv.SkipIfShort(t)
	p := startRelayPipeline(t, 10)
	id, err := sink.Identify(t.Context(), p.db.Pool, "")
	if err != nil {
		t.Fatal(err)
	}
	txnID := id.TransactionalID()

	hs := genHistories(3000)
	prod := producePaced(t, p.brokers, p.raw, hs, 5, 30*time.Millisecond)
	start := func(name string) (*binProc, string) {
		addr := testenv.FreeAddr(t)
		return startBin(t, name, "sink", "--kafka-brokers", strings.Join(p.brokers, ","), "--database-url", p.db.URL,
			"--state-topic", p.state, "--checkpoint-topic", p.ckpt, "--heartbeat-interval", "200ms",
			"--standby-retry", "100ms", "--metrics-addr", addr, "--log-format", "json"), addr
	}

	for n := range 2 {
		s, addr := start(fmt.Sprintf("paystream sink %d", n))
		from := testenv.EndOffsetSum(t, p.brokers, p.state)
		testenv.Eventually(t, 2*time.Minute, func() bool { return testenv.EndOffsetSum(t, p.brokers, p.state) >= from+300 },
			"sink %d to publish 300 records", n)
		fams := testenv.Scrape(t, "http://"+addr+"/metrics")
		relay := map[string]string{"client": sink.ClientRelay}
		if v := fams.Sum("paystream_sink_active", nil); v != 1 {
			t.Errorf("sink %d: paystream_sink_active %v, want 1", n, v)
		}
		for _, name := range []string{"paystream_sink_kafka_connects_total", "paystream_sink_kafka_produce_bytes_total"} {
			if v := fams.Sum(name, relay); v <= 0 {
				t.Errorf(`sink %d: %s{client="relay"} = %v on /metrics, want > 0`, n, name, v)
			}
		}
		atSignal, flowing := testenv.EndOffsetSum(t, p.brokers, p.state), prod.flowing()
		took := s.terminate(t, sinkGrace)
		txn := describeTxn(t, p.brokers, txnID)
		if txn == "Ongoing" {
			t.Errorf("sink %d exited with its Kafka transaction ongoing: a read_committed consumer is stuck behind it until the transaction times out", n)
		}
		t.Logf("sink %d: SIGTERM at state topic high water %d (producer still producing: %v); exited 0 after %s; transaction %s; %v events published by it",
			n, atSignal, flowing, took.Round(time.Millisecond), txn, fams.Sum("paystream_sink_events_published_total", nil))
	}

	last, addr := start("paystream sink 2")
	done := prod.stop(t, hs)
	waitCaughtUp(t, p.db.Pool, p.brokers, p.group, p.raw, 5*time.Minute)
	recs := checkPipelineOnce(t, p.db, p.brokers, p.state, done, 2*time.Minute)
	skipped := testenv.Scrape(t, "http://"+addr+"/metrics").Sum("paystream_sink_replayed_transactions_skipped_total", nil)
	t.Logf("%d payments, %d state events on the topic for read_committed consumers, each once; the last sink skipped %v Postgres transactions already published",
		len(done), len(recs), skipped)
	last.terminate(t, sinkGrace)
}

// describeTxn returns the broker's state of transactional id txnID
// (Empty, Ongoing, PrepareCommit, CompleteCommit, ...).
func describeTxn(t *testing.T, brokers []string, txnID string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	described, err := testenv.Admin(t, brokers).DescribeTransactions(ctx, txnID)
	if err != nil {
		t.Fatalf("describe transactional id %s: %v", txnID, err)
	}
	d, ok := described[txnID]
	if !ok || d.Err != nil {
		t.Fatalf("describe transactional id %s: %v (described: %v)", txnID, d.Err, ok)
	}
	return d.State
}
