package e2e

import (
	"context"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/paystream/paystream/internal/testenv"
	"github.com/paystream/paystream/processor"
)

// TestProcessorSurvivesConnectionResets cuts the processor's Postgres
// connections (pg_terminate_backend) again and again while it applies a
// backlog: transactions in flight roll back and are retried, nothing is
// applied twice, nothing is lost and progress resumes after every cut.
func TestProcessorSurvivesConnectionResets(t *testing.T) {
	db := testenv.NewDB(t)
	brokers := testenv.Kafka(t)
	raw := testenv.Topic(t, "raw", 3)
	appName := fmt.Sprintf("paystream_fault_%d", rand.Uint32())

	cfg, err := pgxpool.ParseConfig(db.URL)
	if err != nil {
		t.Fatal(err)
	}
	cfg.ConnConfig.RuntimeParams["application_name"] = appName
	cfg.ConnConfig.RuntimeParams["search_path"] = db.Schema
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)

	const payments = 200
	hs := genHistories(payments)
	var recs []*kgo.Record
	for step := 0; step < 4; step++ {
		for _, h := range hs {
			recs = append(recs, rawRecord(t, raw, h.key, h.events[step]))
		}
	}
	testenv.Produce(t, brokers, recs...)
	runProcessor(t, pool, processor.Config{
		Brokers: brokers, Topic: raw, Group: testenv.Group(t), BatchMaxRecords: 20,
		RetryBackoffMax: 200 * time.Millisecond,
	})

	inbox := func() int { return count(t, db.Pool, `SELECT count(*) FROM deliveries`) }
	cuts := 0
	for cut := 1; cut <= 5; cut++ {
		threshold := cut * len(recs) / 7
		testenv.Eventually(t, 60*time.Second, func() bool { return inbox() >= threshold }, "progress to %d inbox rows before cut %d", threshold, cut)
		var killed int
		if err := db.Pool.QueryRow(context.Background(), `
			SELECT count(*) FROM (SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = $1) k`, appName).Scan(&killed); err != nil {
			t.Fatal(err)
		}
		cuts += killed
	}
	if cuts == 0 {
		t.Fatal("no processor connection was ever cut: the test proved nothing")
	}
	testenv.Eventually(t, 90*time.Second, func() bool { return inbox() == len(recs) }, "all %d records applied after %d cut connections", len(recs), cuts)

	if n := count(t, db.Pool, `SELECT count(*) FROM deliveries WHERE reason = 'duplicate_event'`); n != payments {
		t.Errorf("duplicate deliveries = %d, want %d", n, payments)
	}
	// created, paid and a partial refund: three transitions, the last two
	// moving money with two legs each.
	if n := count(t, db.Pool, `SELECT count(*) FROM payment_transitions`); n != 3*payments {
		t.Errorf("transitions = %d, want %d", n, 3*payments)
	}
	if n := count(t, db.Pool, `SELECT count(*) FROM ledger_postings`); n != 4*payments {
		t.Errorf("ledger postings = %d, want %d", n, 4*payments)
	}
	if n := count(t, db.Pool, `SELECT count(*) FROM deliveries WHERE status IN ('received', 'quarantined')`); n != 0 {
		t.Errorf("%d inbox rows undecided or quarantined by a transient fault", n)
	}
	t.Logf("cut %d connections", cuts)
}
