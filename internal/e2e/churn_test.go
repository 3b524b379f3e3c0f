package e2e

import (
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/paystream/paystream/internal/testenv"
	"github.com/paystream/paystream/processor"
)

// TestGroupChurn runs three processors in one group on a six-partition
// topic and keeps stopping and restarting them (a clean ctx cancel: drain
// and leave the group) while records flow, so partitions move between
// members again and again. At the end every record is in the inbox exactly
// once, no effect was applied twice (transitions, postings and ledger movements
// are what in-order replay makes, per payment balances match), the stored
// offsets and owner epochs never went backwards, each stored offset always
// matched the inbox rows below it, and the offsets reached the end of every
// partition.
func TestGroupChurn(t *testing.T) {
	t.Parallel()
	db := testenv.NewDB(t)
	brokers := testenv.Kafka(t)
	raw := testenv.Topic(t, "raw", 6)
	group := testenv.Group(t)
	seed := rand.Uint64()
	t.Logf("seed %d", seed)
	r := rand.New(rand.NewPCG(seed, 0))

	// genHistories: created, paid, paid redelivered, partially refunded.
	const payments = 600
	hs := genHistories(payments)
	var recs []*kgo.Record
	next := make([]int, payments)
	for left := payments * 4; left > 0; {
		i := r.IntN(payments)
		if next[i] == len(hs[i].events) {
			continue
		}
		recs = append(recs, &kgo.Record{Topic: raw, Key: []byte(hs[i].key), Value: envelopeValue(t, "acme", hs[i].key, hs[i].events[next[i]])})
		next[i]++
		left--
	}

	watch := watchOffsets(t, db.Pool, group, raw)
	var (
		mu   sync.Mutex
		regs []*prometheus.Registry
	)
	start := func() *testenv.Service {
		reg := prometheus.NewRegistry()
		mu.Lock()
		regs = append(regs, reg)
		mu.Unlock()
		return runProcessor(t, db.Pool, processor.Config{
			Brokers: brokers, Topic: raw, Group: group, BatchMaxRecords: 20, Registerer: reg,
		})
	}
	slots := []*testenv.Service{start(), start(), start()}

	// Traffic flows for the whole churn.
	produced := make(chan struct{})
	go func() {
		defer close(produced)
		for i := 0; i < len(recs); i += 40 {
			if err := testenv.TryProduce(brokers, recs[i:min(i+40, len(recs))]...); err != nil {
				t.Error(err)
				return
			}
			time.Sleep(60 * time.Millisecond)
		}
	}()

	churnStart := time.Now()
	restarts := 0
	for flowing := true; flowing || restarts < 12; {
		select {
		case <-produced:
			flowing = false
		default:
		}
		time.Sleep(time.Duration(150+r.IntN(500)) * time.Millisecond)
		// Stop one member, sometimes two at once; restart them after a
		// moment, while the others own every partition.
		victims := []int{r.IntN(len(slots))}
		if r.IntN(3) == 0 {
			victims = append(victims, (victims[0]+1)%len(slots))
		}
		for _, v := range victims {
			slots[v].Stop()
		}
		time.Sleep(time.Duration(r.IntN(400)) * time.Millisecond)
		for _, v := range victims {
			slots[v] = start()
			restarts++
		}
		if time.Since(churnStart) > 60*time.Second {
			t.Fatalf("churn did not finish within 60s (%d restarts)", restarts)
		}
	}
	<-produced
	ends := testenv.EndOffsets(t, brokers, raw)
	testenv.WaitFor(t, 90*time.Second, func() error { return testenv.OffsetsBehind(t, db.Pool, group, raw, ends) })
	for _, s := range slots {
		s.Stop()
	}
	watch.check(t)
	t.Logf("%d restarts over %s, %d records", restarts, time.Since(churnStart).Round(time.Millisecond), len(recs))

	total := len(recs)
	if n := count(t, db.Pool, `SELECT count(*) FROM deliveries`); n != total {
		t.Errorf("inbox rows = %d, want %d (each record once)", n, total)
	}
	if n := count(t, db.Pool, `SELECT count(DISTINCT (topic, partition, kafka_offset)) FROM deliveries`); n != total {
		t.Errorf("distinct records in the inbox = %d, want %d", n, total)
	}
	if n := count(t, db.Pool, `SELECT count(*) FROM deliveries WHERE status NOT IN ('processed', 'ignored')`); n != 0 {
		t.Errorf("%d inbox rows neither processed nor ignored", n)
	}
	if n := count(t, db.Pool, `SELECT count(*) FROM deliveries WHERE reason = 'duplicate_event'`); n != payments {
		t.Errorf("redeliveries recorded = %d, want %d", n, payments)
	}

	checkExactlyOnce(t, db.Pool, hs)

	// The churn really moved partitions: each claim bumps an epoch.
	claims := count(t, db.Pool, `SELECT COALESCE(sum(owner_epoch), 0) FROM consumer_offsets WHERE group_id = $1`, group)
	var fenced, retries float64
	mu.Lock()
	for _, reg := range regs {
		fenced += testenv.Gather(t, reg).Sum("paystream_processor_fenced_total", nil)
		retries += testenv.Gather(t, reg).Sum("paystream_processor_batch_retries_total", nil)
	}
	mu.Unlock()
	t.Logf("%d partition claims, %v fenced commits, %v batch retries", claims, fenced, retries)
	if claims < 6+restarts {
		t.Errorf("%d partition claims for %d restarts: the churn did not move partitions", claims, restarts)
	}
}
