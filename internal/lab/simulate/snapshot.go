package simulate

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/paystream/paystream/internal/envelope"
)

// snapshot is what Verify read from the target.
type snapshot struct {
	deliveries  []deliveryRow
	transitions map[string][]transitionRow // by payment, version order
	payments    map[string]paymentRow
	balances    map[string]map[string]int64 // payment -> account -> balance
	stored      map[int32]int64
	ends        map[int32]int64
	ranges      map[int32]offsetRange
	state       []stateRow // read_committed, every partition's order
	uncommitted int        // records a read_uncommitted consumer sees
}

type deliveryRow struct {
	id          int64
	source, key string
	paymentKey  string
	status      string
	duplicateOf *int64
	partition   int32
	offset      int64
}

type transitionRow struct {
	version          int64
	from, to, kind   string
	amount           int64
	currency, refund string
	deliveryID       *int64
}

type paymentRow struct {
	status  string
	version int64
	held    bool
}

type offsetRange struct{ rows, distinct, lo, hi int64 }

type stateRow struct {
	partition int32
	offset    int64
	key       string
	eventID   string
	ev        envelope.State
	decodeErr error
}

// read takes the snapshot the checks need.
func read(ctx context.Context, pool *pgxpool.Pool, t Target, o *Oracle, keys []string) (*snapshot, error) {
	snap := &snapshot{transitions: map[string][]transitionRow{}, payments: map[string]paymentRow{}, balances: map[string]map[string]int64{}, ranges: map[int32]offsetRange{}}
	all := slices.Clone(keys)
	for _, p := range o.Poison {
		all = append(all, p.Key)
	}
	rows, err := pool.Query(ctx, `
		SELECT id, source, dedup_key, payment_key, status, duplicate_of, partition, kafka_offset
		  FROM deliveries WHERE payment_key = ANY($1) AND topic = $2`, all, t.RawTopic)
	if err != nil {
		return nil, fmt.Errorf("verify: read deliveries: %w", err)
	}
	snap.deliveries, err = pgx.CollectRows(rows, func(r pgx.CollectableRow) (deliveryRow, error) {
		var d deliveryRow
		err := r.Scan(&d.id, &d.source, &d.key, &d.paymentKey, &d.status, &d.duplicateOf, &d.partition, &d.offset)
		return d, err
	})
	if err != nil {
		return nil, fmt.Errorf("verify: read deliveries: %w", err)
	}
	rows, err = pool.Query(ctx, `
		SELECT payment_key, version, from_status, to_status, kind, amount_minor, currency, coalesce(refund_id, ''), delivery_id
		  FROM payment_transitions WHERE payment_key = ANY($1) ORDER BY payment_key, version`, keys)
	if err != nil {
		return nil, fmt.Errorf("verify: read transitions: %w", err)
	}
	for rows.Next() {
		var k string
		var tr transitionRow
		if err := rows.Scan(&k, &tr.version, &tr.from, &tr.to, &tr.kind, &tr.amount, &tr.currency, &tr.refund, &tr.deliveryID); err != nil {
			rows.Close()
			return nil, fmt.Errorf("verify: read transitions: %w", err)
		}
		snap.transitions[k] = append(snap.transitions[k], tr)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("verify: read transitions: %w", err)
	}
	rows, err = pool.Query(ctx, `SELECT payment_key, status, version, held FROM payments WHERE payment_key = ANY($1)`, keys)
	if err != nil {
		return nil, fmt.Errorf("verify: read payments: %w", err)
	}
	for rows.Next() {
		var k string
		var p paymentRow
		if err := rows.Scan(&k, &p.status, &p.version, &p.held); err != nil {
			rows.Close()
			return nil, fmt.Errorf("verify: read payments: %w", err)
		}
		snap.payments[k] = p
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("verify: read payments: %w", err)
	}
	rows, err = pool.Query(ctx, `
		SELECT payment_key, account, currency, sum(amount_minor)::bigint FROM ledger_postings
		 WHERE payment_key = ANY($1) GROUP BY 1, 2, 3`, keys)
	if err != nil {
		return nil, fmt.Errorf("verify: read ledger: %w", err)
	}
	for rows.Next() {
		var k, acct, cur string
		var sum int64
		if err := rows.Scan(&k, &acct, &cur, &sum); err != nil {
			rows.Close()
			return nil, fmt.Errorf("verify: read ledger: %w", err)
		}
		if sum == 0 {
			continue
		}
		if snap.balances[k] == nil {
			snap.balances[k] = map[string]int64{}
		}
		snap.balances[k][acct+"/"+cur] = sum
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("verify: read ledger: %w", err)
	}
	if snap.stored, _, err = storedOffsets(ctx, pool, t.Group, t.RawTopic); err != nil {
		return nil, fmt.Errorf("verify: %w", err)
	}
	if snap.ends, err = endOffsets(ctx, t.kafkaOpts(), t.RawTopic); err != nil {
		return nil, fmt.Errorf("verify: %w", err)
	}
	// Each partition's deliveries from where the simulation started.
	var parts []int32
	var lows []int64
	for p := range snap.stored {
		parts = append(parts, p)
		lows = append(lows, o.StartOffsets[p]) // 0 when unknown
	}
	rows, err = pool.Query(ctx, `
		SELECT d.partition, count(*), count(DISTINCT d.kafka_offset), min(d.kafka_offset), max(d.kafka_offset)
		  FROM deliveries d JOIN unnest($2::int[], $3::bigint[]) AS s(p, lo) ON d.partition = s.p AND d.kafka_offset >= s.lo
		 WHERE d.topic = $1 GROUP BY d.partition`, t.RawTopic, parts, lows)
	if err != nil {
		return nil, fmt.Errorf("verify: read delivery offsets: %w", err)
	}
	for rows.Next() {
		var p int32
		var r offsetRange
		if err := rows.Scan(&p, &r.rows, &r.distinct, &r.lo, &r.hi); err != nil {
			rows.Close()
			return nil, fmt.Errorf("verify: read delivery offsets: %w", err)
		}
		snap.ranges[p] = r
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("verify: read delivery offsets: %w", err)
	}
	if snap.state, err = readState(ctx, t.kafkaOpts(), t.StateTopic, toSet(keys)); err != nil {
		return nil, fmt.Errorf("verify: %w", err)
	}
	uncommitted, err := readStateAt(ctx, t.kafkaOpts(), t.StateTopic, toSet(keys), false)
	if err != nil {
		return nil, fmt.Errorf("verify: %w", err)
	}
	snap.uncommitted = len(uncommitted)
	return snap, nil
}

// readState reads the state topic as a read_committed consumer does, from
// the start to each partition's last stable offset, keeping the records of
// the payments in keys, in each partition's order.
func readState(ctx context.Context, opts []kgo.Opt, topic string, keys map[string]bool) ([]stateRow, error) {
	return readStateAt(ctx, opts, topic, keys, true)
}

// kafkaOpts are the options of the target's Kafka clients.
func (t Target) kafkaOpts() []kgo.Opt { return kafkaClientOpts(t.KafkaBrokers, t.KafkaOpts) }

// readStateAt is readState for a read_committed consumer (up to the last
// stable offsets) or a read_uncommitted one (up to the high watermarks,
// aborted transactions' records included).
func readStateAt(ctx context.Context, opts []kgo.Opt, topic string, keys map[string]bool, committed bool) ([]stateRow, error) {
	adm, err := kgo.NewClient(opts...)
	if err != nil {
		return nil, fmt.Errorf("kafka client: %w", err)
	}
	list, isolation := kadm.NewClient(adm).ListCommittedOffsets, kgo.ReadCommitted()
	if !committed {
		list, isolation = kadm.NewClient(adm).ListEndOffsets, kgo.ReadUncommitted()
	}
	stable, err := list(ctx, topic)
	adm.Close()
	if err == nil {
		err = stable.Error()
	}
	if err != nil {
		return nil, fmt.Errorf("last stable offsets of %s: %w", topic, err)
	}
	todo := map[int32]int64{}
	parts := map[int32]kgo.Offset{}
	stable.Each(func(o kadm.ListedOffset) {
		if o.Offset > 0 {
			todo[o.Partition] = o.Offset
			parts[o.Partition] = kgo.NewOffset().AtStart()
		}
	})
	if len(todo) == 0 {
		return nil, nil
	}
	cl, err := kgo.NewClient(append(slices.Clip(opts),
		kgo.ConsumePartitions(map[string]map[int32]kgo.Offset{topic: parts}),
		kgo.FetchIsolationLevel(isolation), kgo.FetchMaxWait(100*time.Millisecond),
		// Markers too, so the read knows it reached a last stable offset
		// that is a marker's.
		kgo.KeepControlRecords())...)
	if err != nil {
		return nil, fmt.Errorf("kafka client: %w", err)
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	var out []stateRow
	for len(todo) > 0 {
		fs := cl.PollFetches(ctx)
		if ctx.Err() != nil {
			return nil, fmt.Errorf("read %s: partitions %v not read to their last stable offset: %w", topic, slices.Collect(maps.Keys(todo)), ctx.Err())
		}
		var ferr error
		fs.EachError(func(_ string, p int32, err error) { ferr = fmt.Errorf("read %s/%d: %w", topic, p, err) })
		if ferr != nil {
			return nil, ferr
		}
		fs.EachRecord(func(r *kgo.Record) {
			if end, ok := todo[r.Partition]; ok && r.Offset+1 >= end {
				delete(todo, r.Partition)
			}
			if r.Attrs.IsControl() || !keys[string(r.Key)] {
				return
			}
			sr := stateRow{partition: r.Partition, offset: r.Offset, key: string(r.Key)}
			for _, h := range r.Headers {
				if h.Key == envelope.HeaderEventID {
					sr.eventID = string(h.Value)
				}
			}
			sr.decodeErr = json.Unmarshal(r.Value, &sr.ev)
			out = append(out, sr)
		})
	}
	return out, nil
}
