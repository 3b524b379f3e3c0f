package processor

import (
	"context"
	"errors"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/paystream/paystream/internal/testenv"
)

// freezer is a pgx tracer that, once armed, freezes the client right after
// the first batch whose SQL contains match: the goroutine that sent it
// blocks until thaw, as a process stopped by SIGSTOP or a VM pause would,
// while its session sits idle in its transaction holding what the batch
// locked.
type freezer struct {
	match    string
	armed    atomic.Bool
	frozen   chan uint32 // the frozen session's backend pid
	thawOnce sync.Once
	thawed   chan struct{}
}

type matchedKey struct{}

func (f *freezer) TraceQueryStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceQueryStartData) context.Context {
	return ctx
}
func (f *freezer) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

func (f *freezer) TraceBatchStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceBatchStartData) context.Context {
	return context.WithValue(ctx, matchedKey{}, new(bool))
}

func (f *freezer) TraceBatchQuery(ctx context.Context, _ *pgx.Conn, data pgx.TraceBatchQueryData) {
	if m, ok := ctx.Value(matchedKey{}).(*bool); ok && strings.Contains(data.SQL, f.match) {
		*m = true
	}
}

func (f *freezer) TraceBatchEnd(ctx context.Context, conn *pgx.Conn, data pgx.TraceBatchEndData) {
	m, ok := ctx.Value(matchedKey{}).(*bool)
	if !ok || !*m || data.Err != nil || !f.armed.CompareAndSwap(true, false) {
		return
	}
	f.frozen <- conn.PgConn().PID()
	<-f.thawed
}

// thaw lets the frozen client go on.
func (f *freezer) thaw() { f.thawOnce.Do(func() { close(f.thawed) }) }

// freezingPool returns a pool on db's schema whose client freezes (see
// freezer) after the first batch containing match sent once the freezer
// is armed. The freezer thaws when the test ends.
func freezingPool(t *testing.T, db *testenv.DB, match string) (*freezer, *pgxpool.Pool) {
	t.Helper()
	f := &freezer{match: match, frozen: make(chan uint32, 1), thawed: make(chan struct{})}
	cfg, err := pgxpool.ParseConfig(db.URL)
	if err != nil {
		t.Fatal(err)
	}
	cfg.ConnConfig.RuntimeParams["search_path"] = db.Schema
	cfg.ConnConfig.Tracer = f
	pool, err := pgxpool.NewWithConfig(t.Context(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	t.Cleanup(f.thaw) // runs before the pool's Close
	return f, pool
}

// waitFrozen returns the pid of the session the freezer froze.
func (f *freezer) waitFrozen(t *testing.T) uint32 {
	t.Helper()
	select {
	case pid := <-f.frozen:
		return pid
	case <-time.After(60 * time.Second):
		t.Fatal("nothing sent the batch the freezer waits for")
		return 0
	}
}

// waitSessionEnded waits until Postgres ended the frozen session pid and
// every offset row of the schema can be locked again, and returns how
// long that took.
func waitSessionEnded(t *testing.T, db *testenv.DB, pid uint32, timeout time.Duration) time.Duration {
	t.Helper()
	start := time.Now()
	testenv.WaitFor(t, timeout, func() error {
		var alive bool
		if err := db.Pool.QueryRow(t.Context(), `SELECT EXISTS (SELECT 1 FROM pg_stat_activity WHERE pid = $1)`, int32(pid)).Scan(&alive); err != nil {
			return err
		}
		if alive {
			return errors.New("the frozen session is still open, holding its transaction's locks")
		}
		return pgx.BeginFunc(t.Context(), db.Pool, func(tx pgx.Tx) error {
			_, err := tx.Exec(t.Context(), `SELECT 1 FROM consumer_offsets FOR UPDATE NOWAIT`)
			return err
		})
	})
	return time.Since(start)
}
