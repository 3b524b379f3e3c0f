package e2e

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"strconv"
	"strings"
	"sync/atomic"
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
// redeliveries, all of it preloaded on one partition (so batches are
// full). It attributes WAL records to transactions that touched the
// benchmark's schema with pg_walinspect (created in that schema), so other
// sessions on a shared server do not count, and reports WAL bytes per
// delivery (all of it, and without full-page images), the CPU of the
// processor's Postgres backends, and the statements and round trips the
// processor sent, per delivery.
//
//	go test -run '^$' -bench 'ProcessorWAL$' -benchtime 1x ./internal/e2e/
func BenchmarkProcessorWAL(b *testing.B) {
	walBench(b, walBenchOptions{partitions: 1})
}

// BenchmarkProcessorWALPaced is BenchmarkProcessorWAL with the records
// produced while the processor runs, at 5,000 per second over 6
// partitions, as make bench-e2e's latency phase offers them: batches are
// as large as the processor's batching makes them, so the per-transaction
// cost shows. It also reports the deliveries per transaction and the
// latency from a record's production to its delivery row's recorded_at
// (the processor's clock when it wrote the batch), p50 and p99.
// PAYSTREAM_BENCH_BATCH_MAX_WAIT overrides the processor's BatchMaxWait.
//
//	go test -run '^$' -bench 'ProcessorWALPaced' -benchtime 1x ./internal/e2e/
func BenchmarkProcessorWALPaced(b *testing.B) {
	o := walBenchOptions{partitions: 6, rate: 5000}
	if s := os.Getenv("PAYSTREAM_BENCH_BATCH_MAX_WAIT"); s != "" {
		d, err := time.ParseDuration(s)
		if err != nil {
			b.Fatalf("PAYSTREAM_BENCH_BATCH_MAX_WAIT: %v", err)
		}
		o.batchMaxWait = d
	}
	walBench(b, o)
}

type walBenchOptions struct {
	partitions int
	// rate is the records produced per second while the processor runs;
	// 0 produces every record before it starts.
	rate         int
	batchMaxWait time.Duration
}

func walBench(b *testing.B, o walBenchOptions) {
	db := testenv.NewDB(b)
	brokers := testenv.Kafka(b)
	raw := testenv.Topic(b, "raw", o.partitions)
	group := testenv.Group(b)
	ctx := context.Background()
	// An extension is database-wide: use the one another run installed,
	// else install it in this schema (dropped with it).
	var walinspect string
	err := db.Pool.QueryRow(ctx, `SELECT extnamespace::regnamespace::text FROM pg_extension WHERE extname = 'pg_walinspect'`).Scan(&walinspect)
	if errors.Is(err, pgx.ErrNoRows) {
		walinspect = pgx.Identifier{db.Schema}.Sanitize()
		_, err = db.Pool.Exec(ctx, `CREATE EXTENSION pg_walinspect SCHEMA `+walinspect)
	}
	if err != nil {
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
	rounds := make([][]envelope.Raw, 5)
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
		var envs []envelope.Raw
		for j, f := range facts {
			f.OccurredAt = at.Add(time.Duration(j) * time.Minute)
			if j == 3 {
				f.OccurredAt = at
			}
			evID := fmt.Sprintf("evt_%s_%d", id, j)
			envs = append(envs, envelope.Raw{Source: "acme", Driver: "standardwebhooks", PaymentKey: key, Body: body(),
				Event: provider.Event{EventID: evID, DedupKey: evID, PaymentID: id, Type: "payment." + string(f.Status), Fact: f}})
		}
		envs = append(envs, envs[1]) // one redelivery in five records
		for j, env := range envs {
			bodyBytes += len(env.Body)
			rounds[j] = append(rounds[j], env)
		}
	}
	var envs []envelope.Raw
	for _, r := range rounds {
		envs = append(envs, r...)
	}
	record := func(env envelope.Raw) *kgo.Record {
		env.ReceivedAt = time.Now().UTC()
		v, err := env.Marshal()
		if err != nil {
			b.Fatal(err)
		}
		return &kgo.Record{Topic: raw, Key: []byte(env.PaymentKey), Value: v}
	}
	if o.rate == 0 {
		recs := make([]*kgo.Record, len(envs))
		for i, env := range envs {
			recs[i] = record(env)
		}
		testenv.Produce(b, brokers, recs...)
	}
	var start string
	if err := db.Pool.QueryRow(ctx, `SELECT pg_current_wal_lsn()::text`).Scan(&start); err != nil {
		b.Fatal(err)
	}
	// The processor's own pool, named, so its backends' CPU can be read
	// from /proc (the server runs on this machine in the test stack), and
	// traced, to count what it sends.
	app := "bench-" + db.Schema
	pcfg, err := pgxpool.ParseConfig(db.URL)
	if err != nil {
		b.Fatal(err)
	}
	pcfg.ConnConfig.RuntimeParams["search_path"] = db.Schema
	pcfg.ConnConfig.RuntimeParams["application_name"] = app
	pcfg.MaxConnIdleTime = time.Hour
	var sent statementCounter
	pcfg.ConnConfig.Tracer = &sent
	ppool, err := pgxpool.NewWithConfig(ctx, pcfg)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(ppool.Close)
	b.ResetTimer()
	runProcessor(b, ppool, processor.Config{Brokers: brokers, Topic: raw, Group: group, RetentionInterval: -1, BatchMaxWait: o.batchMaxWait})
	if o.rate > 0 {
		paceProduce(b, brokers, o, envs, record)
	}
	testenv.WaitFor(b, 5*time.Minute, func() error {
		return testenv.OffsetsBehind(b, db.Pool, group, raw, testenv.EndOffsets(b, brokers, raw))
	})
	b.StopTimer()
	n := float64(len(envs))
	if cpu, ok := backendCPU(b, db.Pool, app); ok {
		b.ReportMetric(float64(cpu.Microseconds())/n, "pg-CPU-µs/delivery")
	}
	b.ReportMetric(float64(sent.statements.Load())/n, "statements/delivery")
	b.ReportMetric(float64(sent.roundTrips.Load())/n, "round-trips/delivery")
	// The WAL records since start, read once into a temporary table with
	// the relation files each references; then the records of the
	// transactions that touched this schema's relations, the state
	// messages they emitted and their commit records included. (Matching
	// every record against every relation with a regular expression took
	// minutes on a shared server's WAL.)
	conn, err := db.Pool.Acquire(ctx)
	if err != nil {
		b.Fatal(err)
	}
	defer conn.Release()
	if _, err := conn.Exec(ctx, `
		CREATE TEMP TABLE walrecs AS
		SELECT xid, resource_manager || ':' || record_type AS kind, record_length, fpi_length,
		       ARRAY(SELECT m[1] FROM regexp_matches(block_ref, 'rel [0-9]+/[0-9]+/([0-9]+)', 'g') AS m) AS files
		  FROM `+walinspect+`.pg_get_wal_records_info($1::pg_lsn, pg_current_wal_lsn())`, start); err != nil {
		b.Fatal(err)
	}
	defer func() { _, _ = conn.Exec(context.Background(), `DROP TABLE IF EXISTS walrecs`) }()
	const mine = `
		WITH rels AS (SELECT c.relfilenode::text AS f, c.relname FROM pg_class c
		               WHERE c.relnamespace = current_schema()::regnamespace AND c.relfilenode <> 0),
		     mine AS (SELECT DISTINCT w.xid FROM walrecs w, unnest(w.files) AS u(f) JOIN rels USING (f) WHERE w.xid <> 0)`
	var total, fpi, records, txns int64
	err = conn.QueryRow(ctx, mine+`
		SELECT COALESCE(sum(w.record_length), 0), COALESCE(sum(w.fpi_length), 0), count(*), count(DISTINCT w.xid::text)
		  FROM walrecs w JOIN mine USING (xid)`).Scan(&total, &fpi, &records, &txns)
	if err != nil {
		b.Fatal(err)
	}
	b.ReportMetric(float64(total)/n, "WAL-B/delivery")
	b.ReportMetric(float64(total-fpi)/n, "WAL-B-noFPI/delivery")
	b.ReportMetric(float64(bodyBytes)/n, "body-B/delivery")
	b.ReportMetric(float64(records)/n, "WAL-records/delivery")
	b.ReportMetric(n/float64(max(txns, 1)), "deliveries/txn")
	if o.rate > 0 {
		var p50, p99 float64
		if err := db.Pool.QueryRow(ctx, `
			SELECT percentile_cont(0.5) WITHIN GROUP (ORDER BY x), percentile_cont(0.99) WITHIN GROUP (ORDER BY x)
			  FROM (SELECT extract(epoch FROM recorded_at - received_at) * 1000 AS x FROM deliveries) d`).Scan(&p50, &p99); err != nil {
			b.Fatal(err)
		}
		b.ReportMetric(p50, "p50-ms")
		b.ReportMetric(p99, "p99-ms")
	}
	// Each record under its first relation of this schema.
	rows, err := conn.Query(ctx, mine+`
		SELECT w.kind || ' ' || COALESCE((SELECT r.relname FROM unnest(w.files) WITH ORDINALITY AS u(f, i) JOIN rels r USING (f)
		                                  ORDER BY u.i LIMIT 1), ''),
		       count(*), sum(w.record_length), sum(w.fpi_length)
		  FROM walrecs w JOIN mine USING (xid) GROUP BY 1 ORDER BY 3 DESC`)
	if err != nil {
		b.Fatal(err)
	}
	// One log call: a benchmark's log is cut after a few calls.
	var sb strings.Builder
	var kind string
	var cnt, size, fpis int64
	_, err = pgx.ForEachRow(rows, []any{&kind, &cnt, &size, &fpis}, func() error {
		fmt.Fprintf(&sb, "\n%-60s %7d records %10d bytes (%.0f per delivery, FPI %d)", kind, cnt, size, float64(size)/n, fpis)
		return nil
	})
	if err != nil {
		b.Fatal(err)
	}
	b.Log("WAL by record type and relation:", sb.String())
}

// paceProduce produces envs at o.rate records per second, each stamped
// received now, and waits for the broker's acks.
func paceProduce(b *testing.B, brokers []string, o walBenchOptions, envs []envelope.Raw, record func(envelope.Raw) *kgo.Record) {
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...),
		kgo.RecordPartitioner(kgo.StickyKeyPartitioner(nil)),
		kgo.RequiredAcks(kgo.AllISRAcks()), kgo.ProducerLinger(time.Millisecond))
	if err != nil {
		b.Fatal(err)
	}
	defer cl.Close()
	ctx := context.Background()
	const tick = 5 * time.Millisecond
	per := max(o.rate*int(tick)/int(time.Second), 1)
	t := time.NewTicker(tick)
	defer t.Stop()
	var failed atomic.Pointer[error]
	for i := 0; i < len(envs); i += per {
		<-t.C
		for _, env := range envs[i:min(i+per, len(envs))] {
			cl.Produce(ctx, record(env), func(_ *kgo.Record, err error) {
				if err != nil {
					failed.CompareAndSwap(nil, &err)
				}
			})
		}
	}
	if err := cl.Flush(ctx); err != nil {
		b.Fatal(err)
	}
	if err := failed.Load(); err != nil {
		b.Fatalf("produce: %v", *err)
	}
}

// statementCounter is a pgx tracer counting the statements a pool sends
// and the round trips they take (a pipelined batch is one).
type statementCounter struct {
	statements, roundTrips atomic.Int64
}

func (c *statementCounter) TraceQueryStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceQueryStartData) context.Context {
	c.statements.Add(1)
	c.roundTrips.Add(1)
	return ctx
}

func (c *statementCounter) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

func (c *statementCounter) TraceBatchStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceBatchStartData) context.Context {
	c.roundTrips.Add(1)
	return ctx
}

func (c *statementCounter) TraceBatchQuery(context.Context, *pgx.Conn, pgx.TraceBatchQueryData) {
	c.statements.Add(1)
}

func (c *statementCounter) TraceBatchEnd(context.Context, *pgx.Conn, pgx.TraceBatchEndData) {}

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
