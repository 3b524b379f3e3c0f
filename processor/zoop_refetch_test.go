package processor

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net/http"
	"net/url"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/paystream/paystream/internal/envelope"
	"github.com/paystream/paystream/internal/provider"
	"github.com/paystream/paystream/internal/provider/gatewaytest"
	"github.com/paystream/paystream/internal/provider/zoop"
	"github.com/paystream/paystream/internal/source"
	"github.com/paystream/paystream/internal/testenv"
)

// zoopCredential is the zoop source's webhook credential in these tests.
const zoopCredential = "paystream:processor-zoop-password-5d2c"

// zoopPipeline is a processor (real Kafka, real Postgres) refetching a zoop
// source, loaded from a sources file, from a real HTTP server playing
// Zoop's API, with the processor's rate limiter, timeout and circuit
// breaker between them.
type zoopPipeline struct {
	t     *testing.T
	ctx   context.Context
	db    *testenv.DB
	topic string
	gw    *gatewaytest.Zoop
	src   *source.Source
	reg   *prometheus.Registry
	cl    *kgo.Client
}

func startZoopPipeline(t *testing.T, timeout string) *zoopPipeline {
	t.Helper()
	z := &zoopPipeline{t: t, ctx: context.Background(), db: testenv.NewDB(t), topic: testenv.Topic(t, "raw", 2),
		gw: gatewaytest.NewZoop(t), reg: prometheus.NewRegistry()}
	brokers := testenv.Kafka(t)
	yaml := z.gw.SourcesYAML(zoopCredential, timeout)
	srcs, err := source.Parse([]byte(yaml), map[string]provider.Factory{"zoop": zoop.New})
	if err != nil {
		t.Fatal(err)
	}
	z.src = srcs["zoop"]
	if z.src.Refetch == nil {
		t.Fatal("zoop source loaded without refetching")
	}
	p, err := New(z.db.Pool, Config{
		Brokers: brokers, Topic: z.topic, Group: testenv.Group(t), Registerer: z.reg,
		Refetch:      map[string]*source.RefetchConfig{z.src.Name: z.src.Refetch},
		RefetchRetry: 200 * time.Millisecond,
		HTTPClient:   z.gw.Client(),
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(z.ctx)
	var wg sync.WaitGroup
	wg.Go(func() { _ = p.Run(ctx) })
	t.Cleanup(func() { cancel(); wg.Wait() })
	if z.cl, err = kgo.NewClient(kgo.SeedBrokers(brokers...)); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(z.cl.Close)
	return z
}

// deliver verifies and parses a Zoop event with the source's driver, as
// ingest does, and produces its envelope to the raw topic. The body's
// transaction (status, amount) is a decoy: the driver must not trust it.
func (z *zoopPipeline) deliver(eventID, typ, txID string) {
	t := z.t
	t.Helper()
	body := fmt.Appendf(nil, `{"id":%q,"type":%q,"resource":"event","payload":{"object":{"id":%q,"resource":"transaction","status":"succeeded","amount":"999.99"}},"created_at":"2026-11-02T10:00:00+0000"}`, eventID, typ, txID)
	req := &provider.Request{Header: http.Header{zoop.HeaderAuthorization: {zoop.Sign(zoopCredential)}}, Query: url.Values{}, Body: body, Now: time.Now()}
	if err := z.src.Driver.Verify(req); err != nil {
		t.Fatal(err)
	}
	ev, err := z.src.Driver.Parse(req)
	if err != nil {
		t.Fatal(err)
	}
	env := envelope.Raw{Source: z.src.Name, Driver: z.src.DriverName, PaymentKey: z.src.PaymentKey(ev.PaymentID), ReceivedAt: time.Now().UTC(), Body: body, Event: ev}
	v, err := env.Marshal()
	if err != nil {
		t.Fatal(err)
	}
	if err := z.cl.ProduceSync(z.ctx, &kgo.Record{Topic: z.topic, Key: []byte(env.PaymentKey), Value: v}).FirstErr(); err != nil {
		t.Fatal(err)
	}
}

// status is the transaction's payment status, "" before it has a row.
func (z *zoopPipeline) status(txID string) string {
	var s string
	_ = z.db.Pool.QueryRow(z.ctx, `SELECT status FROM payments WHERE payment_key = $1`, z.src.PaymentKey(txID)).Scan(&s)
	return s
}

func (z *zoopPipeline) count(sql, txID string) int {
	z.t.Helper()
	var n int
	if err := z.db.Pool.QueryRow(z.ctx, sql, z.src.PaymentKey(txID)).Scan(&n); err != nil {
		z.t.Fatal(err)
	}
	return n
}

// deferred counts the transaction's deliveries waiting for a refetch.
func (z *zoopPipeline) deferred(txID string) int {
	return z.count(`SELECT count(*) FROM deliveries WHERE payment_key = $1 AND status = 'deferred' AND reason = 'awaiting_refetch'`, txID)
}

// transitions counts the transaction's payment transitions.
func (z *zoopPipeline) transitions(txID string) int {
	return z.count(`SELECT count(*) FROM payment_transitions WHERE payment_key = $1`, txID)
}

// ledger returns what the transaction captured (negative: owed to the
// merchant) and refunded, from its postings.
func (z *zoopPipeline) ledger(txID string) (captured, refunded int64) {
	z.t.Helper()
	if err := z.db.Pool.QueryRow(z.ctx, `
		SELECT COALESCE(sum(amount_minor) FILTER (WHERE account = 'merchant_payable' AND amount_minor < 0), 0),
		       COALESCE(sum(amount_minor) FILTER (WHERE account = 'merchant_payable' AND amount_minor > 0), 0)
		  FROM ledger_postings WHERE payment_key = $1`, z.src.PaymentKey(txID)).Scan(&captured, &refunded); err != nil {
		z.t.Fatal(err)
	}
	return captured, refunded
}

// refetches reads paystream_processor_refetches_total{source="zoop"} of
// one outcome.
func (z *zoopPipeline) refetches(outcome string) float64 {
	z.t.Helper()
	mfs, err := z.reg.Gather()
	if err != nil {
		z.t.Fatal(err)
	}
	var n float64
	for _, mf := range mfs {
		if mf.GetName() != "paystream_processor_refetches_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			labels := map[string]string{}
			for _, l := range m.GetLabel() {
				labels[l.GetName()] = l.GetValue()
			}
			if labels["source"] == "zoop" && labels["outcome"] == outcome {
				n += m.GetCounter().GetValue()
			}
		}
	}
	return n
}

// zoopTransaction is gatewaytest.ZoopCardLifecycle.
var zoopTransaction = gatewaytest.ZoopCardLifecycle

// TestZoopRefetchThroughProcessor runs Zoop events through the real
// processor against a real HTTP server playing Zoop's API:
//
//   - API up: a payment's five webhooks, in a random order and some
//     redelivered, move no money on their own; the refetches leave it
//     refunded with the ledger of a 250.00 capture refunded in full, and
//     no delivery waiting;
//   - API down: the event waits (deferred) while the API fails and is
//     applied once it answers;
//   - API slow: a refetch slower than refetch_timeout fails (the metric
//     counts it) and the event is applied once the API is fast again.
func TestZoopRefetchThroughProcessor(t *testing.T) {
	z := startZoopPipeline(t, "300ms")
	mp := z.gw.MarketplaceID()

	// Up.
	a := "0a1b2c3d4e5f60718293a4b5c6d7e8f9"
	z.gw.SetTransaction(a, zoopTransaction(mp, a, 3))
	webhooks := [][2]string{
		{"evtA0", "transaction.pre_authorized"}, {"evtA1", "transaction.capture.succeeded"}, {"evtA2", "transaction.succeeded"},
		{"evtA3", "transaction.void.succeeded"}, {"evtA4", "transaction.canceled"},
	}
	r := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 3))
	order := append(r.Perm(len(webhooks)), r.IntN(len(webhooks)), r.IntN(len(webhooks)))
	t.Logf("delivery order %v", order)
	for _, i := range order {
		z.deliver(webhooks[i][0], webhooks[i][1], a)
	}
	testenv.Eventually(t, 30*time.Second, func() bool { return z.status(a) == "refunded" && z.deferred(a) == 0 },
		"payment A to reach the refetched state, nothing left waiting")
	if captured, refunded := z.ledger(a); captured != -25000 || refunded != 25000 {
		t.Errorf("payment A ledger: captured %d refunded %d, want -25000 and 25000", captured, refunded)
	}

	// Down.
	b := "1b2c3d4e5f60718293a4b5c6d7e8f90a"
	z.gw.SetTransaction(b, zoopTransaction(mp, b, 1))
	z.gw.FailNext(3, http.StatusServiceUnavailable)
	z.deliver("evtB1", "transaction.succeeded", b)
	testenv.Eventually(t, 30*time.Second, func() bool { return z.status(b) == "paid" }, "payment B to be applied once the API answers")
	if n := z.gw.RequestsFor(b); n < 2 {
		t.Errorf("API saw %d requests for B, want the failed ones and a retry", n)
	}

	// Slow.
	c := "2c3d4e5f60718293a4b5c6d7e8f90a1b"
	z.gw.SetTransaction(c, zoopTransaction(mp, c, 1))
	before := z.refetches("error")
	z.gw.Delay(10 * time.Second)
	z.deliver("evtC1", "transaction.succeeded", c)
	testenv.Eventually(t, 30*time.Second, func() bool { return z.refetches("error") > before }, "a refetch of C to time out")
	if s := z.status(c); s == "paid" {
		t.Fatal("payment C applied while every answer was past the timeout")
	}
	z.gw.Delay(0)
	testenv.Eventually(t, 60*time.Second, func() bool { return z.status(c) == "paid" }, "payment C to be applied once the API is fast again")
}

// TestZoopRefetchRefusesAnAnswerAboutAnotherTransaction: Zoop's API (a
// misrouting proxy, a cache keyed wrongly, an API bug) answers the request
// for transaction L with transaction V's data — V's id, uri and history, a
// well-formed captured transaction. The processor parses answers with the
// driver's ParseRefetchFor, so the answer is unprocessable: L's event stays
// deferred (awaiting_refetch) and is retried every RefetchRetry, each
// refused refetch counted as outcome "error"; neither L nor V moves. Such
// refusals do not open the circuit breaker (an unprocessable answer is not
// the gateway being down), so once the API answers L correctly the waiting
// event applies, and a later event applies too.
func TestZoopRefetchRefusesAnAnswerAboutAnotherTransaction(t *testing.T) {
	z := startZoopPipeline(t, "2s")
	mp := z.gw.MarketplaceID()

	// V is a real payment, applied first: captured 250.00.
	v := "3d4e5f60718293a4b5c6d7e8f90a1b2c"
	z.gw.SetTransaction(v, zoopTransaction(mp, v, 1))
	z.deliver("evtV1", "transaction.succeeded", v)
	testenv.Eventually(t, 30*time.Second, func() bool { return z.status(v) == "paid" && z.deferred(v) == 0 }, "payment V to be applied")
	vTransitions := z.transitions(v)

	// The API answers for L with V's transaction, voided in part: applied
	// to L it would capture 250.00 and refund 50.00.
	l := "4e5f60718293a4b5c6d7e8f90a1b2c3d"
	z.gw.SetTransaction(l, zoopTransaction(mp, v, 2))
	before := z.refetches("error")
	z.deliver("evtL1", "transaction.succeeded", l)
	// Six refused refetches: past the five consecutive failures that would
	// open the breaker if refusals counted as failures.
	testenv.Eventually(t, 30*time.Second, func() bool {
		if s := z.status(l); s != "" {
			t.Fatalf("L moved to %s on transaction V's data", s)
		}
		return z.gw.RequestsFor(l) >= 6 && z.refetches("error")-before >= 6
	}, "L's refetch to be refused and retried")
	var status, reason string
	var attempts int
	if err := z.db.Pool.QueryRow(z.ctx, `SELECT status, COALESCE(reason, ''), attempts FROM deliveries WHERE event_id = 'evtL1'`).Scan(&status, &reason, &attempts); err != nil {
		t.Fatal(err)
	}
	if status != "deferred" || reason != "awaiting_refetch" || attempts < 2 {
		t.Errorf("L's delivery %s/%s after %d attempts, want deferred/awaiting_refetch, retried", status, reason, attempts)
	}
	if s, n := z.status(l), z.transitions(l); s != "" || n != 0 {
		t.Errorf("L moved on another transaction's answer: status %q, %d transitions", s, n)
	}
	if captured, refunded := z.ledger(l); captured != 0 || refunded != 0 {
		t.Errorf("L's ledger moved: captured %d refunded %d", captured, refunded)
	}
	if s, n := z.status(v), z.transitions(v); s != "paid" || n != vTransitions {
		t.Errorf("V changed by the answer served for L: %s, %d transitions (was paid, %d)", s, n, vTransitions)
	}
	t.Logf("L: %d requests, %d refused refetches, delivery attempts %d", z.gw.RequestsFor(l), int(z.refetches("error")-before), attempts)

	// The API answers L correctly: the waiting event applies (the breaker
	// never opened), then a later event applies too.
	z.gw.SetTransaction(l, zoopTransaction(mp, l, 1))
	testenv.Eventually(t, 30*time.Second, func() bool { return z.status(l) == "paid" && z.deferred(l) == 0 }, "L to apply once the API answers it")
	if n := z.refetches("breaker_open"); n != 0 {
		t.Errorf("%v refetches refused by an open breaker: unprocessable answers must not trip it", n)
	}
	z.gw.SetTransaction(l, zoopTransaction(mp, l, 2))
	z.deliver("evtL2", "transaction.void.succeeded", l)
	testenv.Eventually(t, 30*time.Second, func() bool { return z.status(l) == "partially_refunded" && z.deferred(l) == 0 }, "L's void to apply")
	if captured, refunded := z.ledger(l); captured != -25000 || refunded != 5000 {
		t.Errorf("L's ledger: captured %d refunded %d, want -25000 and 5000", captured, refunded)
	}
	if s, n := z.status(v), z.transitions(v); s != "paid" || n != vTransitions {
		t.Errorf("V changed: %s, %d transitions (was paid, %d)", s, n, vTransitions)
	}
}
