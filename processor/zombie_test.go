package processor

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/paystream/paystream/internal/envelope"
	"github.com/paystream/paystream/internal/payment"
	"github.com/paystream/paystream/internal/provider"
	"github.com/paystream/paystream/internal/store"
	"github.com/paystream/paystream/internal/testenv"
)

// The zombie tests: two workers believe they own one partition. Postgres
// decides: each claim bumps the partition's owner epoch, and a batch commits
// only if the epoch it holds is still the partition's. No Kafka is needed:
// commitBatch takes records built by hand.

const (
	zombieGroup = "g"
	zombieTopic = "raw"
)

// zombieRecords are n records on partition 0 starting at offset 0: two
// payments (pending, paid, partial refund each), so each record has effects
// (a transition; money for paid and refund).
func zombieRecords(t *testing.T, n int) []*kgo.Record {
	t.Helper()
	at := time.Date(2026, 11, 4, 8, 0, 0, 0, time.UTC)
	facts := []payment.Fact{
		{Status: payment.StatusPending, AmountMinor: 900, Currency: "BRL"},
		{Status: payment.StatusPaid, AmountMinor: 900, Currency: "BRL"},
		{Status: payment.StatusPartiallyRefunded, AmountMinor: 100, Currency: "BRL", RefundID: "re_1"},
	}
	recs := make([]*kgo.Record, n)
	for i := range recs {
		paymentID := fmt.Sprintf("pay_%d", i%2)
		f := facts[(i/2)%len(facts)]
		f.OccurredAt = at.Add(time.Duration(i) * time.Minute)
		id := fmt.Sprintf("evt_%d", i)
		env := envelope.Raw{Source: "acme", Driver: "standardwebhooks", PaymentKey: "acme:" + paymentID, ReceivedAt: at, Body: []byte(`{}`),
			Event: provider.Event{EventID: id, DedupKey: id, PaymentID: paymentID, Type: "payment." + string(f.Status), Fact: f}}
		v, err := env.Marshal()
		if err != nil {
			t.Fatal(err)
		}
		recs[i] = &kgo.Record{Topic: zombieTopic, Partition: 0, Offset: int64(i), Key: []byte(env.PaymentKey), Value: v}
	}
	return recs
}

// zombieSnapshot is everything a batch can write, counted.
type zombieSnapshot struct {
	next, epoch                                  int64
	inbox, processed, transitions, postings, out int
}

func takeSnapshot(t *testing.T, pool *pgxpool.Pool) zombieSnapshot {
	t.Helper()
	var s zombieSnapshot
	err := pool.QueryRow(context.Background(), `
		SELECT COALESCE((SELECT next_offset FROM consumer_offsets WHERE group_id = $1 AND topic = $2 AND partition = 0), -1),
		       COALESCE((SELECT owner_epoch FROM consumer_offsets WHERE group_id = $1 AND topic = $2 AND partition = 0), -1),
		       (SELECT count(*) FROM deliveries),
		       (SELECT count(*) FROM deliveries WHERE status = 'processed'),
		       (SELECT count(*) FROM payment_transitions),
		       (SELECT count(*) FROM ledger_postings),
		       (SELECT count(*) FROM payment_transitions)`, zombieGroup, zombieTopic).
		Scan(&s.next, &s.epoch, &s.inbox, &s.processed, &s.transitions, &s.postings, &s.out)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// wantAfter is the snapshot after recs[:n] were each applied exactly once,
// by the machine's own replay of each payment's facts.
func wantAfter(t *testing.T, recs []*kgo.Record, n int, epoch int64) zombieSnapshot {
	t.Helper()
	byPayment := map[string][]payment.Fact{}
	for _, rec := range recs[:n] {
		env, err := envelope.DecodeRaw(rec.Value)
		if err != nil {
			t.Fatal(err)
		}
		byPayment[env.PaymentKey] = append(byPayment[env.PaymentKey], env.Event.Fact)
	}
	s := zombieSnapshot{next: int64(n), epoch: epoch, inbox: n}
	for _, facts := range byPayment {
		r := payment.Machine{}.Replay(payment.State{}, facts)
		s.transitions += len(r.Transitions)
		s.out += len(r.Transitions)
		for _, d := range r.Decisions {
			if d.Outcome == payment.OutcomeApplied {
				s.processed++
			}
		}
		for _, tr := range r.Transitions {
			s.postings += 2 * len(tr.Movements) // the view has two legs per movement
		}
	}
	return s
}

func mustClaim(t *testing.T, db store.DB) (epoch, next int64) {
	t.Helper()
	epoch, next, _, err := claim(context.Background(), db, zombieGroup, zombieTopic, 0)
	if err != nil {
		t.Fatal(err)
	}
	return epoch, next
}

func zombieApplier() *applier { return &applier{now: time.Now} }

// commitBatch commits recs, one partition's batch, in a transaction of its
// own, as a worker that does not know its last commit would.
func commitBatch(ctx context.Context, db store.Beginner, a *applier, group string, epoch int64, recs []*kgo.Record) (batchOutcome, error) {
	return commitAlone(ctx, db, a, group, newPartitionBatch(recs[0].Partition, epoch, -1, recs, nil))
}

// TestZombieCommitIsFenced: a worker that lost its partition to a newer
// claim fails its commit with ErrFenced and writes nothing — no inbox
// rows, no effects, the offset unchanged — while the new owner's commit
// applies; records the old owner did commit before the claim are skipped by
// the new owner, not applied twice.
func TestZombieCommitIsFenced(t *testing.T) {
	t.Parallel()
	db := testenv.NewDB(t)
	ctx := context.Background()
	recs := zombieRecords(t, 6)

	old, next := mustClaim(t, db.Pool)
	if old != 1 || next != 0 {
		t.Fatalf("first claim: epoch %d next %d, want 1 and 0", old, next)
	}
	// The old owner commits the first two records while it still owns the
	// partition.
	if out, err := commitBatch(ctx, db.Pool, zombieApplier(), zombieGroup, old, recs[:2]); err != nil || out.next != 2 {
		t.Fatalf("owner's commit: next %d, err %v; want 2, nil", out.next, err)
	}
	if got, want := takeSnapshot(t, db.Pool), wantAfter(t, recs, 2, 1); got != want {
		t.Fatalf("after the owner's commit: %+v, want %+v", got, want)
	}

	// A rebalance gives the partition to another worker.
	cur, next := mustClaim(t, db.Pool)
	if cur != 2 || next != 2 {
		t.Fatalf("second claim: epoch %d next %d, want 2 and 2", cur, next)
	}
	before := takeSnapshot(t, db.Pool)

	// The zombie still has the next records buffered and commits them.
	for _, batch := range [][]*kgo.Record{recs[2:4], recs[:6], recs[5:6]} {
		out, err := commitBatch(ctx, db.Pool, zombieApplier(), zombieGroup, old, batch)
		if !errors.Is(err, ErrFenced) {
			t.Fatalf("zombie commit of offsets %d..%d: out %+v, err %v; want ErrFenced", batch[0].Offset, batch[len(batch)-1].Offset, out, err)
		}
		if got := takeSnapshot(t, db.Pool); got != before {
			t.Fatalf("fenced zombie commit wrote: %+v, before %+v", got, before)
		}
	}
	// A worker whose claim predates the row entirely (epoch 0) is fenced too.
	if _, err := commitBatch(ctx, db.Pool, zombieApplier(), zombieGroup, 0, recs[2:3]); !errors.Is(err, ErrFenced) {
		t.Fatalf("epoch 0 commit: err %v, want ErrFenced", err)
	}

	// The new owner resumes; Kafka may hand it records below the stored
	// offset (it fetched from an older position): they are skipped.
	out, err := commitBatch(ctx, db.Pool, zombieApplier(), zombieGroup, cur, recs)
	if err != nil {
		t.Fatalf("new owner's commit: %v", err)
	}
	if out.next != 6 || out.applied != 4 {
		t.Errorf("new owner's commit: next %d applied %d, want 6 and 4 (offsets 0 and 1 skipped)", out.next, out.applied)
	}
	if got, want := takeSnapshot(t, db.Pool), wantAfter(t, recs, 6, 2); got != want {
		t.Errorf("after the new owner's commit: %+v, want %+v (each record applied once)", got, want)
	}
	// And the zombie stays fenced after the new owner committed.
	if _, err := commitBatch(ctx, db.Pool, zombieApplier(), zombieGroup, old, recs[4:]); !errors.Is(err, ErrFenced) {
		t.Fatalf("zombie commit after the new owner's: err %v, want ErrFenced", err)
	}
	// A batch entirely below the stored offset commits nothing and keeps
	// the offset (a redelivery after a crash).
	if out, err := commitBatch(ctx, db.Pool, zombieApplier(), zombieGroup, cur, recs[:3]); err != nil || out.applied != 0 || out.next != 6 {
		t.Errorf("replayed old batch: out %+v err %v, want nothing applied and next 6", out, err)
	}
	if got, want := takeSnapshot(t, db.Pool), wantAfter(t, recs, 6, 2); got != want {
		t.Errorf("at the end: %+v, want %+v", got, want)
	}
}

// gatedDB is a pool whose transactions can be stopped at a chosen point,
// so a test can claim the partition while an old owner's transaction is
// open. Transactions are numbered from 1 in the order they begin; a
// transaction's statements (Exec, Query, QueryRow, SendBatch, savepoint
// Begin, CopyFrom) from 1 in the order they are sent, and its Commit is
// statement 0.
type gatedDB struct {
	*pgxpool.Pool

	mu      sync.Mutex
	begins  int
	gates   map[[2]int]*gate
	pid     uint32 // backend of the last transaction begun
	failing map[int]bool
}

// gate holds one transaction at one point until released.
type gate struct {
	reached chan struct{}
	release chan struct{}
}

var errInjected = errors.New("injected commit failure (connection reset)")

func newGatedDB(pool *pgxpool.Pool) *gatedDB {
	return &gatedDB{Pool: pool, gates: map[[2]int]*gate{}, failing: map[int]bool{}}
}

// stopAt makes transaction tx wait before statement stmt (0: before
// Commit) until the returned gate is released.
func (g *gatedDB) stopAt(tx, stmt int) *gate {
	g.mu.Lock()
	defer g.mu.Unlock()
	gt := &gate{reached: make(chan struct{}), release: make(chan struct{})}
	g.gates[[2]int{tx, stmt}] = gt
	return gt
}

// failCommit makes transaction tx's Commit roll back and fail, as a
// connection reset at commit time would.
func (g *gatedDB) failCommit(tx int) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.failing[tx] = true
}

func (g *gatedDB) Begin(ctx context.Context) (pgx.Tx, error) {
	tx, err := g.Pool.Begin(ctx)
	if err != nil {
		return nil, err
	}
	g.mu.Lock()
	g.begins++
	n := g.begins
	g.pid = tx.Conn().PgConn().PID()
	g.mu.Unlock()
	return &gatedTx{Tx: tx, db: g, n: n}, nil
}

func (g *gatedDB) wait(tx, stmt int) {
	g.mu.Lock()
	gt := g.gates[[2]int{tx, stmt}]
	g.mu.Unlock()
	if gt == nil {
		return
	}
	close(gt.reached)
	<-gt.release
}

type gatedTx struct {
	pgx.Tx
	db    *gatedDB
	n     int
	stmts int
}

func (t *gatedTx) next() {
	t.stmts++
	t.db.wait(t.n, t.stmts)
}

func (t *gatedTx) Begin(ctx context.Context) (pgx.Tx, error) { t.next(); return t.Tx.Begin(ctx) }
func (t *gatedTx) Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	t.next()
	return t.Tx.Exec(ctx, sql, args...)
}
func (t *gatedTx) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	t.next()
	return t.Tx.Query(ctx, sql, args...)
}
func (t *gatedTx) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	t.next()
	return t.Tx.QueryRow(ctx, sql, args...)
}
func (t *gatedTx) SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults {
	t.next()
	return t.Tx.SendBatch(ctx, b)
}
func (t *gatedTx) CopyFrom(ctx context.Context, name pgx.Identifier, cols []string, src pgx.CopyFromSource) (int64, error) {
	t.next()
	return t.Tx.CopyFrom(ctx, name, cols, src)
}
func (t *gatedTx) Commit(ctx context.Context) error {
	t.db.wait(t.n, 0)
	t.db.mu.Lock()
	fail := t.db.failing[t.n]
	t.db.mu.Unlock()
	if fail {
		_ = t.Tx.Rollback(ctx)
		return errInjected
	}
	return t.Tx.Commit(ctx)
}

// awaitGate waits until a transaction reaches gt, or fails the test if the
// commit it belongs to ended (done) without reaching it.
func awaitGate(t *testing.T, gt *gate, done <-chan commitResult, what string) {
	t.Helper()
	select {
	case <-gt.reached:
	case r := <-done:
		t.Fatalf("%s: the commit ended (next %d, err %v) without reaching the gate: commitBatch's transactions changed shape; update this test", what, r.out.next, r.err)
	case <-time.After(10 * time.Second):
		t.Fatalf("%s: the transaction never reached the gate", what)
	}
}

type commitResult struct {
	out batchOutcome
	err error
}

func commitAsync(db store.Beginner, epoch int64, recs []*kgo.Record) <-chan commitResult {
	done := make(chan commitResult, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		out, err := commitBatch(ctx, db, zombieApplier(), zombieGroup, epoch, recs)
		done <- commitResult{out, err}
	}()
	return done
}

type claimResult struct {
	epoch, next int64
	err         error
}

// claimAsync claims the partition on its own connection and returns that
// connection's backend pid, so the test can ask Postgres what it waits on.
func claimAsync(t *testing.T, pool *pgxpool.Pool) (uint32, <-chan claimResult) {
	t.Helper()
	conn, err := pool.Acquire(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	pid := conn.Conn().PgConn().PID()
	done := make(chan claimResult, 1)
	go func() {
		defer conn.Release()
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		epoch, next, _, err := claim(ctx, conn, zombieGroup, zombieTopic, 0)
		done <- claimResult{epoch, next, err}
	}()
	return pid, done
}

// blockedBy waits until backend pid waits on a lock held by backend holder,
// or until claim returns (then it was not blocked: false).
func blockedBy(t *testing.T, pool *pgxpool.Pool, pid, holder uint32, claimed <-chan claimResult) (bool, claimResult) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		select {
		case r := <-claimed:
			return false, r
		default:
		}
		var blocked bool
		if err := pool.QueryRow(context.Background(), `SELECT $2::int = ANY(pg_blocking_pids($1::int))`, int(pid), int(holder)).Scan(&blocked); err != nil {
			t.Fatal(err)
		}
		if blocked {
			return true, claimResult{}
		}
		time.Sleep(5 * time.Millisecond)
	}
	t.Fatalf("claim neither returned nor waited on the old owner's lock within 10s")
	return false, claimResult{}
}

func receive[T any](t *testing.T, ch <-chan T, what string) T {
	t.Helper()
	select {
	case v := <-ch:
		return v
	case <-time.After(15 * time.Second):
		t.Fatalf("%s did not finish", what)
		var zero T
		return zero
	}
}

// TestZombieOpenTransactionAtClaim: the old owner's batch transaction is
// already open when the new owner claims the partition. Whatever point
// the old transaction has reached, it cannot commit effects after the
// claim: either the claim's UPDATE waits on the old transaction's lock on
// the offset row (so the old commit lands first and the claim resumes
// after it), or the old commit fails with ErrFenced and writes nothing.
// The new owner then commits the whole range; every record is applied
// exactly once.
func TestZombieOpenTransactionAtClaim(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name string
		tx   int // which of the old commit's transactions to stop
		stmt int // before which statement (0: before COMMIT)
		// failCommit: the old transaction's COMMIT fails (connection
		// reset) after the claim started waiting; the old owner retries.
		failCommit bool
		// poison: the batch holds a record Postgres refuses, so
		// commitBatch rolls back its first transaction and applies the
		// batch record by record in a second; stop that one.
		poison bool
		// want: "blocks" (the claim waits for the old transaction) or
		// "fenced" (the old commit fails).
		want string
	}{
		{name: "before the offset lock", tx: 1, stmt: 1, want: "fenced"},
		{name: "holding the offset lock", tx: 1, stmt: 2, want: "blocks"},
		{name: "effects written, before commit", tx: 1, stmt: 0, want: "blocks"},
		{name: "commit fails while the claim waits", tx: 1, stmt: 0, failCommit: true, want: "blocks"},
		{name: "poison batch, before its record-by-record retry", tx: 2, stmt: 1, poison: true, want: "fenced"},
		{name: "poison batch, record-by-record retry before commit", tx: 2, stmt: 0, poison: true, want: "blocks"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			db := testenv.NewDB(t)
			recs := zombieRecords(t, 6)
			if tc.poison {
				// Offset 4: an authentic envelope with a NUL in its dedup
				// key, which Postgres text refuses.
				env, err := envelope.DecodeRaw(recs[4].Value)
				if err != nil {
					t.Fatal(err)
				}
				env.Event.DedupKey += "\x00"
				if recs[4].Value, err = env.Marshal(); err != nil {
					t.Fatal(err)
				}
			}
			old, _ := mustClaim(t, db.Pool)
			// Offsets 0 and 1 were committed by the old owner earlier.
			if _, err := commitBatch(context.Background(), db.Pool, zombieApplier(), zombieGroup, old, recs[:2]); err != nil {
				t.Fatal(err)
			}
			before := takeSnapshot(t, db.Pool)

			g := newGatedDB(db.Pool)
			gt := g.stopAt(tc.tx, tc.stmt)
			if tc.failCommit {
				g.failCommit(tc.tx)
			}
			done := commitAsync(g, old, recs[2:])
			awaitGate(t, gt, done, "old owner's commit")
			g.mu.Lock()
			holder := g.pid
			g.mu.Unlock()

			claimPID, claimed := claimAsync(t, db.Pool)
			blocked, cr := blockedBy(t, db.Pool, claimPID, holder, claimed)
			if got := map[bool]string{true: "blocks", false: "fenced"}[blocked]; got != tc.want {
				t.Errorf("the claim %s; want %q (blocks: the claim waits for the old transaction; fenced: it does not, and the old commit fails)",
					map[bool]string{true: "waited on the old transaction's lock", false: "did not wait"}[blocked], tc.want)
			}
			close(gt.release)
			res := receive(t, done, "old owner's commit")
			if blocked {
				cr = receive(t, claimed, "claim")
			}
			if cr.err != nil {
				t.Fatalf("claim: %v", cr.err)
			}
			if cr.epoch != old+1 {
				t.Errorf("claim: epoch %d, want %d", cr.epoch, old+1)
			}

			switch {
			case blocked && !tc.failCommit:
				// The old transaction held the lock with a valid epoch: it
				// commits, and the claim resumes after it.
				if res.err != nil {
					t.Fatalf("old commit that held the lock failed: %v", res.err)
				}
				if cr.next != res.out.next || res.out.next != 6 {
					t.Errorf("claim resumes at %d, old commit stored %d; want both 6", cr.next, res.out.next)
				}
			case blocked && tc.failCommit:
				if !errors.Is(res.err, errInjected) {
					t.Fatalf("old commit: err %v, want the injected failure", res.err)
				}
				if cr.next != before.next {
					t.Errorf("claim resumes at %d, want %d (the failed commit stored nothing)", cr.next, before.next)
				}
				// The old owner retries, as Worker.commit does: fenced.
				if _, err := commitBatch(context.Background(), db.Pool, zombieApplier(), zombieGroup, old, recs[2:]); !errors.Is(err, ErrFenced) {
					t.Fatalf("old owner's retry: err %v, want ErrFenced", err)
				}
			default:
				if !errors.Is(res.err, ErrFenced) {
					t.Fatalf("old commit after the claim: out %+v err %v, want ErrFenced", res.out, res.err)
				}
				if cr.next != before.next {
					t.Errorf("claim resumes at %d, want %d", cr.next, before.next)
				}
			}
			if res.err != nil {
				after := takeSnapshot(t, db.Pool)
				after.epoch = before.epoch
				if after != before {
					t.Errorf("failed old commit wrote: %+v, before %+v", after, before)
				}
			}

			// The new owner commits everything it is handed.
			out, err := commitBatch(context.Background(), db.Pool, zombieApplier(), zombieGroup, cr.epoch, recs)
			if err != nil {
				t.Fatalf("new owner's commit: %v", err)
			}
			if out.next != 6 {
				t.Errorf("new owner's commit: next %d, want 6", out.next)
			}
			got2 := takeSnapshot(t, db.Pool)
			if tc.poison {
				// The poison record is quarantined (an inbox row, no
				// effect) and its payment held, whoever committed it.
				var quarantined int
				if err := db.Pool.QueryRow(context.Background(), `SELECT count(*) FROM deliveries WHERE status = 'quarantined' AND kafka_offset = 4`).Scan(&quarantined); err != nil {
					t.Fatal(err)
				}
				if quarantined != 1 {
					t.Errorf("poison record quarantined %d times, want once", quarantined)
				}
				if got2.inbox != 6 || got2.next != 6 {
					t.Errorf("after the new owner: %+v, want 6 inbox rows and next 6", got2)
				}
			} else if want := wantAfter(t, recs, 6, old+1); got2 != want {
				t.Errorf("after the new owner: %+v, want %+v (each record applied once)", got2, want)
			}
			var dupOffsets, dupTransitions int
			if err := db.Pool.QueryRow(context.Background(), `
				SELECT (SELECT count(*) - count(DISTINCT kafka_offset) FROM deliveries),
				       (SELECT count(*) FROM (SELECT delivery_id FROM payment_transitions GROUP BY delivery_id HAVING count(*) > 1) d)`).
				Scan(&dupOffsets, &dupTransitions); err != nil {
				t.Fatal(err)
			}
			if dupOffsets != 0 || dupTransitions != 0 {
				t.Errorf("applied twice: %d offsets with two inbox rows, %d inbox events with two transitions", dupOffsets, dupTransitions)
			}
		})
	}
}
