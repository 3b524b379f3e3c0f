package processor

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/paystream/paystream/internal/envelope"
	"github.com/paystream/paystream/internal/payment"
	"github.com/paystream/paystream/internal/provider"
	"github.com/paystream/paystream/internal/provider/gatewaytest"
	"github.com/paystream/paystream/internal/provider/standardwebhooks"
	"github.com/paystream/paystream/internal/source"
	"github.com/paystream/paystream/internal/store"
	"github.com/paystream/paystream/internal/testenv"
)

// webhookRefetcher is the standardwebhooks driver's Refetcher, which reads
// a payment back from a gatewaytest.Gateway.
func webhookRefetcher(t *testing.T) provider.Refetcher {
	t.Helper()
	drv, err := standardwebhooks.New(provider.Config{Secrets: []string{"whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"}})
	if err != nil {
		t.Fatal(err)
	}
	r, ok := drv.(provider.Refetcher)
	if !ok {
		t.Fatal("standardwebhooks driver does not implement provider.Refetcher")
	}
	return r
}

// refetchSource is a "mp" source whose events are thin (NeedsRefetch) and
// are read back from gw.
func refetchSource(t *testing.T, gw *gatewaytest.Gateway, rate float64) map[string]*source.RefetchConfig {
	t.Helper()
	return map[string]*source.RefetchConfig{"mp": {
		Refetcher: webhookRefetcher(t), BaseURL: gw.URL(), Token: gw.Token(), Rate: rate, Burst: 1, Timeout: 5 * time.Second,
	}}
}

// thinRecord is a thin event of src for paymentID: no status, no amount,
// only that something changed.
func thinRecord(t *testing.T, src, topic string, partition int32, paymentID, eventID string) *kgo.Record {
	t.Helper()
	env := envelope.Raw{Source: src, Driver: "standardwebhooks", PaymentKey: src + ":" + paymentID, ReceivedAt: time.Now().UTC(), Body: []byte(`{}`),
		Event: provider.Event{EventID: eventID, DedupKey: eventID, PaymentID: paymentID, Type: "payment.updated", NeedsRefetch: true,
			Fact: payment.Fact{OccurredAt: time.Date(2026, 11, 2, 10, 0, 0, 0, time.UTC)}}}
	v, err := env.Marshal()
	if err != nil {
		t.Fatal(err)
	}
	return &kgo.Record{Topic: topic, Partition: partition, Key: []byte(env.PaymentKey), Value: v}
}

// paidRecord is an "acme" event (a source that does not refetch) saying
// paymentID was paid amount BRL cents.
func paidRecord(t *testing.T, topic string, partition int32, paymentID, eventID string, amount int64) *kgo.Record {
	t.Helper()
	f := payment.Fact{Status: payment.StatusPaid, AmountMinor: amount, Currency: "BRL", OccurredAt: time.Date(2026, 11, 2, 10, 0, 0, 0, time.UTC)}
	env := envelope.Raw{Source: "acme", Driver: "standardwebhooks", PaymentKey: "acme:" + paymentID, ReceivedAt: time.Now().UTC(), Body: []byte(`{}`),
		Event: provider.Event{EventID: eventID, DedupKey: eventID, PaymentID: paymentID, Type: "payment.paid", Fact: f}}
	v, err := env.Marshal()
	if err != nil {
		t.Fatal(err)
	}
	return &kgo.Record{Topic: topic, Partition: partition, Key: []byte(env.PaymentKey), Value: v}
}

// gatedTransport holds every request until open is closed (or the
// request is canceled): the test decides when the gateway starts answering.
type gatedTransport struct {
	next http.RoundTripper
	open chan struct{}
}

func (g gatedTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	select {
	case <-g.open:
	case <-req.Context().Done():
		return nil, req.Context().Err()
	}
	return g.next.RoundTrip(req)
}

// TestSlowGatewayDoesNotStallOtherPartitions: a refetching source keeps
// sending thin events on partitions 0 and 1 while another source's payments
// flow on partitions 2 and 3. Its gateway does not answer at all until the
// test lets it, then takes 2 s per request, rate limited. Every record of
// the other partitions must be applied while the refetches are pending,
// and the refetched payments must end as the gateway says.
//
// Refetching inside the worker's batch (before its transaction) held the
// partition's worker for as long as the gateway took; its fetch buffer
// filled, the shared poll loop blocked on it, and partitions 2 and 3 waited
// behind the gateway.
func TestSlowGatewayDoesNotStallOtherPartitions(t *testing.T) {
	f := setup(t, 4)
	gw := gatewaytest.New(t)
	gw.Delay(2 * time.Second)
	open := make(chan struct{})
	client := &http.Client{Transport: gatedTransport{next: gw.Client().Transport, open: open}}

	// Two mp payments per refetching partition, each receiving a thin
	// event every other round.
	const rounds, acmePerRound = 12, 10
	at := time.Date(2026, 11, 2, 10, 0, 0, 0, time.UTC)
	mpAmount := map[string]int64{}
	for part := range 2 {
		for k := range 2 {
			id := fmt.Sprintf("mp_%d_%d", part, k)
			mpAmount[id] = int64(1000 + 10*part + k)
			gw.SetPayment(id, gatewaytest.Payment{PaymentID: id, Status: "paid", Amount: mpAmount[id], Currency: "BRL", PaidAt: &at, UpdatedAt: at})
		}
	}
	mpTotal, acmeTotal := rounds*2, rounds*acmePerRound

	refetch := refetchSource(t, gw, 5)
	refetch["mp"].Timeout = 5 * time.Minute // the gate, not the timeout, decides when answers come
	p, err := New(f.db.Pool, Config{
		Brokers: f.brokers, Topic: f.topic, Group: testenv.Group(t), Registerer: prometheus.NewRegistry(), Logger: slogDiscard(),
		Refetch: refetch, RefetchRetry: time.Second, HTTPClient: client,
	})
	if err != nil {
		t.Fatal(err)
	}
	testenv.Start(t, "processor", p.Run)
	ctx := t.Context()

	// How far each source got: acme records applied, mp events settled
	// (refetched and decided, not waiting any more).
	measure := func() (acme, mp int) {
		_ = f.db.Pool.QueryRow(context.Background(), `
			SELECT (SELECT count(*) FROM deliveries WHERE source = 'acme' AND status = 'processed'),
			       (SELECT count(*) FROM deliveries WHERE source = 'mp' AND status IN ('processed', 'ignored'))`).Scan(&acme, &mp)
		return acme, mp
	}

	// Live traffic: each round, acmePerRound paid payments on partitions 2
	// and 3 and one thin event on each of partitions 0 and 1.
	cl, err := kgo.NewClient(kgo.SeedBrokers(f.brokers...), kgo.RecordPartitioner(kgo.ManualPartitioner()))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	for r := range rounds {
		var recs []*kgo.Record
		for part := range 2 {
			id := fmt.Sprintf("mp_%d_%d", part, r%2)
			recs = append(recs, thinRecord(t, "mp", f.topic, int32(part), id, fmt.Sprintf("evt_%s_%d", id, r)))
		}
		for i := range acmePerRound {
			id := fmt.Sprintf("acme_%d_%d", r, i)
			recs = append(recs, paidRecord(t, f.topic, int32(2+i%2), id, "evt_"+id, 500))
		}
		if err := cl.ProduceSync(ctx, recs...).FirstErr(); err != nil {
			t.Fatal(err)
		}
		time.Sleep(100 * time.Millisecond) // pacing the load, not synchronization
	}

	// The gateway has answered nothing yet: every refetch is pending.
	testenv.WaitFor(t, 60*time.Second, func() error {
		if acme, mp := measure(); acme != acmeTotal || mp != 0 {
			return fmt.Errorf("%d of %d acme records applied while mp refetches were pending (%d mp events settled)", acme, acmeTotal, mp)
		}
		return nil
	})
	acme, _ := measure()
	t.Logf("acme records applied while every mp refetch was pending: %d of %d", acme, acmeTotal)

	close(open)
	testenv.WaitFor(t, 120*time.Second, func() error {
		if _, mp := measure(); mp != mpTotal {
			return fmt.Errorf("%d of %d mp events settled", mp, mpTotal)
		}
		return nil
	})

	// The refetched payments are what the gateway says, captured once.
	for id, want := range mpAmount {
		var status string
		var amount, captured int64
		err := f.db.Pool.QueryRow(ctx, `
			SELECT status, amount_minor,
			       (SELECT COALESCE(sum(amount_minor), 0) FROM ledger_postings l WHERE l.payment_key = p.payment_key AND l.amount_minor > 0)
			  FROM payments p WHERE payment_key = $1`, "mp:"+id).Scan(&status, &amount, &captured)
		if err != nil {
			t.Fatalf("%s: %v", id, err)
		}
		if status != "paid" || amount != want || captured != want {
			t.Errorf("%s: %s, amount %d, captured %d; want paid, %d and %d", id, status, amount, captured, want, want)
		}
	}
	var processed int
	if err := f.db.Pool.QueryRow(ctx, `SELECT count(*) FROM deliveries WHERE source = 'mp' AND status = 'processed'`).Scan(&processed); err != nil {
		t.Fatal(err)
	}
	if processed != len(mpAmount) {
		t.Errorf("%d mp events processed, want %d: one per payment, the rest duplicates of its refetched state", processed, len(mpAmount))
	}
}

// sweeperFixture is a Processor (not running) whose "mp" source refetches
// from gw, and the thin event evt_x1 of payment pay_x, applied by a batch
// of partition 0 of "raw" and now deferred as awaiting_refetch.
func sweeperFixture(t *testing.T, db *testenv.DB, gw *gatewaytest.Gateway) (p *Processor, epoch int64, inboxID int64) {
	t.Helper()
	ctx := context.Background()
	at := time.Date(2026, 11, 2, 10, 0, 0, 0, time.UTC)
	gw.SetPayment("pay_x", gatewaytest.Payment{PaymentID: "pay_x", Status: "paid", Amount: 4200, Currency: "BRL", PaidAt: &at, UpdatedAt: at})
	p, err := New(db.Pool, Config{
		Brokers: []string{"unused:9092"}, Group: zombieGroup, Registerer: prometheus.NewRegistry(), Logger: slogDiscard(),
		Refetch: refetchSource(t, gw, 100), RefetchRetry: time.Hour, HTTPClient: gw.Client(),
	})
	if err != nil {
		t.Fatal(err)
	}
	epoch, _ = mustClaim(t, db.Pool)
	rec := thinRecord(t, "mp", zombieTopic, 0, "pay_x", "evt_x1")
	rec.Offset = 0
	if _, err := commitBatch(ctx, db.Pool, p.applier, zombieGroup, epoch, []*kgo.Record{rec}); err != nil {
		t.Fatal(err)
	}
	var status, reason string
	if err := db.Pool.QueryRow(ctx, `SELECT id, status, COALESCE(reason, '') FROM deliveries WHERE event_id = 'evt_x1'`).Scan(&inboxID, &status, &reason); err != nil {
		t.Fatal(err)
	}
	if status != "deferred" || reason != reasonAwaitingRefetch {
		t.Fatalf("evt_x1 = %s/%s after its batch, want deferred/%s", status, reason, reasonAwaitingRefetch)
	}
	return p, epoch, inboxID
}

// TestSweeperFencedByStaleEpoch: a sweeper runs with its worker's owner
// epoch. Once the partition is claimed again (a rebalance gave it to
// another processor), the old sweeper's transaction is fenced: it writes
// nothing and stops, and only the new owner's sweeper applies the answer.
// (The sweeper it replaces ran once per replica, with no epoch: every
// replica refetched and applied every due event.)
func TestSweeperFencedByStaleEpoch(t *testing.T) {
	db := testenv.NewDB(t)
	gw := gatewaytest.New(t)
	ctx := context.Background()
	p, oldEpoch, inboxID := sweeperFixture(t, db, gw)

	old := newSweeper(p, zombieTopic, 0, oldEpoch)
	newEpoch, _ := mustClaim(t, db.Pool) // the partition moves to a new owner

	go old.run()
	select {
	case <-old.done:
	case <-time.After(30 * time.Second):
		old.stop()
		t.Fatal("the fenced sweeper did not stop")
	}
	if gw.RequestsFor("pay_x") != 1 {
		t.Errorf("gateway saw %d requests for pay_x, want the old sweeper's one", gw.RequestsFor("pay_x"))
	}
	var status, reason string
	var transitions int
	if err := db.Pool.QueryRow(ctx, `
		SELECT status, COALESCE(reason, ''), (SELECT count(*) FROM payment_transitions WHERE payment_key = 'mp:pay_x')
		  FROM deliveries WHERE id = $1`, inboxID).Scan(&status, &reason, &transitions); err != nil {
		t.Fatal(err)
	}
	if status != "deferred" || reason != reasonAwaitingRefetch || transitions != 0 {
		t.Fatalf("after the stale sweeper: evt_x1 %s/%s with %d transitions, want it untouched", status, reason, transitions)
	}
	if got := testutil.ToFloat64(p.metrics.fenced); got != 1 {
		t.Errorf("fenced = %v, want 1", got)
	}

	cur := newSweeper(p, zombieTopic, 0, newEpoch)
	if _, err := cur.sweep(ctx); err != nil {
		t.Fatalf("the owner's sweep: %v", err)
	}
	var pstatus string
	var amount int64
	if err := db.Pool.QueryRow(ctx, `
		SELECT i.status, p.status, p.amount_minor FROM deliveries i JOIN payments p ON p.payment_key = i.payment_key
		 WHERE i.id = $1`, inboxID).Scan(&status, &pstatus, &amount); err != nil {
		t.Fatal(err)
	}
	if status != "processed" || pstatus != "paid" || amount != 4200 {
		t.Errorf("after the owner's sweep: evt_x1 %s, payment %s %d; want processed, paid 4200", status, pstatus, amount)
	}
}

// TestOutcomeGuardRefusesChangedRow: an inbox outcome is written only if
// the row still has the status its writer read. Here another writer
// settles the event between the sweeper-style read and the write: the
// write fails with ErrOutcomeChanged and the other writer's outcome stays.
// (The unguarded UPDATE overwrote it, and the payment moved a second time.)
func TestOutcomeGuardRefusesChangedRow(t *testing.T) {
	db := testenv.NewDB(t)
	gw := gatewaytest.New(t)
	ctx := context.Background()
	p, _, inboxID := sweeperFixture(t, db, gw)
	facts, err := p.refetch.fetch(ctx, "mp", "pay_x")
	if err != nil {
		t.Fatal(err)
	}
	stored, err := store.LoadDelivery(ctx, db.Pool, inboxID)
	if err != nil {
		t.Fatal(err)
	}
	env, err := stored.Envelope()
	if err != nil {
		t.Fatal(err)
	}
	// Read as deferred; meanwhile an operator (or another writer) settles it.
	d := delivery{env: env, inboxID: inboxID, status: "deferred", refetched: facts}
	if _, err := db.Pool.Exec(ctx, `UPDATE deliveries SET status = 'ignored', reason = 'skipped_by_operator' WHERE id = $1`, inboxID); err != nil {
		t.Fatal(err)
	}
	tx, err := store.BeginBatch(ctx, db.Pool, store.BatchLock{}, store.Reads{})
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx) //nolint:errcheck // rolled back on purpose
	payments := map[string]*paymentRow{"mp:pay_x": {key: "mp:pay_x", source: "mp", paymentID: "pay_x"}}
	w, _, err := p.applier.decide([]delivery{d}, payments)
	if err != nil {
		t.Fatal(err)
	}
	if err := tx.Write(ctx, w); !errors.Is(err, ErrOutcomeChanged) {
		t.Fatalf("write over a changed row: %v, want ErrOutcomeChanged", err)
	}
	_ = tx.Rollback(ctx)
	status, reason := deliveryOutcome(t, db.Pool, `id = $1`, inboxID)
	if status != "ignored" || reason != "skipped_by_operator" {
		t.Errorf("evt_x1 = %s/%s, want the other writer's ignored/skipped_by_operator", status, reason)
	}
}

// TestThinFactNeverResumed: an event awaiting its refetch is not a waiting
// fact. When a later event of the same payment applies, the thin event's
// own (unverified) fact must not be resumed with it; it keeps waiting for
// the sweeper. (It was resumed, and a forged "paid" moved money.)
func TestThinFactNeverResumed(t *testing.T) {
	db := testenv.NewDB(t)
	ctx := context.Background()
	epoch, _ := mustClaim(t, db.Pool)
	at := time.Date(2026, 11, 2, 10, 0, 0, 0, time.UTC)
	thin := thinRecord(t, "mp", zombieTopic, 0, "pay_y", "evt_y1")
	env, err := envelope.DecodeRaw(thin.Value)
	if err != nil {
		t.Fatal(err)
	}
	// What the unsigned body claims.
	env.Event.Fact = payment.Fact{Status: payment.StatusPaid, AmountMinor: 999_999, Currency: "BRL", OccurredAt: at.Add(time.Hour)}
	if thin.Value, err = env.Marshal(); err != nil {
		t.Fatal(err)
	}
	env.Event = provider.Event{EventID: "evt_y2", DedupKey: "evt_y2", PaymentID: "pay_y", Type: "payment.pending",
		Fact: payment.Fact{Status: payment.StatusPending, AmountMinor: 100, Currency: "BRL", OccurredAt: at}}
	v, err := env.Marshal()
	if err != nil {
		t.Fatal(err)
	}
	a := &applier{now: time.Now}
	thin.Offset = 0
	if _, err := commitBatch(ctx, db.Pool, a, zombieGroup, epoch, []*kgo.Record{thin}); err != nil {
		t.Fatal(err)
	}
	pending := &kgo.Record{Topic: zombieTopic, Partition: 0, Offset: 1, Key: thin.Key, Value: v}
	if _, err := commitBatch(ctx, db.Pool, a, zombieGroup, epoch, []*kgo.Record{pending}); err != nil {
		t.Fatal(err)
	}
	var status, reason, pstatus string
	if err := db.Pool.QueryRow(ctx, `
		SELECT i.status, COALESCE(i.reason, ''), p.status FROM deliveries i JOIN payments p ON p.payment_key = i.payment_key
		 WHERE i.event_id = 'evt_y1'`).Scan(&status, &reason, &pstatus); err != nil {
		t.Fatal(err)
	}
	if status != "deferred" || reason != reasonAwaitingRefetch || pstatus != "pending" {
		t.Errorf("thin evt_y1 = %s/%s, payment %s; want deferred/%s and pending", status, reason, pstatus, reasonAwaitingRefetch)
	}
}

// TestFrozenSweeperIsEndedByPostgres: the sweeper applies a refetched
// answer in a transaction that locks its partition's offset row, like a
// batch. A sweeper that freezes there must have its session ended by
// Postgres after the idle-in-transaction timeout, as a frozen batch's is,
// so the partition's worker and next owner go on. Before, the sweeper's
// transaction set no server-side bound: the row stayed locked for as long
// as the freeze lasted.
func TestFrozenSweeperIsEndedByPostgres(t *testing.T) {
	db := testenv.NewDB(t)
	gw := gatewaytest.New(t)
	p, epoch, _ := sweeperFixture(t, db, gw)
	fz, pool := freezingPool(t, db, "ORDER BY partition FOR UPDATE")
	p.pool = pool
	s := newSweeper(p, zombieTopic, 0, epoch)
	fz.armed.Store(true)
	swept := make(chan error, 1)
	go func() {
		_, err := s.sweep(context.Background())
		swept <- err
	}()
	pid := fz.waitFrozen(t)
	took := waitSessionEnded(t, db, pid, 30*time.Second)
	t.Logf("frozen sweeper session ended by Postgres %v after it locked the partition (default idle-in-transaction timeout 5s)", took.Round(100*time.Millisecond))
	fz.thaw()
	<-swept
	var status string
	if err := db.Pool.QueryRow(context.Background(), `SELECT status FROM deliveries WHERE event_id = 'evt_x1'`).Scan(&status); err != nil {
		t.Fatal(err)
	}
	if status != "deferred" {
		t.Errorf("evt_x1 = %s after the frozen sweep was ended, want still deferred (its transaction rolled back)", status)
	}
}
