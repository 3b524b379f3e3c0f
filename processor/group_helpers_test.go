package processor

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/paystream/paystream/internal/envelope"
	"github.com/paystream/paystream/internal/payment"
	"github.com/paystream/paystream/internal/provider"
	"github.com/paystream/paystream/internal/testenv"
)

// Helpers for the consumer-group tests: records with known effects, a
// processor run in the background, the broker's view of the group, and a
// TCP proxy that can cut a component off from Postgres.

// paymentRecords makes four records for each of n payments keyed by
// payment: created, paid, the same paid event redelivered, and a partial
// refund. first numbers the payments, so batches made later do not reuse
// ids. Applied exactly once, each payment has three transitions, four
// ledger postings and one duplicate_event inbox row.
func paymentRecords(t testing.TB, topic string, first, n int) []*kgo.Record {
	t.Helper()
	at := time.Date(2026, 11, 1, 12, 0, 0, 0, time.UTC)
	var recs []*kgo.Record
	for i := first; i < first+n; i++ {
		id := fmt.Sprintf("pay_%06d", i)
		amount := int64(1000 + i)
		ev := func(eventID, typ string, f payment.Fact) provider.Event {
			return provider.Event{EventID: eventID, DedupKey: eventID, PaymentID: id, Type: typ, Fact: f}
		}
		for _, e := range []provider.Event{
			ev("evt_c_"+id, "payment.created", payment.Fact{Status: payment.StatusPending, AmountMinor: amount, Currency: "BRL", OccurredAt: at}),
			ev("evt_p_"+id, "payment.paid", payment.Fact{Status: payment.StatusPaid, AmountMinor: amount, Currency: "BRL", OccurredAt: at.Add(time.Minute)}),
			ev("evt_p_"+id, "payment.paid", payment.Fact{Status: payment.StatusPaid, AmountMinor: amount, Currency: "BRL", OccurredAt: at.Add(time.Minute)}),
			ev("evt_r_"+id, "payment.partially_refunded", payment.Fact{Status: payment.StatusPartiallyRefunded, AmountMinor: 100, Currency: "BRL", RefundID: "re_" + id, OccurredAt: at.Add(2 * time.Minute)}),
		} {
			key := "acme:" + id
			env := envelope.Raw{Source: "acme", Driver: "standardwebhooks", PaymentKey: key, Event: e, ReceivedAt: time.Now().UTC(), Body: []byte(`{}`)}
			v, err := env.Marshal()
			if err != nil {
				t.Fatal(err)
			}
			recs = append(recs, &kgo.Record{Topic: topic, Key: []byte(key), Value: v})
		}
	}
	return recs
}

// checkEffects fails the test unless the schema holds exactly the effects
// of payments payments each applied once (see paymentRecords).
func checkEffects(t testing.TB, pool *pgxpool.Pool, payments int) {
	t.Helper()
	for _, c := range []struct {
		what string
		sql  string
		want int
	}{
		{"inbox rows", `SELECT count(*) FROM deliveries`, 4 * payments},
		{"duplicate deliveries", `SELECT count(*) FROM deliveries WHERE reason = 'duplicate_event'`, payments},
		{"transitions", `SELECT count(*) FROM payment_transitions`, 3 * payments},
		{"ledger postings", `SELECT count(*) FROM ledger_postings`, 4 * payments},
		{"undecided or quarantined rows", `SELECT count(*) FROM deliveries WHERE status IN ('received', 'quarantined')`, 0},
	} {
		if got := queryInt(t, pool, c.sql); got != c.want {
			t.Errorf("%s = %d, want %d", c.what, got, c.want)
		}
	}
}

// deliveryOutcome returns the status and reason ("" when none) of the
// delivery that cond (an SQL condition on deliveries) selects.
func deliveryOutcome(t *testing.T, pool *pgxpool.Pool, cond string, args ...any) (status, reason string) {
	t.Helper()
	if err := pool.QueryRow(t.Context(), `SELECT status, COALESCE(reason, '') FROM deliveries WHERE `+cond, args...).Scan(&status, &reason); err != nil {
		t.Fatalf("delivery where %s: %v", cond, err)
	}
	return status, reason
}

func queryInt(t testing.TB, pool *pgxpool.Pool, sql string, args ...any) int {
	t.Helper()
	var n int
	if err := pool.QueryRow(context.Background(), sql, args...).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// newTestProcessor is New with the test's defaults: a private registry, a
// logger writing warnings to the test's output, the broker's minimum
// session timeout.
func newTestProcessor(t testing.TB, pool *pgxpool.Pool, cfg Config) (*Processor, *prometheus.Registry) {
	t.Helper()
	reg := prometheus.NewRegistry()
	cfg.Registerer = reg
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelWarn}))
	}
	if cfg.SessionTimeout == 0 {
		cfg.SessionTimeout = 6 * time.Second
	}
	p, err := New(pool, cfg)
	if err != nil {
		t.Fatal(err)
	}
	return p, reg
}

// fixture is what a consumer-group test starts from: a schema of its
// own, the broker, a raw topic and a group of its own, and an admin client.
type fixture struct {
	db      *testenv.DB
	brokers []string
	topic   string
	group   string
	adm     *kadm.Client
}

// setup returns a fixture whose raw topic has partitions partitions.
func setup(t *testing.T, partitions int) fixture {
	t.Helper()
	brokers := testenv.Kafka(t)
	return fixture{db: testenv.NewDB(t), brokers: brokers, topic: testenv.Topic(t, "raw", partitions), group: testenv.Group(t), adm: testenv.Admin(t, brokers)}
}

// groupBehind returns, as an error, every partition of topic whose offset
// committed to Kafka for group is not its end offset: what lag tools and
// KEDA compute (kadm Lag on the broker's own answers).
func groupBehind(adm *kadm.Client, group, topic string) error {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	ends, err := adm.ListEndOffsets(ctx, topic)
	if err != nil {
		return fmt.Errorf("list end offsets: %w", err)
	}
	committed, err := adm.FetchOffsets(ctx, group)
	if err != nil {
		return fmt.Errorf("fetch group offsets: %w", err)
	}
	var behind []string
	ends.Each(func(o kadm.ListedOffset) {
		c, ok := committed.Lookup(topic, o.Partition)
		switch {
		case o.Err != nil:
			behind = append(behind, fmt.Sprintf("partition %d: end offset: %v", o.Partition, o.Err))
		case !ok || c.At < 0:
			behind = append(behind, fmt.Sprintf("partition %d: no committed offset (end %d)", o.Partition, o.Offset))
		case c.Err != nil:
			behind = append(behind, fmt.Sprintf("partition %d: %v", o.Partition, c.Err))
		case c.At != o.Offset:
			behind = append(behind, fmt.Sprintf("partition %d: committed %d, end %d, lag %d", o.Partition, c.At, o.Offset, o.Offset-c.At))
		}
	})
	if len(behind) > 0 {
		return errors.New(strings.Join(behind, "; "))
	}
	return nil
}

// storedAtEnd returns, as an error, every partition whose offset stored in
// Postgres is not the topic's end offset.
func storedAtEnd(adm *kadm.Client, pool *pgxpool.Pool, group, topic string) error {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	ends, err := adm.ListEndOffsets(ctx, topic)
	if err != nil {
		return err
	}
	var behind []string
	ends.Each(func(o kadm.ListedOffset) {
		var next int64
		err := pool.QueryRow(ctx, `SELECT COALESCE((SELECT next_offset FROM consumer_offsets WHERE group_id = $1 AND topic = $2 AND partition = $3), 0)`,
			group, topic, o.Partition).Scan(&next)
		if err != nil || next != o.Offset {
			behind = append(behind, fmt.Sprintf("partition %d: stored %d, end %d (%v)", o.Partition, next, o.Offset, err))
		}
	})
	if len(behind) > 0 {
		return errors.New(strings.Join(behind, "; "))
	}
	return nil
}

// pgProxy forwards TCP connections to Postgres until cut: then it closes
// every open connection and refuses new ones (accepts and closes them at
// once) until restored. A component whose pool dials the proxy sees a
// database outage; nothing else does.
type pgProxy struct {
	ln     net.Listener
	target string

	mu    sync.Mutex
	cut   bool
	conns map[net.Conn]struct{}
	wg    sync.WaitGroup
}

// newPGProxy starts a proxy to the host:port of dsn and returns it with a
// copy of dsn pointing at the proxy.
func newPGProxy(t testing.TB, dsn string) (*pgProxy, string) {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	px := &pgProxy{ln: ln, target: net.JoinHostPort(cfg.ConnConfig.Host, fmt.Sprint(cfg.ConnConfig.Port)), conns: map[net.Conn]struct{}{}}
	px.wg.Add(1)
	go px.serve()
	t.Cleanup(px.close)
	_, port, _ := net.SplitHostPort(ln.Addr().String())
	proxied := strings.Replace(dsn, fmt.Sprintf("%s:%d", cfg.ConnConfig.Host, cfg.ConnConfig.Port), "127.0.0.1:"+port, 1)
	if proxied == dsn {
		t.Fatalf("cannot point %q at the proxy", dsn)
	}
	return px, proxied
}

func (px *pgProxy) serve() {
	defer px.wg.Done()
	for {
		c, err := px.ln.Accept()
		if err != nil {
			return
		}
		px.mu.Lock()
		if px.cut {
			px.mu.Unlock()
			c.Close()
			continue
		}
		px.mu.Unlock()
		up, err := net.DialTimeout("tcp", px.target, 5*time.Second)
		if err != nil {
			c.Close()
			continue
		}
		px.mu.Lock()
		if px.cut {
			px.mu.Unlock()
			c.Close()
			up.Close()
			continue
		}
		px.conns[c], px.conns[up] = struct{}{}, struct{}{}
		px.mu.Unlock()
		pipe := func(dst, src net.Conn) {
			_, _ = io.Copy(dst, src)
			dst.Close()
			src.Close()
			px.mu.Lock()
			delete(px.conns, dst)
			delete(px.conns, src)
			px.mu.Unlock()
		}
		go pipe(up, c)
		go pipe(c, up)
	}
}

// setCut cuts (true) or restores (false) the database.
func (px *pgProxy) setCut(cut bool) {
	px.mu.Lock()
	defer px.mu.Unlock()
	px.cut = cut
	if cut {
		for c := range px.conns {
			c.Close()
		}
	}
}

func (px *pgProxy) close() {
	px.ln.Close()
	px.setCut(true)
	px.wg.Wait()
}

func storedOffset(t *testing.T, db *testenv.DB, group, topic string, partition int32) int64 {
	t.Helper()
	return int64(queryInt(t, db.Pool, `SELECT next_offset FROM consumer_offsets WHERE group_id = $1 AND topic = $2 AND partition = $3`, group, topic, partition))
}
