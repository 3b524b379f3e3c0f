package processor

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/paystream/paystream/internal/testenv"
)

// TestStoredOffsetGoingBackStopsTheProcessor: a failover to a Postgres
// replica that lagged (or a restore from a backup) loses the last committed
// transactions, and with them the partition's stored offset moves back,
// while the worker holds records fetched after it. Applying them would
// skip the records between the two forever. The processor must stop
// instead, applying nothing more, and a restart must resume from
// Postgres's offset: every record is then applied exactly once.
func TestStoredOffsetGoingBackStopsTheProcessor(t *testing.T) {
	f := setup(t, 1)
	ctx := context.Background()

	p, _ := newTestProcessor(t, f.db.Pool, Config{Brokers: f.brokers, Topic: f.topic, Group: f.group, BatchMaxRecords: 10})
	runCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	ran := make(chan error, 1)
	go func() { ran <- p.Run(runCtx) }()

	if err := produceTo(f.brokers, 0, paymentRecords(t, f.topic, 0, 5)); err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, 60*time.Second, func() error { return storedAtEnd(f.adm, f.db.Pool, f.group, f.topic) })

	// Postgres loses the commits past offset 8: their rows stay (the
	// restart below sees those records as redeliveries), the offset goes
	// back.
	if _, err := f.db.Pool.Exec(ctx, `UPDATE consumer_offsets SET next_offset = 8 WHERE group_id = $1 AND topic = $2`, f.group, f.topic); err != nil {
		t.Fatal(err)
	}
	if err := produceTo(f.brokers, 0, paymentRecords(t, f.topic, 5, 2)); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-ran:
		if !errors.Is(err, ErrOffsetRolledBack) {
			t.Fatalf("Run = %v, want ErrOffsetRolledBack", err)
		}
	case <-time.After(60 * time.Second):
		t.Fatalf("the processor still runs 60 s after Postgres's offset went back; stored offset now %d", storedOffset(t, f.db, f.group, f.topic, 0))
	}
	if got := queryInt(t, f.db.Pool, `SELECT count(*) FROM deliveries`); got != 20 {
		t.Errorf("deliveries after the stop = %d, want the first 20 (nothing applied past the gap)", got)
	}
	if got := storedOffset(t, f.db, f.group, f.topic, 0); got != 8 {
		t.Errorf("stored offset after the stop = %d, want 8", got)
	}

	// A restart resumes from 8: records 8..19 come again as redeliveries,
	// the 8 new ones apply.
	p2, _ := newTestProcessor(t, f.db.Pool, Config{Brokers: f.brokers, Topic: f.topic, Group: f.group, BatchMaxRecords: 10})
	testenv.Start(t, "processor", p2.Run)
	testenv.WaitFor(t, 60*time.Second, func() error { return storedAtEnd(f.adm, f.db.Pool, f.group, f.topic) })
	for _, c := range []struct {
		what string
		sql  string
		want int
	}{
		{"transitions", `SELECT count(*) FROM payment_transitions`, 3 * 7},
		{"ledger postings", `SELECT count(*) FROM ledger_postings`, 4 * 7},
		{"deliveries", `SELECT count(*) FROM deliveries`, 20 + 12 + 8},
		{"redeliveries", `SELECT count(*) FROM deliveries WHERE reason = 'duplicate_event'`, 5 + 12 + 2},
		{"payments partially refunded", `SELECT count(*) FROM payments WHERE status = 'partially_refunded'`, 7},
	} {
		if got := queryInt(t, f.db.Pool, c.sql); got != c.want {
			t.Errorf("%s = %d, want %d", c.what, got, c.want)
		}
	}
}
