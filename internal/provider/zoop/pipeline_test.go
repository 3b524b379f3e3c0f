package zoop

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
	"github.com/paystream/paystream/internal/source"
	"github.com/paystream/paystream/internal/testenv"
	"github.com/paystream/paystream/processor"
)

// TestRefetchThroughProcessor runs Zoop events through the real processor
// (real Kafka, real Postgres) with the source's refetch configuration
// loaded from a sources file, against a real HTTP server playing Zoop's
// API, so the processor's rate limiter, timeout and circuit breaker sit
// between them:
//
//   - API up: a payment's five webhooks, in a random order and some
//     redelivered, move no money on their own; the refetches leave it
//     refunded with the ledger of a 250.00 capture refunded in full, and
//     no delivery waiting;
//   - API down: the event waits (deferred) while the API fails and is
//     applied once it answers;
//   - API slow: a refetch slower than refetch_timeout fails (the metric
//     counts it) and the event is applied once the API is fast again.
func TestRefetchThroughProcessor(t *testing.T) {
	db := testenv.NewDB(t)
	brokers := testenv.Kafka(t)
	topic := testenv.Topic(t, "raw", 2)
	gw := gatewaytest.NewZoop(t)
	src := zoopSource(t, gw, "300ms")

	reg := prometheus.NewRegistry()
	p, err := processor.New(db.Pool, processor.Config{
		Brokers: brokers, Topic: topic, Group: testenv.Group(t), Registerer: reg,
		Refetch:      map[string]*source.RefetchConfig{src.Name: src.Refetch},
		RefetchRetry: 200 * time.Millisecond,
		HTTPClient:   gw.Client(),
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { defer wg.Done(); _ = p.Run(ctx) }()
	t.Cleanup(func() { cancel(); wg.Wait() })

	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cl.Close)
	// deliver verifies and parses a webhook with the source's driver, as
	// ingest does, and produces its envelope to the raw topic.
	deliver := func(eventID, typ, txID string) {
		t.Helper()
		body := fmt.Appendf(nil, `{"id":%q,"type":%q,"resource":"event","payload":{"object":{"id":%q,"resource":"transaction","status":"succeeded","amount":"999.99"}},"created_at":"2026-11-02T10:00:00+0000"}`, eventID, typ, txID)
		req := &provider.Request{Header: http.Header{HeaderAuthorization: {Sign(oldSecret)}}, Query: url.Values{}, Body: body, Now: time.Now()}
		if err := src.Driver.Verify(req); err != nil {
			t.Fatal(err)
		}
		ev, err := src.Driver.Parse(req)
		if err != nil {
			t.Fatal(err)
		}
		env := envelope.Raw{Source: src.Name, Driver: src.DriverName, PaymentKey: src.PaymentKey(ev.PaymentID), ReceivedAt: time.Now().UTC(), Body: body, Event: ev}
		v, err := env.Marshal()
		if err != nil {
			t.Fatal(err)
		}
		if err := cl.ProduceSync(ctx, &kgo.Record{Topic: topic, Key: []byte(env.PaymentKey), Value: v}).FirstErr(); err != nil {
			t.Fatal(err)
		}
	}
	status := func(txID string) string {
		var s string
		_ = db.Pool.QueryRow(ctx, `SELECT status FROM payments WHERE payment_key = $1`, src.PaymentKey(txID)).Scan(&s)
		return s
	}
	deferred := func(txID string) int {
		var n int
		if err := db.Pool.QueryRow(ctx, `SELECT count(*) FROM deliveries WHERE payment_key = $1 AND status = 'deferred'`, src.PaymentKey(txID)).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}

	// Up.
	a := "0a1b2c3d4e5f60718293a4b5c6d7e8f9"
	gw.SetTransaction(a, transaction(gw, a, 3))
	webhooks := [][2]string{
		{"evtA0", "transaction.pre_authorized"}, {"evtA1", "transaction.capture.succeeded"}, {"evtA2", "transaction.succeeded"},
		{"evtA3", "transaction.void.succeeded"}, {"evtA4", "transaction.canceled"},
	}
	r := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 3))
	order := append(r.Perm(len(webhooks)), r.IntN(len(webhooks)), r.IntN(len(webhooks)))
	t.Logf("delivery order %v", order)
	for _, i := range order {
		deliver(webhooks[i][0], webhooks[i][1], a)
	}
	testenv.Eventually(t, 30*time.Second, func() bool { return status(a) == "refunded" && deferred(a) == 0 },
		"payment A to reach the refetched state, nothing left waiting")
	var captured, refunded int64
	if err := db.Pool.QueryRow(ctx, `
		SELECT COALESCE(sum(amount_minor) FILTER (WHERE account = 'merchant_payable' AND amount_minor < 0), 0),
		       COALESCE(sum(amount_minor) FILTER (WHERE account = 'merchant_payable' AND amount_minor > 0), 0)
		  FROM ledger_postings WHERE payment_key = $1`, src.PaymentKey(a)).Scan(&captured, &refunded); err != nil {
		t.Fatal(err)
	}
	if captured != -25000 || refunded != 25000 {
		t.Errorf("payment A ledger: captured %d refunded %d, want -25000 and 25000", captured, refunded)
	}

	// Down.
	b := "1b2c3d4e5f60718293a4b5c6d7e8f90a"
	gw.SetTransaction(b, transaction(gw, b, 1))
	gw.FailNext(3, http.StatusServiceUnavailable)
	deliver("evtB1", "transaction.succeeded", b)
	testenv.Eventually(t, 30*time.Second, func() bool { return status(b) == "paid" }, "payment B to be applied once the API answers")
	if n := gw.RequestsFor(b); n < 2 {
		t.Errorf("API saw %d requests for B, want the failed ones and a retry", n)
	}

	// Slow.
	c := "2c3d4e5f60718293a4b5c6d7e8f90a1b"
	gw.SetTransaction(c, transaction(gw, c, 1))
	before := refetchErrors(t, reg)
	gw.Delay(10 * time.Second)
	deliver("evtC1", "transaction.succeeded", c)
	testenv.Eventually(t, 30*time.Second, func() bool { return refetchErrors(t, reg) > before }, "a refetch of C to time out")
	if s := status(c); s == "paid" {
		t.Fatal("payment C applied while every answer was past the timeout")
	}
	gw.Delay(0)
	testenv.Eventually(t, 60*time.Second, func() bool { return status(c) == "paid" }, "payment C to be applied once the API is fast again")
}

// refetchErrors reads paystream_processor_refetches_total{source="zoop",
// outcome="error"} from reg.
func refetchErrors(t *testing.T, reg *prometheus.Registry) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
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
			if labels["source"] == "zoop" && labels["outcome"] == "error" {
				n += m.GetCounter().GetValue()
			}
		}
	}
	return n
}
