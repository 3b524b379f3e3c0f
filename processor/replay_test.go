package processor

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/paystream/paystream/internal/envelope"
	"github.com/paystream/paystream/internal/payment"
	"github.com/paystream/paystream/internal/provider"
	"github.com/paystream/paystream/internal/testenv"
)

func replayRecord(t *testing.T, offset int64, paymentID, eventID string, f payment.Fact) *kgo.Record {
	t.Helper()
	env := envelope.Raw{Source: "acme", Driver: "standardwebhooks", PaymentKey: "acme:" + paymentID, ReceivedAt: time.Now().UTC(), Body: []byte(`{}`),
		Event: provider.Event{EventID: eventID, DedupKey: eventID, PaymentID: paymentID, Type: "payment." + string(f.Status), Fact: f}}
	v, err := env.Marshal()
	if err != nil {
		t.Fatal(err)
	}
	return &kgo.Record{Topic: "raw", Partition: 0, Offset: offset, Key: []byte(env.PaymentKey), Value: v}
}

// buggyDB returns a schema where Postgres refuses every transition of
// acme:pay_bad (the "bug" a fix later removes: DROP TRIGGER refuse_bad),
// after running more (SQL, may be empty), and partition 0 of "raw" claimed
// for group "g" at the returned epoch.
func buggyDB(t *testing.T, more string) (*testenv.DB, int64) {
	t.Helper()
	db := testenv.NewDB(t)
	if _, err := db.Pool.Exec(t.Context(), `
		CREATE FUNCTION refuse_bad() RETURNS trigger LANGUAGE plpgsql AS $$
		BEGIN
			IF NEW.payment_key = 'acme:pay_bad' THEN RAISE EXCEPTION 'simulated bug' USING ERRCODE = 'check_violation', CONSTRAINT = 'simulated_bug'; END IF;
			RETURN NEW;
		END $$;
		CREATE TRIGGER refuse_bad BEFORE INSERT ON payment_transitions FOR EACH ROW EXECUTE FUNCTION refuse_bad();`+more); err != nil {
		t.Fatal(err)
	}
	epoch, _, _, err := claim(t.Context(), db.Pool, "g", "raw", 0)
	if err != nil {
		t.Fatal(err)
	}
	return db, epoch
}

// checkReplayedBad fails the test unless the replay of acme:pay_bad
// applied its held events: partially refunded at version 2, not held.
func checkReplayedBad(t *testing.T, pool *pgxpool.Pool) {
	t.Helper()
	var st string
	var version int64
	var held bool
	if err := pool.QueryRow(t.Context(), `SELECT status, version, held FROM payments WHERE payment_key = 'acme:pay_bad'`).Scan(&st, &version, &held); err != nil {
		t.Fatal(err)
	}
	if st != "partially_refunded" || version != 2 || held {
		t.Errorf("pay_bad = %s v%d held=%v, want partially_refunded v2 not held", st, version, held)
	}
}

// TestReplayAppliesHeldPaymentOnce: a record that fails deterministically is
// quarantined and its payment held while other payments flow; later events
// of the held payment wait; after the fix, Replay applies them all exactly
// once, and a second Replay has nothing to do.
func TestReplayAppliesHeldPaymentOnce(t *testing.T) {
	db, epoch := buggyDB(t, "")
	ctx := context.Background()
	at := time.Date(2026, 11, 1, 12, 0, 0, 0, time.UTC)
	paid := payment.Fact{Status: payment.StatusPaid, AmountMinor: 500, Currency: "BRL", OccurredAt: at}
	refund := payment.Fact{Status: payment.StatusPartiallyRefunded, AmountMinor: 100, Currency: "BRL", RefundID: "re_1", OccurredAt: at.Add(time.Hour)}
	recs := []*kgo.Record{
		replayRecord(t, 0, "pay_bad", "e1", paid),
		replayRecord(t, 1, "pay_ok", "e2", paid),
		replayRecord(t, 2, "pay_bad", "e3", refund),
	}
	a := &applier{now: time.Now}
	out, err := commitBatch(ctx, db.Pool, a, "g", epoch, recs)
	if err != nil {
		t.Fatalf("commitBatch: %v", err)
	}
	if !out.slow || out.next != 3 {
		t.Fatalf("batch: slow=%v next=%d, want a record-by-record batch ending at 3", out.slow, out.next)
	}
	status := func(eventID string) (s, reason string) {
		t.Helper()
		return deliveryOutcome(t, db.Pool, `event_id = $1 OR (event_id IS NULL AND dedup_key = $1)`, eventID)
	}
	if s, _ := status("e1"); s != "quarantined" {
		t.Errorf("e1 = %s, want quarantined", s)
	}
	if s, _ := status("e2"); s != "processed" {
		t.Errorf("e2 (another payment, same partition) = %s, want processed", s)
	}
	if s, r := status("e3"); s != "deferred" || r != reasonPaymentHeld {
		t.Errorf("e3 = %s/%s, want deferred/%s", s, r, reasonPaymentHeld)
	}

	// Replay before the fix changes nothing.
	if _, err := Replay(ctx, db.Pool, "acme:pay_bad", ReplayOptions{}); err == nil {
		t.Fatal("Replay before the fix succeeded")
	}
	if s, _ := status("e1"); s != "quarantined" {
		t.Errorf("after failed replay e1 = %s, want quarantined", s)
	}

	if _, err := db.Pool.Exec(ctx, `DROP TRIGGER refuse_bad ON payment_transitions`); err != nil {
		t.Fatal(err)
	}
	report, err := Replay(ctx, db.Pool, "acme:pay_bad", ReplayOptions{})
	if err != nil {
		t.Fatalf("Replay: %v", err)
	}
	if report.Replayed["processed"] != 2 {
		t.Errorf("replay report %v, want 2 processed", report.Replayed)
	}
	checkReplayedBad(t, db.Pool)
	var postings int
	if err := db.Pool.QueryRow(ctx, `SELECT count(*) FROM ledger_postings WHERE payment_key = 'acme:pay_bad'`).Scan(&postings); err != nil {
		t.Fatal(err)
	}
	if postings != 4 {
		t.Errorf("pay_bad postings = %d, want 4 (capture and refund, two legs each)", postings)
	}
	if _, err := Replay(ctx, db.Pool, "acme:pay_bad", ReplayOptions{}); !errors.Is(err, ErrNotHeld) {
		t.Errorf("second Replay = %v, want ErrNotHeld", err)
	}
	// The batch's records are all below the stored offset now: re-running
	// it (a redelivery after a crash) applies nothing.
	again, err := commitBatch(ctx, db.Pool, a, "g", epoch, recs)
	if err != nil || again.applied != 0 {
		t.Errorf("re-commit = %+v, %v; want nothing applied", again, err)
	}
}

// TestReplayRollsBackWhenAnEventChanges: Replay runs outside the consumer
// group, beside the processors. If another writer decides one of the
// payment's events between Replay's read and its write, Replay must not
// overwrite that outcome: it rolls back everything (the hold stays) and
// says so with ErrOutcomeChanged. The other writer here holds the event's
// row lock, so Replay's write waits for it and then finds the row changed.
func TestReplayRollsBackWhenAnEventChanges(t *testing.T) {
	// pay_bad's first event is quarantined (Postgres refuses its
	// transition), so the payment is held and its refund waits.
	db, epoch := buggyDB(t, "")
	ctx := context.Background()
	at := time.Date(2026, 11, 1, 12, 0, 0, 0, time.UTC)
	recs := []*kgo.Record{
		replayRecord(t, 0, "pay_bad", "e1", payment.Fact{Status: payment.StatusPaid, AmountMinor: 500, Currency: "BRL", OccurredAt: at}),
		replayRecord(t, 1, "pay_bad", "e2", payment.Fact{Status: payment.StatusPartiallyRefunded, AmountMinor: 100, Currency: "BRL", RefundID: "re_1", OccurredAt: at.Add(time.Hour)}),
	}
	if _, err := commitBatch(ctx, db.Pool, &applier{now: time.Now}, "g", epoch, recs); err != nil {
		t.Fatal(err)
	}
	if _, err := db.Pool.Exec(ctx, `DROP TRIGGER refuse_bad ON payment_transitions`); err != nil {
		t.Fatal(err)
	}
	var quarantined int64
	if err := db.Pool.QueryRow(ctx, `SELECT id FROM deliveries WHERE status = 'quarantined'`).Scan(&quarantined); err != nil {
		t.Fatal(err)
	}

	// The other writer locks the quarantined event's row.
	other, err := db.Pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer other.Rollback(ctx) //nolint:errcheck // committed below, or rolled back on failure
	var otherPID int32
	if err := other.QueryRow(ctx, `SELECT pg_backend_pid()`).Scan(&otherPID); err != nil {
		t.Fatal(err)
	}
	if _, err := other.Exec(ctx, `SELECT 1 FROM deliveries WHERE id = $1 FOR UPDATE`, quarantined); err != nil {
		t.Fatal(err)
	}
	replayed := make(chan error, 1)
	go func() {
		_, err := Replay(ctx, db.Pool, "acme:pay_bad", ReplayOptions{})
		replayed <- err
	}()
	// Replay has read the events and waits to write the locked one.
	testenv.Eventually(t, 30*time.Second, func() bool {
		var n int
		_ = db.Pool.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE $1 = ANY(pg_blocking_pids(pid))`, otherPID).Scan(&n)
		return n > 0
	}, "Replay to wait for the event's row lock")
	if _, err := other.Exec(ctx, `UPDATE deliveries SET status = 'ignored', reason = 'skipped_by_operator' WHERE id = $1`, quarantined); err != nil {
		t.Fatal(err)
	}
	if err := other.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-replayed:
		if !errors.Is(err, ErrOutcomeChanged) {
			t.Fatalf("Replay = %v, want ErrOutcomeChanged", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("Replay did not return")
	}

	var held bool
	var transitions int
	if err := db.Pool.QueryRow(ctx, `
		SELECT held, (SELECT count(*) FROM payment_transitions WHERE payment_key = 'acme:pay_bad')
		  FROM payments WHERE payment_key = 'acme:pay_bad'`).Scan(&held, &transitions); err != nil {
		t.Fatal(err)
	}
	if !held || transitions != 0 {
		t.Errorf("after the rolled-back replay: held=%v, %d transitions; want still held, none", held, transitions)
	}
	status, reason := deliveryOutcome(t, db.Pool, `id = $1`, quarantined)
	if status != "ignored" || reason != "skipped_by_operator" {
		t.Errorf("e1 = %s/%s, want the other writer's ignored/skipped_by_operator", status, reason)
	}
}

// TestReplayWaitsForABatchInFlight: batches read a payment without a row
// lock; what serializes the writers of a payment is its partition's offset
// row, which Replay (outside the consumer group) must take too. Here a
// batch has read the held payment and decided its new refund as
// deferred:payment_held, and is stopped (by a test trigger) just before
// writing; Replay runs meanwhile. Were Replay not to wait for the batch,
// it would release the hold and apply the quarantined payment without
// seeing the refund, which the batch then commits as waiting for a hold
// that no longer exists: a lost update that leaves the refund deferred
// forever. Replay must wait, then apply both.
func TestReplayWaitsForABatchInFlight(t *testing.T) {
	const gate = 7_304_221 // advisory lock key: the test holds it, the batch waits for it
	db, epoch := buggyDB(t, `
		CREATE FUNCTION gate() RETURNS trigger LANGUAGE plpgsql AS $$
		BEGIN
			IF NEW.event_id = 'e2' THEN PERFORM pg_advisory_xact_lock_shared(`+fmt.Sprint(gate)+`); END IF;
			RETURN NEW;
		END $$;
		CREATE TRIGGER gate BEFORE INSERT ON deliveries FOR EACH ROW EXECUTE FUNCTION gate();`)
	ctx := context.Background()
	at := time.Date(2026, 11, 1, 12, 0, 0, 0, time.UTC)
	a := &applier{now: time.Now}
	paid := replayRecord(t, 0, "pay_bad", "e1", payment.Fact{Status: payment.StatusPaid, AmountMinor: 500, Currency: "BRL", OccurredAt: at})
	if _, err := commitBatch(ctx, db.Pool, a, "g", epoch, []*kgo.Record{paid}); err != nil {
		t.Fatal(err)
	}
	if _, err := db.Pool.Exec(ctx, `DROP TRIGGER refuse_bad ON payment_transitions`); err != nil {
		t.Fatal(err)
	}

	gateConn, err := db.Pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer gateConn.Release()
	if _, err := gateConn.Exec(ctx, `SELECT pg_advisory_lock($1)`, gate); err != nil {
		t.Fatal(err)
	}
	unlocked := false
	unlock := func() {
		if !unlocked {
			unlocked = true
			if _, err := gateConn.Exec(ctx, `SELECT pg_advisory_unlock($1)`, gate); err != nil {
				t.Error(err)
			}
		}
	}
	defer unlock()

	refund := replayRecord(t, 1, "pay_bad", "e2", payment.Fact{Status: payment.StatusPartiallyRefunded, AmountMinor: 100, Currency: "BRL", RefundID: "re_1", OccurredAt: at.Add(time.Hour)})
	batched := make(chan error, 1)
	go func() {
		_, err := commitBatch(ctx, db.Pool, a, "g", epoch, []*kgo.Record{refund})
		batched <- err
	}()
	// The batch has read the payment (held) and waits at the gate.
	var batchPID int32
	testenv.Eventually(t, 30*time.Second, func() bool {
		err := db.Pool.QueryRow(ctx, `
			SELECT pid FROM pg_locks
			 WHERE locktype = 'advisory' AND NOT granted AND objid = $1
			   AND database = (SELECT oid FROM pg_database WHERE datname = current_database())`, gate).Scan(&batchPID)
		return err == nil
	}, "the batch to wait at the gate")

	replayed := make(chan error, 1)
	go func() {
		_, err := Replay(ctx, db.Pool, "acme:pay_bad", ReplayOptions{})
		replayed <- err
	}()
	// Either Replay waits for the batch (right) or it finishes without
	// it (the lost update).
	var replayErr error
	replayDone := false
	testenv.Eventually(t, 30*time.Second, func() bool {
		select {
		case replayErr = <-replayed:
			replayDone = true
			return true
		default:
		}
		var n int
		_ = db.Pool.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE $1 = ANY(pg_blocking_pids(pid))`, batchPID).Scan(&n)
		return n > 0
	}, "Replay to wait for the batch, or to finish")
	unlock()
	if err := <-batched; err != nil {
		t.Fatalf("batch: %v", err)
	}
	if !replayDone {
		replayErr = <-replayed
	}
	if replayErr != nil {
		t.Fatalf("Replay: %v", replayErr)
	}

	checkReplayedBad(t, db.Pool)
	status, reason := deliveryOutcome(t, db.Pool, `event_id = 'e2'`)
	if status != "processed" {
		t.Errorf("e2 (the refund) = %s/%s, want processed: Replay did not wait for the batch deciding it", status, reason)
	}
}

// TestFrozenReplayIsEndedByPostgres: Replay locks every partition's offset
// row for its transaction. A replay that freezes there (the operator's
// shell suspended, its network cut) must have its session ended by
// Postgres after the idle-in-transaction timeout, as a frozen batch's is,
// so the partitions' workers go on. Before, Replay set no server-side
// bound: the frozen session kept every partition's row, stalling every
// worker, for as long as the freeze lasted.
func TestFrozenReplayIsEndedByPostgres(t *testing.T) {
	db := testenv.NewDB(t)
	ctx := context.Background()
	for partition := range int32(2) {
		if _, err := claimIncarnation(ctx, db.Pool, "g", "raw", partition, ""); err != nil {
			t.Fatal(err)
		}
	}
	fz, pool := freezingPool(t, db, "FROM consumer_offsets ORDER BY group_id")
	fz.armed.Store(true)
	replayed := make(chan error, 1)
	go func() {
		_, err := Replay(ctx, pool, "acme:pay_frozen", ReplayOptions{})
		replayed <- err
	}()
	pid := fz.waitFrozen(t)
	took := waitSessionEnded(t, db, pid, 30*time.Second)
	t.Logf("frozen replay session ended by Postgres %v after it locked every partition (default idle-in-transaction timeout 5s)", took.Round(100*time.Millisecond))
	fz.thaw()
	if err := <-replayed; err == nil {
		t.Error("the thawed replay succeeded; its session was ended, so it must fail")
	}
}
