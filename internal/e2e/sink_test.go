package e2e

import (
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/paystream/paystream/internal/envelope"
	"github.com/paystream/paystream/internal/testenv"
)

// TestDevSinkExactlyOnceOnKfake runs `paystream dev` (embedded kfake,
// private Postgres with wal_level=logical) and checks the sink's contract
// through kfake's transactions: a read_committed consumer of the state
// topic sees every state event once and each payment's events in order,
// across a stop of the whole process — relay and broker together — while
// webhooks were still flowing, and a restart on the same data dir (the
// relay reads its checkpoint back from kfake's persisted log).
//
// The stop is a SIGTERM, not a SIGKILL: kfake does not recover a Kafka
// transaction a SIGKILL leaves open (after the restart its last stable
// offset counts the open transaction's records while read_committed
// fetches never return them, so readers wait forever; seen in about one
// run in four). SIGKILL of the relay is proven on the real broker
// (sink's TestRelaySIGKILL, make chaos's sink-sigkill).
func TestDevSinkExactlyOnceOnKfake(t *testing.T) {
	testenv.SkipIfShort(t)
	t.Parallel()
	dataDir, sources := devDirs(t)
	const before, during = 20, 40
	want := map[string]int64{} // payment key → last version

	post := func(url, id, typ, payment string, extra string) {
		t.Helper()
		now := time.Now().UTC()
		body := fmt.Sprintf(`{"type":%q,"timestamp":%q,"data":{"payment_id":%q,"amount":1000,"currency":"BRL"%s}}`,
			typ, now.Format(time.RFC3339Nano), payment, extra)
		if code := devPost(t, url, id, now, body); code != http.StatusOK {
			t.Fatalf("post %s: status %d, want 200", id, code)
		}
	}

	dev := startDev(t, dataDir, sources)
	for i := range before {
		post(dev.url, fmt.Sprintf("msg_a_%d", i), "payment.paid", fmt.Sprintf("pay_a%d", i), "")
		want[fmt.Sprintf("acme:pay_a%d", i)] = 1
	}
	waitStateRecords(t, dataDir, before)

	// Webhooks still being processed and relayed when the process stops.
	var wg sync.WaitGroup
	for w := range 4 {
		wg.Go(func() {
			for i := w; i < during; i += 4 {
				post(dev.url, fmt.Sprintf("msg_b_%d", i), "payment.paid", fmt.Sprintf("pay_b%d", i), "")
			}
		})
	}
	wg.Wait()
	for i := range during {
		want[fmt.Sprintf("acme:pay_b%d", i)] = 1
	}
	if err := dev.Cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	<-dev.Done()

	dev = startDev(t, dataDir, sources)
	for i := range before {
		post(dev.url, fmt.Sprintf("msg_r_%d", i), "payment.partially_refunded", fmt.Sprintf("pay_a%d", i), `,"refund_id":"re_1"`)
		want[fmt.Sprintf("acme:pay_a%d", i)] = 2
	}
	total := before + during + before
	got := waitStateRecords(t, dataDir, total)
	dev.stop(t)

	next := map[string]int64{}
	seen := map[string]bool{}
	for _, r := range got {
		if seen[r.eventID] {
			t.Errorf("event id %s seen twice by a read_committed consumer", r.eventID)
		}
		seen[r.eventID] = true
		next[r.ev.PaymentKey]++
		if wantID := envelope.StateEventID(r.ev.PaymentKey, next[r.ev.PaymentKey]); r.eventID != wantID {
			t.Errorf("%s: event %s, want %s (a gap or out of order)", r.ev.PaymentKey, r.eventID, wantID)
		}
	}
	for key, v := range want {
		if next[key] != v {
			t.Errorf("%s: %d versions on the state topic, want %d", key, next[key], v)
		}
	}
	t.Logf("%d state events, each once, across a SIGKILL of paystream dev with %d webhooks in flight", len(got), during)
}

// waitStateRecords waits until the state topic of the dev instance in
// dataDir holds at least n records for a read_committed consumer, and
// returns them.
func waitStateRecords(t *testing.T, dataDir string, n int) []stateRecord {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(dataDir, "dev.json"))
	if err != nil {
		t.Fatal(err)
	}
	var st struct {
		KafkaBrokers []string `json:"kafka_brokers"`
	}
	if err := json.Unmarshal(b, &st); err != nil {
		t.Fatal(err)
	}
	var got []stateRecord
	testenv.WaitFor(t, 2*time.Minute, func() error {
		got = committedState(t, st.KafkaBrokers, envelope.TopicState)
		if len(got) < n {
			return fmt.Errorf("%d committed state records, want %d", len(got), n)
		}
		return nil
	})
	return got
}
