package e2e

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/paystream/paystream/internal/envelope"
	"github.com/paystream/paystream/internal/payment"
	"github.com/paystream/paystream/internal/provider"
	"github.com/paystream/paystream/internal/testenv"
)

// history is one generated payment and the facts the gateway sends for it,
// in the order they happened.
type history struct {
	key    string
	id     string
	events []provider.Event
}

// inOrder is what applying h's events once each, in order, makes.
func (h history) inOrder() payment.Replayed {
	return payment.Machine{}.Replay(payment.State{}, factsOf(h.events))
}

// genHistories makes n payments, each created, paid, paid again (a
// redelivery of the same event), then partially refunded.
func genHistories(n int) []history {
	base := time.Date(2026, 11, 1, 12, 0, 0, 0, time.UTC)
	out := make([]history, n)
	for i := range out {
		id := fmt.Sprintf("pay_%05d", i)
		amount := int64(1000 + i)
		at := base.Add(time.Duration(i) * time.Second)
		ev := func(eventID, typ string, f payment.Fact) provider.Event {
			return provider.Event{EventID: eventID, DedupKey: eventID, PaymentID: id, Type: typ, Fact: f}
		}
		out[i] = history{key: "acme:" + id, id: id, events: []provider.Event{
			ev("evt_c_"+id, "payment.created", payment.Fact{Status: payment.StatusPending, AmountMinor: amount, Currency: "BRL", OccurredAt: at}),
			ev("evt_p_"+id, "payment.paid", payment.Fact{Status: payment.StatusPaid, AmountMinor: amount, Currency: "BRL", OccurredAt: at.Add(time.Minute)}),
			ev("evt_p_"+id, "payment.paid", payment.Fact{Status: payment.StatusPaid, AmountMinor: amount, Currency: "BRL", OccurredAt: at.Add(time.Minute)}),
			ev("evt_r_"+id, "payment.partially_refunded", payment.Fact{Status: payment.StatusPartiallyRefunded, AmountMinor: 100, Currency: "BRL", RefundID: "re_" + id, OccurredAt: at.Add(2 * time.Minute)}),
		}}
	}
	return out
}

func rawRecord(t *testing.T, topic, key string, ev provider.Event) *kgo.Record {
	t.Helper()
	env := envelope.Raw{Source: "acme", Driver: "standardwebhooks", PaymentKey: key, Event: ev, ReceivedAt: time.Now().UTC(), Body: []byte(`{}`)}
	v, err := env.Marshal()
	if err != nil {
		t.Fatal(err)
	}
	return &kgo.Record{Topic: topic, Key: []byte(key), Value: v}
}

// startProcessor runs `paystream processor` as a subprocess, named name
// in the test's output, on topic with batches of at most 10 records,
// logging warnings; extra flags come last (a later flag wins).
func startProcessor(t *testing.T, dbURL string, brokers []string, topic, group, name string, extra ...string) *binProc {
	t.Helper()
	return startBin(t, name, append([]string{"processor",
		"--kafka-brokers", brokers[0], "--database-url", dbURL, "--raw-topic", topic, "--group", group,
		"--batch-max-records", "10", "--session-timeout", "6s", "--log-level", "warn", "--metrics-addr", ""}, extra...)...)
}

// TestProcessorSIGKILLMidStream kills the processor (a real subprocess) with
// SIGKILL several times while traffic flows, restarting it each time, and
// checks that no event is lost, none is applied twice, every payment's
// ledger equals in-order delivery's and stored offsets never go backwards.
func TestProcessorSIGKILLMidStream(t *testing.T) {
	db := testenv.NewDB(t)
	brokers := testenv.Kafka(t)
	raw := testenv.Topic(t, "raw", 3)
	group := testenv.Group(t)
	seed := time.Now().UnixNano()
	rng := rand.New(rand.NewPCG(uint64(seed), 0))
	t.Logf("seed %d", seed)

	const payments = 300
	hs := genHistories(payments)
	var recs []*kgo.Record
	// Interleave payments while keeping each one's events in order.
	next := make([]int, payments)
	for remaining := payments * 4; remaining > 0; {
		i := rng.IntN(payments)
		if next[i] == len(hs[i].events) {
			continue
		}
		recs = append(recs, rawRecord(t, raw, hs[i].key, hs[i].events[next[i]]))
		next[i]++
		remaining--
	}

	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.RecordPartitioner(kgo.StickyKeyPartitioner(nil)))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	half := len(recs) / 2
	if err := cl.ProduceSync(context.Background(), recs[:half]...).FirstErr(); err != nil {
		t.Fatal(err)
	}

	// Watch stored offsets the whole time: they must never decrease.
	watch := watchOffsets(t, db.Pool, group, raw)

	// The rest of the traffic arrives while the processor runs and dies.
	var produce sync.WaitGroup
	produce.Add(1)
	go func() {
		defer produce.Done()
		for i := half; i < len(recs); i += 50 {
			end := min(i+50, len(recs))
			if err := cl.ProduceSync(context.Background(), recs[i:end]...).FirstErr(); err != nil {
				t.Errorf("produce: %v", err)
				return
			}
			time.Sleep(20 * time.Millisecond)
		}
	}()

	inboxCount := func() int { return count(t, db.Pool, `SELECT count(*) FROM deliveries`) }
	total := len(recs)
	for n, frac := range []float64{0.15 + 0.2*rng.Float64(), 0.45 + 0.2*rng.Float64(), 0.75 + 0.1*rng.Float64()} {
		p := startProcessor(t, db.URL, brokers, raw, group, fmt.Sprintf("processor %d", n))
		threshold := int(frac * float64(total))
		testenv.Eventually(t, 90*time.Second, func() bool { return inboxCount() >= threshold },
			"processor %d to reach %d inbox rows", n, threshold)
		p.kill(t)
		t.Logf("SIGKILLed processor %d at %d/%d inbox rows", n, inboxCount(), total)
	}
	produce.Wait()
	startProcessor(t, db.URL, brokers, raw, group, "processor 3")
	testenv.Eventually(t, 120*time.Second, func() bool { return inboxCount() == total },
		"all %d records in the inbox after the last restart", total)
	watch.check(t)

	// Every record is in the inbox exactly once (the table has a unique
	// (topic, partition, offset) key), and nothing is left half-done.
	if n := count(t, db.Pool, `SELECT count(DISTINCT (topic, partition, kafka_offset)) FROM deliveries`); n != total {
		t.Errorf("distinct offsets in inbox = %d, want %d", n, total)
	}
	if n := count(t, db.Pool, `SELECT count(*) FROM deliveries WHERE status = 'received'`); n != 0 {
		t.Errorf("%d inbox rows left undecided", n)
	}
	if n := count(t, db.Pool, `SELECT count(*) FROM deliveries WHERE reason = 'duplicate_event'`); n != payments {
		t.Errorf("duplicate deliveries recorded = %d, want %d", n, payments)
	}
	// Stored offsets reached the end of every partition.
	if err := testenv.OffsetsBehind(t, db.Pool, group, raw, testenv.EndOffsets(t, brokers, raw)); err != nil {
		t.Error(err)
	}

	// Each payment's transitions and ledger equal in-order delivery's.
	checkExactlyOnce(t, db.Pool, hs)
}
