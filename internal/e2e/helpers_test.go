package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/paystream/paystream/internal/envelope"
	"github.com/paystream/paystream/internal/ledger"
	"github.com/paystream/paystream/internal/provider"
	"github.com/paystream/paystream/internal/testenv"
	"github.com/paystream/paystream/processor"
	"github.com/paystream/paystream/sink"
)

// envelopeValue is what a (correct, or old and buggy) ingest puts on the raw
// topic for one event of source's payment paymentKey.
func envelopeValue(t testing.TB, source, paymentKey string, ev provider.Event) []byte {
	t.Helper()
	env := envelope.Raw{
		Source: source, Driver: "standardwebhooks", PaymentKey: paymentKey, Event: ev,
		ReceivedAt: time.Now().UTC(), Body: []byte(`{"test":true}`),
	}
	v, err := env.Marshal()
	if err != nil {
		t.Fatal(err)
	}
	return v
}

// testLogger logs warnings and errors to the test's output.
func testLogger(t testing.TB) *slog.Logger {
	return slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelWarn}))
}

// runProcessor runs a processor in the test process until the returned
// service is stopped (or the test ends).
func runProcessor(t testing.TB, pool *pgxpool.Pool, cfg processor.Config) *testenv.Service {
	t.Helper()
	if cfg.Registerer == nil {
		cfg.Registerer = prometheus.NewRegistry()
	}
	if cfg.Logger == nil {
		cfg.Logger = testLogger(t)
	}
	if cfg.SessionTimeout == 0 {
		cfg.SessionTimeout = 6 * time.Second // the broker's minimum
	}
	proc, err := processor.New(pool, cfg)
	if err != nil {
		t.Fatal(err)
	}
	return testenv.Start(t, "processor", proc.Run)
}

// runSink runs a sink relay in the test process, on its own checkpoint
// topic. Like paystream migrate, it first creates the schema's replication
// slot, so every state event committed after runSink returns is relayed
// however late the relay starts; it drops the slot and its publication
// once the relay stopped (the slot would hold the shared server's WAL).
func runSink(t testing.TB, pool *pgxpool.Pool, brokers []string, topic string) *testenv.Service {
	t.Helper()
	setupSlot(t, pool)
	t.Cleanup(func() { dropSlot(t, pool) })
	relay, err := sink.New(pool, sink.Config{
		Brokers: brokers, Topic: topic, CheckpointTopic: testenv.Topic(t, "ckpt", 1),
		MaxBatchDelay: 5 * time.Millisecond, HeartbeatInterval: time.Second,
		Logger: testLogger(t), Registerer: prometheus.NewRegistry(),
	})
	if err != nil {
		t.Fatal(err)
	}
	return testenv.Start(t, "sink", relay.Run)
}

// setupSlot creates the replication slot of pool's schema, as paystream
// migrate does, and returns its name.
func setupSlot(t testing.TB, pool *pgxpool.Pool) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	slot, err := sink.SetupSlot(ctx, pool)
	if err != nil {
		t.Fatal(err)
	}
	return slot
}

// relayTopics creates the topics of a test running its own processor and
// relays (raw and state of three partitions each, the relays' checkpoint
// topic) and names the processor's consumer group.
func relayTopics(t testing.TB) (raw, state, ckpt, group string) {
	t.Helper()
	return testenv.Topic(t, "raw", 3), testenv.Topic(t, "state", 3), testenv.Topic(t, "ckpt", 1), testenv.Group(t)
}

// relayPipeline is where a test running its own relays starts: a fresh
// schema with the relay's replication slot set up (testenv drops the slot
// with the schema), the relay topics, and a processor applying raw to the
// schema.
type relayPipeline struct {
	db                      *testenv.DB
	brokers                 []string
	raw, state, ckpt, group string
}

// startRelayPipeline sets up a relayPipeline whose processor commits at
// most batchMaxRecords records a transaction.
func startRelayPipeline(t testing.TB, batchMaxRecords int) relayPipeline {
	t.Helper()
	p := relayPipeline{db: testenv.NewDB(t), brokers: testenv.Kafka(t)}
	p.raw, p.state, p.ckpt, p.group = relayTopics(t)
	setupSlot(t, p.db.Pool)
	runProcessor(t, p.db.Pool, processor.Config{Brokers: p.brokers, Topic: p.raw, Group: p.group, BatchMaxRecords: batchMaxRecords})
	return p
}

// dropSlot drops the replication slot and publication of pool's schema
// (sink.SlotName) once no relay streams it.
func dropSlot(t testing.TB, pool *pgxpool.Pool) {
	t.Helper()
	ctx := context.Background()
	slot, err := sink.Slot(ctx, pool)
	if err != nil {
		t.Errorf("drop replication slot: %v", err)
		return
	}
	testenv.WaitFor(t, 30*time.Second, func() error {
		_, err := pool.Exec(ctx, `SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE slot_name = $1`, slot)
		return err
	})
	if _, err := pool.Exec(ctx, "DROP PUBLICATION IF EXISTS "+pgx.Identifier{slot}.Sanitize()); err != nil {
		t.Errorf("drop publication %s: %v", slot, err)
	}
}

// offsetWatch polls a group's stored offsets and owner epochs and records
// every decrease, and every snapshot in which a partition's stored offset
// and its inbox rows disagree (the offset must advance in the transaction
// that writes the rows of the records it covers).
type offsetWatch struct {
	stop chan struct{}
	wg   sync.WaitGroup

	mu          sync.Mutex
	regressions []string
	torn        []string
	polls       int
}

func watchOffsets(t testing.TB, pool *pgxpool.Pool, group, topic string) *offsetWatch {
	w := &offsetWatch{stop: make(chan struct{})}
	w.wg.Add(1)
	go func() {
		defer w.wg.Done()
		lastOff, lastEpoch := map[int32]int64{}, map[int32]int64{}
		for {
			select {
			case <-w.stop:
				return
			case <-time.After(15 * time.Millisecond):
			}
			// One statement, one snapshot: the offset and the inbox rows
			// are seen as of the same commit.
			rows, err := pool.Query(context.Background(), `
				SELECT co.partition, co.next_offset, co.owner_epoch,
				       (SELECT count(*) FROM deliveries i WHERE i.topic = co.topic AND i.partition = co.partition AND i.kafka_offset < co.next_offset),
				       (SELECT count(*) FROM deliveries i WHERE i.topic = co.topic AND i.partition = co.partition AND i.kafka_offset >= co.next_offset)
				  FROM consumer_offsets co WHERE co.group_id = $1 AND co.topic = $2`, group, topic)
			if err != nil {
				continue
			}
			w.mu.Lock()
			w.polls++
			for rows.Next() {
				var p int32
				var off, epoch, below, above int64
				if rows.Scan(&p, &off, &epoch, &below, &above) != nil {
					continue
				}
				if off < lastOff[p] {
					w.regressions = append(w.regressions, fmt.Sprintf("partition %d: offset %d after %d", p, off, lastOff[p]))
				}
				if epoch < lastEpoch[p] {
					w.regressions = append(w.regressions, fmt.Sprintf("partition %d: epoch %d after %d", p, epoch, lastEpoch[p]))
				}
				if below != off || above != 0 {
					w.torn = append(w.torn, fmt.Sprintf("partition %d: stored offset %d but %d inbox rows below it and %d at or above it", p, off, below, above))
				}
				lastOff[p], lastEpoch[p] = off, epoch
			}
			w.mu.Unlock()
			rows.Close()
		}
	}()
	t.Cleanup(w.finish)
	return w
}

func (w *offsetWatch) finish() {
	select {
	case <-w.stop:
	default:
		close(w.stop)
	}
	w.wg.Wait()
}

// check stops the watch and fails the test if it saw an offset or epoch go
// backwards or an offset disagree with the inbox.
func (w *offsetWatch) check(t testing.TB) {
	t.Helper()
	w.finish()
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.polls == 0 {
		t.Errorf("offset watch never polled")
	}
	for _, r := range w.regressions {
		t.Errorf("went backwards: %s", r)
	}
	for _, r := range w.torn {
		t.Errorf("offset and inbox disagree: %s", r)
	}
}

// ledgerByPayment sums ledger_postings per payment, account and currency,
// leaving zero balances out (as payment.State.Balances does).
func ledgerByPayment(t testing.TB, pool *pgxpool.Pool) map[string]map[ledger.Key]int64 {
	t.Helper()
	rows, err := pool.Query(context.Background(),
		`SELECT payment_key, account, currency, sum(amount_minor)::bigint FROM ledger_postings GROUP BY 1, 2, 3`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	got := map[string]map[ledger.Key]int64{}
	for rows.Next() {
		var key string
		var k ledger.Key
		var sum int64
		if err := rows.Scan(&key, &k.Account, &k.Currency, &sum); err != nil {
			t.Fatal(err)
		}
		if sum == 0 {
			continue
		}
		if got[key] == nil {
			got[key] = map[ledger.Key]int64{}
		}
		got[key][k] = sum
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return got
}

// stateRecord is one record consumed from the normalized topic.
type stateRecord struct {
	eventID     string // the event-id header
	republished bool   // the paystream-republished header
	raw         []byte
	ev          envelope.State
}

// decodeState decodes a record of the normalized topic.
func decodeState(t testing.TB, r *kgo.Record) stateRecord {
	t.Helper()
	sr := stateRecord{raw: r.Value}
	for _, h := range r.Headers {
		switch h.Key {
		case envelope.HeaderEventID:
			sr.eventID = string(h.Value)
		case sink.HeaderRepublished:
			sr.republished = true
		}
	}
	if err := json.Unmarshal(r.Value, &sr.ev); err != nil {
		t.Fatalf("state record %s/%d@%d: %v", r.Topic, r.Partition, r.Offset, err)
	}
	if string(r.Key) != sr.ev.PaymentKey {
		t.Errorf("state record %s: key %q, payment_key %q", sr.eventID, r.Key, sr.ev.PaymentKey)
	}
	return sr
}

// committedState returns every record of the normalized topic a
// read_committed consumer sees, up to each partition's last stable offset
// at the time of the call, in each partition's order, decoded.
func committedState(t testing.TB, brokers []string, topic string) []stateRecord {
	t.Helper()
	var out []stateRecord
	for _, r := range testenv.ReadCommitted(t, brokers, topic) {
		out = append(out, decodeState(t, r))
	}
	return out
}
