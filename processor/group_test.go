package processor

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	dto "github.com/prometheus/client_model/go"
	"github.com/twmb/franz-go/pkg/kgo"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/paystream/paystream/internal/envelope"
	"github.com/paystream/paystream/internal/payment"
	"github.com/paystream/paystream/internal/provider"
	"github.com/paystream/paystream/internal/statelog"
	"github.com/paystream/paystream/internal/testenv"
	"github.com/paystream/paystream/internal/tracing"
)

// The shared transaction tests: batches of several partitions that wait
// for a transaction at the same moment are committed in one, each with
// the guarantees it has alone. No Kafka is needed: the workers' batches
// are built by hand and handed to Worker.commit, the worker's own path.

const sharedTopic = "raw"

// sharedProcessor is a processor on pool whose workers own partitions,
// claimed in Postgres as a rebalance would (no Kafka client: it never runs).
func sharedProcessor(t *testing.T, pool *pgxpool.Pool, partitions ...int32) (*Processor, map[int32]*Worker) {
	t.Helper()
	p, err := New(pool, Config{Brokers: []string{"unused:9092"}, Topic: sharedTopic, Group: zombieGroup,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	workers := map[int32]*Worker{}
	for _, part := range partitions {
		epoch, next, _, err := claim(context.Background(), pool, zombieGroup, sharedTopic, part)
		if err != nil {
			t.Fatal(err)
		}
		w := newWorker(p, sharedTopic, part, epoch, next)
		workers[part] = w
		p.workers[part] = w
		p.offsets[part] = &partitionOffsets{stored: next, copied: -1, end: -1}
	}
	return p, workers
}

// threeBatches is sharedProcessor with partitions 0, 1 and 2, and a batch
// of 5 payments (20 records) for each.
func threeBatches(t *testing.T, pool *pgxpool.Pool) (*Processor, map[int32]*Worker, map[*Worker][]*kgo.Record) {
	t.Helper()
	p, workers := sharedProcessor(t, pool, 0, 1, 2)
	batches := map[*Worker][]*kgo.Record{}
	for part, w := range workers {
		batches[w] = partitionRecords(t, part, int(part)*100, 5)
	}
	return p, workers, batches
}

// partitionRecords is paymentRecords for payments first… on partition part,
// at offsets from 0.
func partitionRecords(t *testing.T, part int32, first, payments int) []*kgo.Record {
	recs := paymentRecords(t, sharedTopic, first, payments)
	for i, r := range recs {
		r.Partition, r.Offset = part, int64(i)
	}
	return recs
}

// commitTogether commits each worker's batch with Worker.commit, all
// waiting for a transaction at once: the processor's one transaction is
// taken until every batch is waiting, so the next one takes them all. It
// returns whether each worker's commit succeeded.
func commitTogether(t *testing.T, p *Processor, batches map[*Worker][]*kgo.Record) map[*Worker]bool {
	t.Helper()
	p.commits.slots <- struct{}{} // the one transaction is busy
	var mu sync.Mutex
	ok := map[*Worker]bool{}
	var wg sync.WaitGroup
	for w, recs := range batches {
		wg.Add(1)
		go func() {
			defer wg.Done()
			committed := w.commit(recs)
			mu.Lock()
			ok[w] = committed
			mu.Unlock()
		}()
	}
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(time.Millisecond) {
		p.commits.mu.Lock()
		n := len(p.commits.pending)
		p.commits.mu.Unlock()
		if n == len(batches) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d of %d batches waiting for a transaction", n, len(batches))
		}
	}
	<-p.commits.slots
	wg.Wait()
	return ok
}

func histogram(t *testing.T, p *Processor) (count uint64, sum float64) {
	t.Helper()
	var m dto.Metric
	if err := p.metrics.transactionBatches.Write(&m); err != nil {
		t.Fatal(err)
	}
	return m.GetHistogram().GetSampleCount(), m.GetHistogram().GetSampleSum()
}

// TestPartitionsShareATransaction: three partitions' batches waiting at
// once commit in one transaction (every row they wrote, offsets included,
// has one xmin), each partition's offset moves to its batch's end, every
// payment's effects are there exactly once, and each partition's
// deliveries are its own payments'. Committed again (a retry after a lost
// answer), the batches change nothing.
func TestPartitionsShareATransaction(t *testing.T) {
	t.Parallel()
	db := testenv.NewDB(t)
	p, workers, batches := threeBatches(t, db.Pool)
	for w, ok := range commitTogether(t, p, batches) {
		if !ok {
			t.Fatalf("partition %d: commit failed", w.partition)
		}
	}
	checkEffects(t, db.Pool, 15)
	for part, w := range workers {
		if w.committed != 20 {
			t.Errorf("partition %d: worker committed up to %d, want 20", part, w.committed)
		}
		if got := storedOffset(t, db, zombieGroup, sharedTopic, part); got != 20 {
			t.Errorf("partition %d: stored next offset %d, want 20", part, got)
		}
		if got := queryInt(t, db.Pool, `SELECT count(*) FROM deliveries WHERE partition = $1 AND payment_key LIKE 'acme:pay_000' || $1 || '%'`, part); got != 20 {
			t.Errorf("partition %d: %d deliveries of its own payments, want 20", part, got)
		}
	}
	if got := queryInt(t, db.Pool, `
		SELECT count(DISTINCT x) FROM (
		  SELECT xmin::text AS x FROM consumer_offsets WHERE topic = $1
		  UNION ALL SELECT xmin::text FROM deliveries
		  UNION ALL SELECT xmin::text FROM payment_transitions) t`, sharedTopic); got != 1 {
		t.Errorf("the batches' rows were written by %d transactions, want 1", got)
	}
	if n, sum := histogram(t, p); n != 1 || sum != 3 {
		t.Errorf("transaction_batches: %d transactions of %v batches, want 1 of 3", n, sum)
	}

	// A retry of the same batches (their answer lost): all skipped.
	for w := range batches {
		w.committed = 0 // as a fresh worker that claimed before the commit would
	}
	commitTogether(t, p, batches)
	checkEffects(t, db.Pool, 15)
}

// TestSharedTransactionRefusesOnlyItsFencedPartitions: of three batches
// waiting together, one's partition was claimed by a newer owner and
// another's stored offset went back below what its worker committed. The
// first is fenced, the second stops the processor (ErrOffsetRolledBack);
// neither writes anything, and the third commits without them.
func TestSharedTransactionRefusesOnlyItsFencedPartitions(t *testing.T) {
	t.Parallel()
	db := testenv.NewDB(t)
	p, workers, batches := threeBatches(t, db.Pool)
	var stopped error
	p.stopRun = func(err error) { stopped = err }
	if _, _, _, err := claim(context.Background(), db.Pool, zombieGroup, sharedTopic, 1); err != nil { // a newer owner
		t.Fatal(err)
	}
	workers[2].committed = 7 // Postgres holds 0: it lost that commit
	ok := commitTogether(t, p, batches)
	if !ok[workers[0]] || ok[workers[1]] || ok[workers[2]] {
		t.Fatalf("committed: partition 0 %v, 1 %v, 2 %v; want only 0", ok[workers[0]], ok[workers[1]], ok[workers[2]])
	}
	if !errors.Is(stopped, ErrOffsetRolledBack) {
		t.Errorf("processor stopped with %v, want ErrOffsetRolledBack", stopped)
	}
	checkEffects(t, db.Pool, 5)
	for part, want := range map[int32]int64{0: 20, 1: 0, 2: 0} {
		if got := storedOffset(t, db, zombieGroup, sharedTopic, part); got != want {
			t.Errorf("partition %d: stored next offset %d, want %d", part, got, want)
		}
	}
	if got := queryInt(t, db.Pool, `SELECT count(*) FROM deliveries WHERE partition <> 0`); got != 0 {
		t.Errorf("%d deliveries of the refused partitions, want 0", got)
	}
}

// TestPoisonInASharedTransactionIsIsolatedAlone: one batch holds a record
// whose fact is invalid (it fails the shared transaction), another a record
// that does not decode. Every batch is then committed alone, where the
// poisonous records alone are quarantined: the other records of all three
// partitions apply exactly once.
func TestPoisonInASharedTransactionIsIsolatedAlone(t *testing.T) {
	t.Parallel()
	db := testenv.NewDB(t)
	p, workers, batches := threeBatches(t, db.Pool)
	bad := payment.Fact{Status: payment.StatusPaid, AmountMinor: -1, Currency: "BRL"}
	env := envelope.Raw{Source: "acme", Driver: "standardwebhooks", PaymentKey: "acme:bad", ReceivedAt: time.Now().UTC(), Body: []byte(`{}`),
		Event: provider.Event{EventID: "evt_bad", DedupKey: "evt_bad", PaymentID: "bad", Type: "payment.paid", Fact: bad}}
	v, err := env.Marshal()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := envelope.DecodeRaw(v); err != nil {
		t.Fatalf("the invalid fact's record must decode (it fails the transaction, not the decoding): %v", err)
	}
	batches[workers[1]] = append(batches[workers[1]], &kgo.Record{Topic: sharedTopic, Partition: 1, Offset: 20, Key: []byte("acme:bad"), Value: v})
	batches[workers[2]] = append(batches[workers[2]], &kgo.Record{Topic: sharedTopic, Partition: 2, Offset: 20, Key: []byte("acme:x"), Value: []byte("not an envelope")})
	for w, ok := range commitTogether(t, p, batches) {
		if !ok {
			t.Fatalf("partition %d: commit failed", w.partition)
		}
	}
	for what, want := range map[string]int{ // 15 payments' effects, and the two poisonous records quarantined
		`SELECT count(*) FROM deliveries`:                                  15*4 + 2,
		`SELECT count(*) FROM deliveries WHERE reason = 'duplicate_event'`: 15,
		`SELECT count(*) FROM deliveries WHERE status = 'quarantined'`:     2,
		`SELECT count(*) FROM payment_transitions`:                         15 * 3,
		`SELECT count(*) FROM ledger_postings`:                             15 * 4,
	} {
		if got := queryInt(t, db.Pool, what); got != want {
			t.Errorf("%s: %d, want %d", what, got, want)
		}
	}
	for part, want := range map[int32]int64{0: 20, 1: 21, 2: 21} {
		if got := storedOffset(t, db, zombieGroup, sharedTopic, part); got != want {
			t.Errorf("partition %d: stored next offset %d, want %d", part, got, want)
		}
	}
	// Sent alone at once, not failed and retried after a backoff.
	var retries dto.Metric
	if err := p.metrics.batchRetries.Write(&retries); err != nil {
		t.Fatal(err)
	}
	if n := retries.GetCounter().GetValue(); n != 0 {
		t.Errorf("%v batch retries, want 0", n)
	}
	if n, sum := histogram(t, p); n != 3 || sum != 3 {
		t.Errorf("transaction_batches: %d transactions of %v batches, want 3 of 1", n, sum)
	}
}

// TestSharedTransactionEventsCarryTheirBatchSpan: in a transaction shared
// by three partitions' batches, each state event carries the trace context
// of its own partition's batch span, not another batch's.
func TestSharedTransactionEventsCarryTheirBatchSpan(t *testing.T) {
	t.Parallel()
	db := testenv.NewDB(t)
	slot := stateSlot(t, db)
	spans := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(spans))
	p, workers := sharedProcessor(t, db.Pool, 0, 1, 2)
	p.tracer = tracing.Tracer(tp, tracerName)
	batches := map[*Worker][]*kgo.Record{}
	for part, w := range workers {
		batches[w] = partitionRecords(t, part, int(part)*100, 2)
	}
	commitTogether(t, p, batches)

	spanOf := map[int]string{} // partition → its batch span's id
	for _, s := range spans.Ended() {
		for _, a := range s.Attributes() {
			if a.Key == "messaging.destination.partition.id" {
				spanOf[int(a.Value.AsInt64())] = s.SpanContext().SpanID().String()
			}
		}
	}
	if len(spanOf) != 3 {
		t.Fatalf("batch spans for partitions %v, want 0, 1 and 2", spanOf)
	}
	messages, perTxn := peekStateMessages(t, db, slot)
	if len(perTxn) != 1 {
		t.Fatalf("state messages in %d transactions, want 1", len(perTxn))
	}
	n := 0
	for _, m := range messages {
		events, err := statelog.DecodeMessage(m)
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range events {
			n++
			part := int(e.Key[len("acme:pay_000")] - '0') // partitionRecords numbers part's payments from part*100
			var parent string
			for _, h := range e.Headers {
				if h.Key == "traceparent" {
					parent = string(h.Value)
				}
			}
			if !strings.Contains(parent, "-"+spanOf[part]+"-") {
				t.Errorf("%s (partition %d) traceparent %q, want its batch span %s", e.EventID(), part, parent, spanOf[part])
			}
		}
	}
	if n != 3*2*3 {
		t.Errorf("%d state events, want 18", n)
	}
}
