package e2e

import (
	"bytes"
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/paystream/paystream/internal/envelope"
	"github.com/paystream/paystream/internal/payment"
	"github.com/paystream/paystream/internal/provider"
	"github.com/paystream/paystream/internal/testenv"
	"github.com/paystream/paystream/processor"
)

// BenchmarkProcessorWAL measures the WAL the processor's transactions
// write per delivery on the workload make bench-e2e uses: payments
// created, paid, refunded and a late created, 1 KiB bodies, 20 %
// redeliveries. It attributes WAL records to transactions that touched the
// benchmark's schema with pg_walinspect (created in that schema), so other
// sessions on a shared server do not count, and reports
// WAL bytes per delivery (all of it, and without full-page images).
//
//	go test -run '^$' -bench ProcessorWAL -benchtime 1x ./internal/e2e/
func BenchmarkProcessorWAL(b *testing.B) {
	db := testenv.NewDB(b)
	brokers := testenv.Kafka(b)
	raw := testenv.Topic(b, "raw", 1)
	group := testenv.Group(b)
	ctx := context.Background()
	if _, err := db.Pool.Exec(ctx, `CREATE EXTENSION pg_walinspect SCHEMA `+pgx.Identifier{db.Schema}.Sanitize()); err != nil {
		b.Fatalf("pg_walinspect: %v", err)
	}
	const payments = 3000
	rng := rand.New(rand.NewPCG(1, 2))
	body := func() []byte {
		var sb strings.Builder
		sb.WriteString(`{"type":"payment","data":{"notes":"`)
		for sb.Len() < 1000 {
			sb.WriteByte(byte('a' + rng.IntN(26)))
		}
		sb.WriteString(`"}}`)
		return []byte(sb.String())
	}
	at := time.Date(2026, 11, 1, 0, 0, 0, 0, time.UTC)
	// Rounds: every payment's created, then every payment's paid, and so
	// on, so a payment's events land in different batches, as in life.
	rounds := make([][]*kgo.Record, 5)
	var bodyBytes int
	for i := range payments {
		id := fmt.Sprintf("pay_%06d", i)
		key := "acme:" + id
		facts := []payment.Fact{
			{Status: payment.StatusPending, AmountMinor: 1000, Currency: "BRL"},
			{Status: payment.StatusPaid, AmountMinor: 1000, Currency: "BRL"},
			{Status: payment.StatusRefunded, AmountMinor: 1000, Currency: "BRL"},
			{Status: payment.StatusPending, AmountMinor: 1000, Currency: "BRL"}, // late created: stale
		}
		var vals [][]byte
		for j, f := range facts {
			f.OccurredAt = at.Add(time.Duration(j) * time.Minute)
			if j == 3 {
				f.OccurredAt = at
			}
			evID := fmt.Sprintf("evt_%s_%d", id, j)
			env := envelope.Raw{Source: "acme", Driver: "standardwebhooks", PaymentKey: key, ReceivedAt: time.Now().UTC(), Body: body(),
				Event: provider.Event{EventID: evID, DedupKey: evID, PaymentID: id, Type: "payment." + string(f.Status), Fact: f}}
			v, err := env.Marshal()
			if err != nil {
				b.Fatal(err)
			}
			vals = append(vals, v)
			bodyBytes += len(env.Body)
		}
		vals = append(vals, vals[1]) // one redelivery in five records
		bodyBytes += len(body())
		for j, v := range vals {
			rounds[j] = append(rounds[j], &kgo.Record{Topic: raw, Key: []byte(key), Value: v})
		}
	}
	var recs []*kgo.Record
	for _, r := range rounds {
		recs = append(recs, r...)
	}
	produceRaw(b, brokers, recs...)
	var start string
	if err := db.Pool.QueryRow(ctx, `SELECT pg_current_wal_lsn()::text`).Scan(&start); err != nil {
		b.Fatal(err)
	}
	// The processor's own pool, named, so its backends' CPU can be read
	// from /proc (the server runs on this machine in the test stack).
	app := "bench-" + db.Schema
	pcfg, err := pgxpool.ParseConfig(db.URL)
	if err != nil {
		b.Fatal(err)
	}
	pcfg.ConnConfig.RuntimeParams["search_path"] = db.Schema
	pcfg.ConnConfig.RuntimeParams["application_name"] = app
	pcfg.MaxConnIdleTime = time.Hour
	ppool, err := pgxpool.NewWithConfig(ctx, pcfg)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(ppool.Close)
	b.ResetTimer()
	runProcessor(b, ppool, processor.Config{Brokers: brokers, Topic: raw, Group: group, RetentionInterval: -1})
	testenv.WaitFor(b, 5*time.Minute, func() error {
		return caughtUp(b, db.Pool, group, raw, map[int32]int64{0: int64(len(recs))})
	})
	b.StopTimer()
	if cpu, ok := backendCPU(b, db.Pool, app); ok {
		b.ReportMetric(float64(cpu.Microseconds())/float64(len(recs)), "pg-CPU-µs/delivery")
	}
	// Records of the transactions that touched this schema's relations,
	// the state messages they emitted and their commit records included.
	var total, fpi, records int64
	err = db.Pool.QueryRow(ctx, `
		WITH w AS (SELECT * FROM pg_get_wal_records_info($1::pg_lsn, pg_current_wal_lsn())),
		     rels AS (SELECT c.relfilenode::text AS f FROM pg_class c WHERE c.relnamespace = current_schema()::regnamespace AND c.relfilenode <> 0),
		     mine AS (SELECT DISTINCT w.xid FROM w, rels WHERE w.xid <> 0 AND w.block_ref ~ ('rel [0-9]+/[0-9]+/' || rels.f || '( |$)'))
		SELECT COALESCE(sum(w.record_length), 0), COALESCE(sum(w.fpi_length), 0), count(*)
		  FROM w JOIN mine USING (xid)`, start).Scan(&total, &fpi, &records)
	if err != nil {
		b.Fatal(err)
	}
	n := float64(len(recs))
	b.ReportMetric(float64(total)/n, "WAL-B/delivery")
	b.ReportMetric(float64(total-fpi)/n, "WAL-B-noFPI/delivery")
	b.ReportMetric(float64(bodyBytes)/n, "body-B/delivery")
	b.ReportMetric(float64(records)/n, "WAL-records/delivery")
	rows, err := db.Pool.Query(ctx, `
		WITH w AS (SELECT * FROM pg_get_wal_records_info($1::pg_lsn, pg_current_wal_lsn())),
		     rels AS (SELECT c.relfilenode::text AS f FROM pg_class c WHERE c.relnamespace = current_schema()::regnamespace AND c.relfilenode <> 0),
		     mine AS (SELECT DISTINCT w.xid FROM w, rels WHERE w.xid <> 0 AND w.block_ref ~ ('rel [0-9]+/[0-9]+/' || rels.f || '( |$)'))
		SELECT w.resource_manager || ':' || w.record_type || ' ' ||
		       COALESCE((SELECT c.relname FROM pg_class c WHERE c.relnamespace = current_schema()::regnamespace
		                    AND w.block_ref ~ ('rel [0-9]+/[0-9]+/' || c.relfilenode::text || '( |$)') LIMIT 1), ''),
		       count(*), sum(w.record_length), sum(w.fpi_length)
		  FROM w JOIN mine USING (xid) GROUP BY 1 ORDER BY 3 DESC`, start)
	if err != nil {
		b.Fatal(err)
	}
	var kind string
	var cnt, bytes, fpis int64
	_, err = pgx.ForEachRow(rows, []any{&kind, &cnt, &bytes, &fpis}, func() error {
		b.Logf("%-60s %7d records %10d bytes (%.0f per delivery, FPI %d)", kind, cnt, bytes, float64(bytes)/n, fpis)
		return nil
	})
	if err != nil {
		b.Fatal(err)
	}
}

// backendCPU sums the user and system CPU of the server backends whose
// application_name is app, from /proc; ok is false when the server's
// processes are not visible from here.
func backendCPU(b *testing.B, pool *pgxpool.Pool, app string) (time.Duration, bool) {
	rows, err := pool.Query(context.Background(), `SELECT pid FROM pg_stat_activity WHERE application_name = $1`, app)
	if err != nil {
		b.Fatal(err)
	}
	pids, err := pgx.CollectRows(rows, pgx.RowTo[int32])
	if err != nil {
		b.Fatal(err)
	}
	var ticks int64
	for _, pid := range pids {
		stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
		if err != nil {
			return 0, false
		}
		// Fields after the command's closing parenthesis; utime and stime
		// are the 14th and 15th of the line.
		f := strings.Fields(string(stat[bytes.LastIndexByte(stat, ')')+2:]))
		u, _ := strconv.ParseInt(f[11], 10, 64)
		s, _ := strconv.ParseInt(f[12], 10, 64)
		ticks += u + s
	}
	return time.Duration(ticks) * 10 * time.Millisecond, len(pids) > 0 // USER_HZ is 100 on Linux
}
