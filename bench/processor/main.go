// Command bench-processor measures paystream's processor on a real broker and
// a real Postgres: a preloaded backlog applied in batches, the same code with
// one transaction per event, and the processor's peak RSS while it drains a
// large backlog. It runs `paystream processor` as a subprocess (so RSS is the
// processor's alone) against a fresh schema and topic, and reports numbers;
// it asserts nothing. Run it with `make bench-processor`.
package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/paystream/paystream/internal/envelope"
	"github.com/paystream/paystream/internal/payment"
	"github.com/paystream/paystream/internal/provider"
	"github.com/paystream/paystream/migrations"
)

func main() {
	var (
		binary     = flag.String("binary", "bin/paystream", "paystream binary to run as the processor")
		events     = flag.Int("events", 200_000, "backlog for the batched run")
		perEvent   = flag.Int("per-event", 20_000, "backlog for the one-transaction-per-event run (0 skips it)")
		rssBacklog = flag.Int("rss-backlog", 1_000_000, "backlog for the memory run (0 skips it)")
		partitions = flag.Int("partitions", 6, "partitions of the raw topic")
		batch      = flag.Int("batch", 500, "records per transaction in the batched runs")
	)
	flag.Parse()
	dbURL, brokers := os.Getenv("PAYSTREAM_TEST_DATABASE_URL"), os.Getenv("PAYSTREAM_TEST_KAFKA_BROKERS")
	if dbURL == "" || brokers == "" {
		fail(fmt.Errorf("set PAYSTREAM_TEST_DATABASE_URL and PAYSTREAM_TEST_KAFKA_BROKERS (make stack-up; eval \"$(deploy/stack.sh env)\")"))
	}
	b := &bench{binary: *binary, dbURL: dbURL, brokers: strings.Split(brokers, ","), partitions: *partitions}
	fmt.Printf("bench-processor: %d partitions, 2 cores shared by Kafka, Postgres, the producer and the processor\n\n", *partitions)

	batched := b.run("batched", *events, *batch)
	var single result
	if *perEvent > 0 {
		single = b.run("per-event", *perEvent, 1)
	}
	var mem result
	if *rssBacklog > 0 {
		mem = b.run("memory", *rssBacklog, *batch)
	}

	fmt.Println("\n== summary")
	fmt.Printf("batched (%d events, %d per tx):  %8.0f events/s   peak RSS %4d MB   (goal ≥ 10,000 events/s)\n", batched.n, *batch, batched.rate, batched.peakRSS>>20)
	if *perEvent > 0 {
		fmt.Printf("per-event (%d events, 1 per tx): %8.0f events/s   peak RSS %4d MB\n", single.n, single.rate, single.peakRSS>>20)
		fmt.Printf("speed-up batched / per-event:       %8.1fx   (goal ≥ 5x)\n", batched.rate/single.rate)
	}
	if *rssBacklog > 0 {
		fmt.Printf("memory (%d-event backlog):     %8.0f events/s   peak RSS %4d MB   (goal ≤ 200 MB)\n", mem.n, mem.rate, mem.peakRSS>>20)
	}
}

type bench struct {
	binary     string
	dbURL      string
	brokers    []string
	partitions int
}

type result struct {
	n       int
	rate    float64 // events/s from the first commit to the last
	total   time.Duration
	peakRSS int64
}

func (b *bench) run(name string, n, batch int) result {
	ctx := context.Background()
	suffix := randomHex(4)
	schema, topic, group := "bench_"+suffix, "bench-raw-"+suffix, "bench-"+suffix
	fmt.Printf("== %s: %d events, %d per transaction\n", name, n, batch)

	admin, err := pgx.Connect(ctx, b.dbURL)
	check(err)
	_, err = admin.Exec(ctx, "CREATE SCHEMA "+schema)
	check(err)
	defer func() {
		_, _ = admin.Exec(context.Background(), "DROP SCHEMA "+schema+" CASCADE")
		admin.Close(context.Background())
	}()
	url := withSearchPath(b.dbURL, schema)
	pool, err := pgxpool.New(ctx, url)
	check(err)
	defer pool.Close()
	_, err = migrations.Apply(ctx, pool)
	check(err)

	cl, err := kgo.NewClient(kgo.SeedBrokers(b.brokers...), kgo.ProducerLinger(5*time.Millisecond),
		kgo.MaxBufferedRecords(50_000), kgo.ProducerBatchMaxBytes(1<<20))
	check(err)
	defer cl.Close()
	adm := kadm.NewClient(cl)
	_, err = adm.CreateTopic(ctx, int32(b.partitions), 1, nil, topic)
	check(err)
	defer func() { _, _ = adm.DeleteTopics(context.Background(), topic) }()

	start := time.Now()
	produceBacklog(ctx, cl, topic, n)
	fmt.Printf("   produced %d events in %s\n", n, time.Since(start).Round(time.Millisecond))

	cmd := exec.Command(b.binary, "processor", "--kafka-brokers", strings.Join(b.brokers, ","), "--database-url", url,
		"--raw-topic", topic, "--group", group, "--batch-max-records", strconv.Itoa(batch), "--log-level", "warn", "--metrics-addr", os.Getenv("BENCH_METRICS_ADDR"))
	cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
	check(cmd.Start())
	defer func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		_ = cmd.Wait()
	}()

	began := time.Now()
	var first time.Time
	var firstDone int64
	var peak int64
	last := time.Now()
	for {
		time.Sleep(100 * time.Millisecond)
		var done int64
		check(pool.QueryRow(ctx, `SELECT COALESCE(sum(next_offset), 0) FROM consumer_offsets`).Scan(&done))
		if rss := rssOf(cmd.Process.Pid); rss > peak {
			peak = rss
		}
		if done > 0 && first.IsZero() {
			first, firstDone = time.Now(), done
		}
		if time.Since(last) > time.Second || done >= int64(n) {
			last = time.Now()
			pct := float64(done) / float64(n) * 100
			fmt.Printf("\r   %6.1f%%  %9d/%d events  RSS %4d MB   ", pct, done, n, rssOf(cmd.Process.Pid)>>20)
		}
		if done >= int64(n) {
			break
		}
		if time.Since(began) > 15*time.Minute {
			fail(fmt.Errorf("%s: only %d of %d events after 15 minutes", name, done, n))
		}
	}
	end := time.Now()
	rate := float64(int64(n)-firstDone) / end.Sub(first).Seconds()
	if end.Sub(first) <= 0 {
		rate = float64(n) / end.Sub(began).Seconds()
	}
	fmt.Printf("\n   %s: %.0f events/s (first commit to last), %s end to end including group join, peak RSS %d MB\n",
		name, rate, end.Sub(began).Round(time.Millisecond), peak>>20)
	return result{n: n, rate: rate, total: end.Sub(began), peakRSS: peak}
}

// produceBacklog writes n raw envelopes: payments of four deliveries each
// (created, paid, a redelivery of paid, a partial refund), interleaved.
func produceBacklog(ctx context.Context, cl *kgo.Client, topic string, n int) {
	base := time.Date(2026, 11, 1, 0, 0, 0, 0, time.UTC)
	errc := make(chan error, 1)
	for i := 0; i < n; i++ {
		p, step := i/4, i%4
		id := "pay_" + strconv.Itoa(p)
		key := "bench:" + id
		at := base.Add(time.Duration(p) * time.Millisecond)
		amount := int64(1000 + p%5000)
		var ev provider.Event
		switch step {
		case 0:
			ev = provider.Event{EventID: "c_" + id, Type: "payment.created", Fact: payment.Fact{Status: payment.StatusPending, AmountMinor: amount, Currency: "BRL", OccurredAt: at}}
		case 1, 2:
			ev = provider.Event{EventID: "p_" + id, Type: "payment.paid", Fact: payment.Fact{Status: payment.StatusPaid, AmountMinor: amount, Currency: "BRL", OccurredAt: at.Add(time.Second)}}
		case 3:
			ev = provider.Event{EventID: "r_" + id, Type: "payment.partially_refunded", Fact: payment.Fact{Status: payment.StatusPartiallyRefunded, AmountMinor: 100, Currency: "BRL", RefundID: "re_" + id, OccurredAt: at.Add(2 * time.Second)}}
		}
		ev.DedupKey, ev.PaymentID = ev.EventID, id
		env := envelope.Raw{Source: "bench", Driver: "standardwebhooks", PaymentKey: key, Event: ev, ReceivedAt: time.Now().UTC(),
			Body: []byte(`{"type":"` + ev.Type + `","data":{"payment_id":"` + id + `"}}`)}
		v, err := env.Marshal()
		check(err)
		cl.Produce(ctx, &kgo.Record{Topic: topic, Key: []byte(key), Value: v}, func(_ *kgo.Record, err error) {
			if err != nil {
				select {
				case errc <- err:
				default:
				}
			}
		})
	}
	check(cl.Flush(ctx))
	select {
	case err := <-errc:
		fail(fmt.Errorf("produce backlog: %w", err))
	default:
	}
}

// rssOf reads a process's resident set size from /proc.
func rssOf(pid int) int64 {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(b), "\n") {
		if rest, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			kb, _ := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(rest), "kB")), 10, 64)
			return kb << 10
		}
	}
	return 0
}

func withSearchPath(url, schema string) string {
	sep := "?"
	if strings.Contains(url, "?") {
		sep = "&"
	}
	return url + sep + "search_path=" + schema
}

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

func check(err error) {
	if err != nil {
		fail(err)
	}
}

func fail(err error) {
	fmt.Fprintln(os.Stderr, "bench-processor:", err)
	os.Exit(1)
}
