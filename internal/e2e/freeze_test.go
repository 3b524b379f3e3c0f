package e2e

import (
	"context"
	"fmt"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/paystream/paystream/internal/payment"
	"github.com/paystream/paystream/internal/provider"
	"github.com/paystream/paystream/internal/testenv"
)

// TestFrozenProcessorReleasesItsPartitions: of two processor subprocesses,
// one is stopped (SIGSTOP) while it holds a batch transaction open, with
// the partition's offset row locked. Its partitions must move to the other
// processor within the session timeout plus a few seconds: Postgres ends
// the frozen session after the idle-in-transaction timeout, so the other's
// claim gets the row. When the frozen one is continued, its commit fails
// (connection terminated, then fenced). Nothing is applied twice and
// stored offsets never go backwards. Before, the claim waited on the row
// lock for as long as the freeze lasted.
func TestFrozenProcessorReleasesItsPartitions(t *testing.T) {
	db := testenv.NewDB(t)
	brokers := testenv.Kafka(t)
	const partitions = 6
	raw := testenv.Topic(t, "raw", partitions)
	group := testenv.Group(t)
	const sessionTimeout = 6 * time.Second

	hs := genHistories(400)
	recs := historyRecords(t, raw, hs)
	frozenApp, liveApp := "ps-frozen-"+db.Schema, "ps-live-"+db.Schema
	// Their Postgres sessions named (application_name), so the test can find them.
	frozen := startProcessor(t, withAppName(t, db.URL, frozenApp), brokers, raw, group, frozenApp, "--log-level", "info")
	startProcessor(t, withAppName(t, db.URL, liveApp), brokers, raw, group, liveApp, "--log-level", "info")
	watch := watchOffsets(t, db.Pool, group, raw)

	// Filler payments (one event each) keep traffic flowing after the
	// histories, until the freeze is caught: there must always be a batch
	// transaction to catch, however slow the machine.
	fillers := make([]history, 3000)
	fillerRecs := make([]*kgo.Record, len(fillers))
	for i := range fillers {
		id := fmt.Sprintf("freeze_fill_%d", i)
		ev := provider.Event{EventID: "evt_" + id, DedupKey: "evt_" + id, PaymentID: id, Type: "payment.created",
			Fact: payment.Fact{Status: payment.StatusPending, AmountMinor: 100, Currency: "BRL", OccurredAt: time.Now().UTC()}}
		fillers[i] = history{key: "acme:" + id, id: id, events: []provider.Event{ev}}
		fillerRecs[i] = rawRecord(t, raw, "acme:"+id, ev)
	}
	stopFillers := make(chan struct{})

	// Traffic flows for the whole test, in small acked chunks.
	type producedResult struct {
		err     error
		fillers int // how many fillers were produced
	}
	produced := make(chan producedResult, 1)
	go func() {
		var err error
		for i := 0; i < len(recs) && err == nil; i += 20 {
			err = testenv.TryProduce(brokers, recs[i:min(i+20, len(recs))]...)
			time.Sleep(25 * time.Millisecond) // pacing the load, not synchronizing
		}
		n := 0
		for ; n < len(fillerRecs) && err == nil; n += 5 {
			select {
			case <-stopFillers:
				produced <- producedResult{err, n}
				return
			default:
			}
			err = testenv.TryProduce(brokers, fillerRecs[n:min(n+5, len(fillerRecs))]...)
			time.Sleep(25 * time.Millisecond)
		}
		produced <- producedResult{err, min(n, len(fillerRecs))}
	}()
	// Both processors own partitions once all six have a stored offset
	// and both have been seen writing in a transaction. Their transactions
	// are short: remember which one was seen, rather than wait for both at
	// one instant.
	seenInTx := map[string]bool{}
	testenv.Eventually(t, 60*time.Second, func() bool {
		for _, app := range []string{frozenApp, liveApp} {
			if !seenInTx[app] && count(t, db.Pool, `SELECT count(*) FROM pg_stat_activity WHERE application_name = $1 AND backend_xid IS NOT NULL`, app) > 0 {
				seenInTx[app] = true
			}
		}
		return len(seenInTx) == 2 &&
			count(t, db.Pool, `SELECT count(*) FROM consumer_offsets WHERE group_id = $1 AND next_offset > 0`, group) == partitions
	}, "both processors working on all partitions")

	// Stop the frozen one at a moment it holds a batch transaction with
	// row locks (a transaction ID): idle in transaction, as seen once it
	// is stopped and its in-flight statements are done, and still so, in
	// the same transaction, a second later. (Seen once, it may be the
	// instant before Postgres reads a COMMIT the processor sent just
	// before it stopped: that transaction then commits, and the woken
	// processor has nothing to fail.)
	holding := func() (pid int, state string) {
		err := db.Pool.QueryRow(context.Background(), `
			SELECT COALESCE(max(pid) FILTER (WHERE state = 'idle in transaction' AND backend_xid IS NOT NULL), 0),
			       COALESCE(string_agg(state, ',' ORDER BY state), '')
			  FROM pg_stat_activity WHERE application_name = $1`, frozenApp).Scan(&pid, &state)
		if err != nil {
			t.Fatal(err)
		}
		return pid, state
	}
	// stuck reports whether backend pid is still idle in the transaction
	// it was in a second ago.
	stuck := func(pid int) bool {
		xidOf := func() (xid string) {
			err := db.Pool.QueryRow(context.Background(), `
				SELECT COALESCE(max(backend_xid::text) FILTER (WHERE state = 'idle in transaction'), '')
				  FROM pg_stat_activity WHERE pid = $1`, pid).Scan(&xid)
			if err != nil {
				t.Fatal(err)
			}
			return xid
		}
		before := xidOf()
		time.Sleep(time.Second)
		return before != "" && xidOf() == before
	}
	var frozenPID int
	var stoppedAt time.Time
	catchBy := time.Now().Add(60 * time.Second)
	for attempt := 1; frozenPID == 0; attempt++ {
		if time.Now().After(catchBy) {
			t.Fatalf("never caught the processor with an open transaction in %d attempts", attempt-1)
		}
		if err := frozen.Cmd.Process.Signal(syscall.SIGSTOP); err != nil {
			t.Fatal(err)
		}
		stoppedAt = time.Now()
		var state string
		testenv.Eventually(t, 10*time.Second, func() bool {
			frozenPID, state = holding()
			return !strings.Contains(state, "active")
		}, "the stopped processor's statements to finish")
		if frozenPID != 0 && !stuck(frozenPID) {
			t.Logf("attempt %d: backend %d's transaction ended while the processor was stopped (its COMMIT was on the way); again", attempt, frozenPID)
			frozenPID = 0
		}
		if frozenPID == 0 {
			if err := frozen.Cmd.Process.Signal(syscall.SIGCONT); err != nil {
				t.Fatal(err)
			}
		} else {
			t.Logf("stopped the processor on attempt %d holding backend %d's transaction (sessions: %s)", attempt, frozenPID, state)
		}
	}

	close(stopFillers)

	// One more record per partition, then measure how long until every
	// partition has applied up to its end: the frozen one's partitions
	// only once the live processor owns them.
	var marks []*kgo.Record
	for p := range int32(partitions) {
		id := fmt.Sprintf("freeze_mark_%d", p)
		ev := provider.Event{EventID: "evt_" + id, DedupKey: "evt_" + id, PaymentID: id, Type: "payment.created",
			Fact: payment.Fact{Status: payment.StatusPending, AmountMinor: 100, Currency: "BRL", OccurredAt: time.Now().UTC()}}
		r := rawRecord(t, raw, "acme:"+id, ev)
		r.Partition = p
		marks = append(marks, r)
		hs = append(hs, history{key: "acme:" + id, id: id, events: []provider.Event{ev}})
	}
	produceManual(t, brokers, marks...)
	ends := testenv.EndOffsets(t, brokers, raw)
	testenv.WaitFor(t, sessionTimeout+30*time.Second, func() error {
		stored := testenv.StoredOffsets(t, db.Pool, group, raw)
		for p, end := range ends {
			if stored[p] < end {
				return fmt.Errorf("partition %d: stored offset %d, below %d", p, stored[p], end)
			}
		}
		return nil
	})
	stall := time.Since(stoppedAt)
	t.Logf("all %d partitions applied past the freeze %s after SIGSTOP (session timeout %s)", partitions, stall.Round(time.Millisecond), sessionTimeout)
	if pid, _ := holding(); pid == frozenPID {
		t.Errorf("the frozen processor's session %d still holds its transaction", frozenPID)
	}

	// Wake it: its commit must fail, and it must not write.
	if err := frozen.Cmd.Process.Signal(syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	woke := time.Now()
	for {
		s := frozen.Output.String()
		if strings.Contains(s, "partition fenced") || strings.Contains(s, "25P03") || strings.Contains(s, "57P01") {
			break
		}
		if time.Since(woke) > 60*time.Second {
			// Where is it? SIGQUIT makes the Go runtime write every
			// goroutine's stack to the log, printed by the cleanup.
			_ = frozen.Cmd.Process.Signal(syscall.SIGQUIT)
			time.Sleep(time.Second)
			t.Fatalf("the woken processor logged no failed or fenced commit within 60s (its goroutines are in its log)")
		}
		time.Sleep(100 * time.Millisecond)
	}
	res := <-produced
	if res.err != nil {
		t.Fatal(res.err)
	}
	hs = append(hs, fillers[:res.fillers]...)
	ends = testenv.EndOffsets(t, brokers, raw)
	testenv.WaitFor(t, 120*time.Second, func() error { return testenv.OffsetsBehind(t, db.Pool, group, raw, ends) })
	watch.check(t)
	if n, want := count(t, db.Pool, `SELECT count(*) FROM deliveries`), len(recs)+res.fillers+partitions; n != want {
		t.Errorf("delivery rows = %d, want one per record (%d)", n, want)
	}
	checkExactlyOnce(t, db.Pool, hs)
}

// produceManual produces recs to the partitions they name.
func produceManual(t *testing.T, brokers []string, recs ...*kgo.Record) {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.RecordPartitioner(kgo.ManualPartitioner()))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := cl.ProduceSync(ctx, recs...).FirstErr(); err != nil {
		t.Fatal(err)
	}
}
