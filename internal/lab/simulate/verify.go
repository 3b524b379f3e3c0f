package simulate

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/paystream/paystream/internal/envelope"
)

// Target is the running pipeline a simulation verifies.
type Target struct {
	// DatabaseURL and Schema reach the processor's tables (Schema, when
	// set, becomes the search_path). Pool, when set, is used instead.
	DatabaseURL, Schema string
	Pool                *pgxpool.Pool
	// KafkaBrokers, RawTopic, StateTopic and Group are the pipeline's
	// brokers, topics and processor group.
	KafkaBrokers []string
	RawTopic     string
	StateTopic   string
	Group        string
	// KafkaOpts are extra franz-go options given to every Kafka client,
	// e.g. TLS and SASL from internal/kafkaconn. Defaults to none.
	KafkaOpts []kgo.Opt
	// DrainTimeout bounds the wait for the backlog to drain (every raw
	// record applied, every refetch done, every transition on the state
	// topic). Defaults to 2 minutes.
	DrainTimeout time.Duration
	// StallLimit is I9's bound on the longest time the Sampler saw a
	// backlog without progress. Defaults to 60s.
	StallLimit time.Duration
	// Progress, when set, is told what the drain waits for, about once a
	// second.
	Progress func(string)
}

// InvariantResult is one invariant's verdict.
type InvariantResult struct {
	ID   string `json:"id"`
	Name string `json:"name"`
	OK   bool   `json:"ok"`
	// Skipped marks an invariant the run did not exercise (OK stays true).
	Skipped bool `json:"skipped,omitempty"`
	// Detail says how it was checked, with numbers, and the first
	// violations found.
	Detail string `json:"detail"`
	// Checked counts the items checked (webhooks, records, payments…);
	// Violations the violations found.
	Checked    int `json:"checked"`
	Violations int `json:"violations"`
}

// Report is a verification's result: one line per invariant, I1 to I10.
type Report struct {
	Invariants []InvariantResult `json:"invariants"`
	// Drained says whether the backlog drained within DrainTimeout, and
	// DrainTime how long the wait took.
	Drained   bool          `json:"drained"`
	DrainTime time.Duration `json:"drain_time_ns"`
	// Payments counts the payments checked, Incomplete those left out of
	// the state checks because a webhook of theirs was never acknowledged.
	Payments   int `json:"payments"`
	Incomplete int `json:"incomplete"`
}

// OK reports whether every invariant holds.
func (r Report) OK() bool {
	for _, inv := range r.Invariants {
		if !inv.OK {
			return false
		}
	}
	return len(r.Invariants) > 0
}

// Failed returns the ids of the invariants that do not hold.
func (r Report) Failed() []string {
	var ids []string
	for _, inv := range r.Invariants {
		if !inv.OK {
			ids = append(ids, inv.ID)
		}
	}
	return ids
}

// Result returns invariant id's result (zero when absent).
func (r Report) Result(id string) InvariantResult {
	for _, inv := range r.Invariants {
		if inv.ID == id {
			return inv
		}
	}
	return InvariantResult{}
}

// maxListed is how many violations a Detail names.
const maxListed = 5

// violations collects an invariant's violations, keeping the first few.
type violations struct {
	n     int
	first []string
}

func (v *violations) add(format string, args ...any) {
	v.n++
	if len(v.first) < maxListed {
		v.first = append(v.first, fmt.Sprintf(format, args...))
	}
}

// result builds an InvariantResult: how is the method, always said.
func (v *violations) result(id, name string, checked int, how string) InvariantResult {
	r := InvariantResult{ID: id, Name: name, OK: v.n == 0, Checked: checked, Violations: v.n, Detail: how}
	if v.n > 0 {
		r.Detail = fmt.Sprintf("%d violation(s): %s; checked: %s", v.n, strings.Join(v.first, "; "), how)
	}
	return r
}

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

// Verify waits (up to t.DrainTimeout) for the target to apply everything
// it acknowledged, then checks I1–I10 against the oracle. An error means
// it could not read the target; violations are in the Report.
func (s *Simulation) Verify(ctx context.Context, t Target) (Report, error) {
	switch {
	case len(t.KafkaBrokers) == 0 || t.RawTopic == "" || t.StateTopic == "" || t.Group == "":
		return Report{}, errors.New("verify: KafkaBrokers, RawTopic, StateTopic and Group are required")
	case t.Pool == nil && t.DatabaseURL == "":
		return Report{}, errors.New("verify: DatabaseURL (or Pool) is required")
	}
	t.DrainTimeout = cmp.Or(t.DrainTimeout, 2*time.Minute)
	t.StallLimit = cmp.Or(t.StallLimit, time.Minute)
	pool := t.Pool
	if pool == nil {
		var err error
		if pool, err = openPool(ctx, t.DatabaseURL, t.Schema); err != nil {
			return Report{}, err
		}
		defer pool.Close()
	}
	o := s.oracle
	complete := o.complete()
	keys := o.paymentKeys()

	began := time.Now()
	drained, why, err := s.drain(ctx, pool, t, keys, complete)
	if err != nil {
		return Report{}, err
	}
	rep := Report{Drained: drained, DrainTime: time.Since(began), Payments: len(keys)}
	for _, c := range complete {
		if !c {
			rep.Incomplete++
		}
	}
	s.FinishSampling()
	snap, err := read(ctx, pool, t, o, keys)
	if err != nil {
		return Report{}, err
	}
	rep.Invariants = []InvariantResult{
		checkI1(o, snap),
		checkI2(o, snap),
		checkI3(snap),
		checkI4(o, snap),
		checkI5(o, snap),
		checkI6(snap),
		checkI7(o, snap, complete),
		checkI8(snap),
		checkI9(o, drained, why, rep.DrainTime, t.StallLimit),
		checkI10(o, snap),
	}
	return rep, nil
}

// openPool connects to url with schema as its search_path.
func openPool(ctx context.Context, url, schema string) (*pgxpool.Pool, error) {
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		return nil, fmt.Errorf("parse database URL: %w", err) // pgx redacts the password
	}
	if schema != "" {
		cfg.ConnConfig.RuntimeParams["search_path"] = schema
	}
	cfg.ConnConfig.RuntimeParams["application_name"] = "paystream simulate"
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("connect to postgres: %w", err)
	}
	return pool, nil
}

// drain waits until the stored offsets reached the raw topic's end, no
// delivery of a complete payment waits (deferred), and every transition
// of the oracle's payments is on the state topic; or until the timeout.
// It reports whether it drained and, if not, what it was waiting for.
func (s *Simulation) drain(ctx context.Context, pool *pgxpool.Pool, t Target, keys []string, complete []bool) (bool, string, error) {
	deadline := time.Now().Add(t.DrainTimeout)
	var waitingKeys []string
	for i, k := range keys {
		if complete[i] {
			waitingKeys = append(waitingKeys, k)
		}
	}
	why := ""
	for {
		why = ""
		// The pipeline's services may be restarting: an error reading
		// them is something to wait for, like a backlog.
		ends, err := endOffsets(ctx, t.kafkaOpts(), t.RawTopic)
		if err != nil {
			why = err.Error()
		}
		stored, _, err := storedOffsets(ctx, pool, t.Group, t.RawTopic)
		if err != nil && why == "" {
			why = err.Error()
		}
		var behind int64
		for p, end := range ends {
			behind += max(0, end-stored[p])
		}
		if why == "" && behind > 0 {
			why = fmt.Sprintf("%d raw records not applied", behind)
		}
		if why == "" {
			var waiting int
			err := pool.QueryRow(ctx, `SELECT count(*) FROM deliveries WHERE payment_key = ANY($1) AND status = 'deferred'`, waitingKeys).Scan(&waiting)
			switch {
			case err != nil:
				why = err.Error()
			case waiting > 0:
				why = fmt.Sprintf("%d deliveries deferred (refetch or predecessor pending)", waiting)
			}
		}
		if why == "" {
			var want int
			if err := pool.QueryRow(ctx, `SELECT count(*) FROM payment_transitions WHERE payment_key = ANY($1)`, keys).Scan(&want); err != nil {
				why = err.Error()
			} else {
				state, err := readState(ctx, t.kafkaOpts(), t.StateTopic, toSet(keys))
				seen := map[string]bool{}
				for _, r := range state {
					seen[r.eventID] = true
				}
				switch {
				case err != nil:
					why = err.Error()
				case len(seen) < want:
					why = fmt.Sprintf("%d of %d transitions on the state topic", len(seen), want)
				}
			}
		}
		if why == "" {
			return true, "", nil
		}
		if t.Progress != nil {
			t.Progress("draining: " + why)
		}
		if ctx.Err() != nil {
			return false, why, fmt.Errorf("verify: %w", ctx.Err())
		}
		if time.Now().After(deadline) {
			return false, why, nil
		}
		if !sleep(ctx, 500*time.Millisecond) {
			return false, why, ctx.Err()
		}
	}
}

func toSet(keys []string) map[string]bool {
	m := make(map[string]bool, len(keys))
	for _, k := range keys {
		m[k] = true
	}
	return m
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

// byDedupKey maps each (source, dedup key) to its deliveries.
func byDedupKey(snap *snapshot) map[[2]string][]deliveryRow {
	m := map[[2]string][]deliveryRow{}
	for _, d := range snap.deliveries {
		k := [2]string{d.source, d.key}
		m[k] = append(m[k], d)
	}
	return m
}

// isRedelivery reports whether d is recorded as a redelivery of an
// earlier delivery of the same event.
func (d deliveryRow) isRedelivery() bool { return d.duplicateOf != nil }

func checkI1(o *Oracle, snap *snapshot) InvariantResult {
	var v violations
	byKey := byDedupKey(snap)
	checked := 0
	for _, e := range o.Events {
		if e.Acks == 0 {
			continue
		}
		checked++
		src := o.Payments[e.Payment].Source
		ds := byKey[[2]string{src, e.DedupKey}]
		first := 0
		for _, d := range ds {
			if !d.isRedelivery() {
				first++
			}
		}
		switch {
		case first != 1:
			v.add("%s event %s: %d first deliveries in the inbox, want 1", src, e.EventID, first)
		case len(ds) < e.Acks:
			v.add("%s event %s: acknowledged %d times, %d deliveries recorded", src, e.EventID, e.Acks, len(ds))
		}
	}
	// Every transition (a state change) on the state topic exactly once.
	onTopic := map[string]int{}
	for _, r := range snap.state {
		onTopic[r.eventID]++
	}
	transitions := 0
	for key, trs := range snap.transitions {
		for _, tr := range trs {
			transitions++
			id := fmt.Sprintf("%s:%d", key, tr.version)
			if n := onTopic[id]; n != 1 {
				v.add("transition %s on the state topic %d times, want 1", id, n)
			}
		}
	}
	return v.result("I1", "every acknowledged webhook in the inbox once, each state change on the topic once", checked,
		fmt.Sprintf("%d acknowledged webhooks: exactly one first delivery per (source, dedup key as the driver computes it) and at least as many deliveries as 2xx answers; %d transitions each read once from the state topic (read_committed)", checked, transitions))
}

func checkI2(o *Oracle, snap *snapshot) InvariantResult {
	var v violations
	// A delivery id -> (source, dedup key).
	keyOf := map[int64][2]string{}
	for _, d := range snap.deliveries {
		keyOf[d.id] = [2]string{d.source, d.key}
	}
	checked := 0
	for key, trs := range snap.transitions {
		checked++
		causes := map[[2]string]map[int64]bool{}
		seen := map[string]int64{}
		for _, tr := range trs {
			if tr.deliveryID != nil {
				k := keyOf[*tr.deliveryID]
				if causes[k] == nil {
					causes[k] = map[int64]bool{}
				}
				causes[k][*tr.deliveryID] = true
			}
			fact := ""
			switch tr.kind {
			case "capture", "dispute", "dispute_won", "dispute_lost":
				fact = tr.kind
			case "refund":
				fact = "refund " + tr.refund
			case "status":
				fact = "status " + tr.to
			}
			if fact == "" {
				continue
			}
			if prev, ok := seen[fact]; ok {
				v.add("%s: %s applied twice (versions %d and %d)", key, fact, prev, tr.version)
			}
			seen[fact] = tr.version
		}
		for k, ds := range causes {
			if len(ds) > 1 {
				v.add("%s: event %s/%s had effects from %d deliveries", key, k[0], k[1], len(ds))
			}
		}
	}
	return v.result("I2", "zero duplicate effects", checked,
		fmt.Sprintf("%d payments' transitions: no capture, dispute, dispute outcome, refund id or status reached twice, and no two deliveries of one event both causing transitions", checked))
}

func checkI3(snap *snapshot) InvariantResult {
	var v violations
	seen := map[string]int{}
	for _, r := range snap.state {
		if r.eventID == "" {
			v.add("record %d@%d without an event-id header", r.partition, r.offset)
			continue
		}
		seen[r.eventID]++
		if seen[r.eventID] == 2 {
			v.add("event id %s read twice", r.eventID)
		}
	}
	return v.result("I3", "no repeated event id for read_committed consumers", len(snap.state),
		fmt.Sprintf("%d records of the simulated payments read with read_committed from the start of the state topic: %d distinct event ids", len(snap.state), len(seen)))
}

func checkI4(o *Oracle, snap *snapshot) InvariantResult {
	var v violations
	how := []string{}
	if o.Samples != nil {
		for _, r := range o.Samples.OffsetRegressions {
			v.add("%s", r)
		}
		how = append(how, fmt.Sprintf("sampled stored offsets %d times: %d decreases", o.Samples.Polls, len(o.Samples.OffsetRegressions)))
	} else {
		how = append(how, "no sampler: decreases not watched")
	}
	checked := 0
	for p, end := range snap.ends {
		lo := o.StartOffsets[p]
		stored := snap.stored[p]
		if end <= lo {
			continue
		}
		checked++
		if stored != end {
			v.add("partition %d: stored offset %d, end offset %d", p, stored, end)
			continue
		}
		r := snap.ranges[p]
		if want := stored - lo; r.distinct != want || r.rows != r.distinct {
			v.add("partition %d: %d delivery rows at %d distinct offsets in [%d, %d), want %d", p, r.rows, r.distinct, lo, stored, want)
		}
	}
	from := "the simulation's start"
	if o.StartOffsets == nil {
		from = "offset 0 (where the simulation started is unknown: no brokers while delivering)"
	}
	how = append(how, fmt.Sprintf("%d partitions: stored offset equals the end offset and every offset from %s to it has its delivery row (none skipped)", checked, from))
	return v.result("I4", "stored offsets never decrease, none skipped", checked, strings.Join(how, "; "))
}

func checkI5(o *Oracle, snap *snapshot) InvariantResult {
	var v violations
	how := "from outside, a revoked worker's commit that succeeded shows as a second delivery row for a raw record, or an owner epoch going back"
	if o.Samples != nil {
		for _, r := range o.Samples.EpochRegressions {
			v.add("%s", r)
		}
		how += fmt.Sprintf("; sampled epochs %d times: %d decreases", o.Samples.Polls, len(o.Samples.EpochRegressions))
	} else {
		how += "; no sampler: epochs not watched"
	}
	checked := 0
	for p, r := range snap.ranges {
		checked++
		if r.rows != r.distinct {
			v.add("partition %d: %d delivery rows for %d raw records", p, r.rows, r.distinct)
		}
	}
	how += fmt.Sprintf("; %d partitions: one delivery row per raw record", checked)
	return v.result("I5", "a revoked worker's commit fails", checked, how)
}

func checkI6(snap *snapshot) InvariantResult {
	var v violations
	type seen struct {
		partition int32
		last      int64
	}
	per := map[string]*seen{}
	for _, r := range snap.state {
		if r.decodeErr != nil {
			v.add("record %d@%d: %v", r.partition, r.offset, r.decodeErr)
			continue
		}
		s := per[r.key]
		if s == nil {
			s = &seen{partition: r.partition}
			per[r.key] = s
		}
		if r.partition != s.partition {
			v.add("%s on partitions %d and %d", r.key, s.partition, r.partition)
		}
		if r.ev.Version != s.last+1 {
			v.add("%s: version %d after %d", r.key, r.ev.Version, s.last)
		}
		s.last = max(s.last, r.ev.Version)
	}
	for key, p := range snap.payments {
		got := int64(0)
		if s := per[key]; s != nil {
			got = s.last
		}
		if got != p.version {
			v.add("%s: topic reaches version %d, database %d", key, got, p.version)
		}
	}
	return v.result("I6", "per-payment order on the topic equals version order, gapless", len(per),
		fmt.Sprintf("%d payments on the state topic: one partition each, versions 1, 2, 3… in partition order up to the database's version", len(per)))
}

func checkI7(o *Oracle, snap *snapshot, complete []bool) InvariantResult {
	var v violations
	checked := 0
	var wantTotal, gotTotal int64
	for i, op := range o.Payments {
		if !complete[i] {
			continue
		}
		checked++
		p, ok := snap.payments[op.PaymentKey]
		if !ok {
			v.add("%s (%s): not in the database", op.PaymentKey, op.Shape)
			continue
		}
		if p.status != op.Expected.Status {
			v.add("%s (%s): status %s, the oracle says %s", op.PaymentKey, op.Shape, p.status, op.Expected.Status)
		}
		want := map[string]int64{}
		for acct, b := range op.Expected.Balances {
			want[acct+"/"+Currency] = b
		}
		got := snap.balances[op.PaymentKey]
		if !maps.Equal(want, got) {
			v.add("%s (%s): ledger %v, the oracle says %v", op.PaymentKey, op.Shape, got, want)
		}
		wantTotal += want["gateway_receivable/"+Currency]
		gotTotal += got["gateway_receivable/"+Currency]
	}
	how := fmt.Sprintf("%d payments: status and ledger balances per account equal the oracle's independent model; gateway receivable in all %d (oracle %d)", checked, gotTotal, wantTotal)
	if n := len(o.Payments) - checked; n > 0 {
		how += fmt.Sprintf("; %d payments left out: a webhook never acknowledged", n)
	}
	return v.result("I7", "money conserved: ledger equals the oracle", checked, how)
}

func checkI8(snap *snapshot) InvariantResult {
	var v violations
	for _, r := range snap.state {
		if r.decodeErr != nil {
			continue
		}
		trs := snap.transitions[r.key]
		i, found := slices.BinarySearchFunc(trs, r.ev.Version, func(tr transitionRow, v int64) int { return cmp.Compare(tr.version, v) })
		if !found {
			v.add("%s: no committed transition for the topic's version %d", r.eventID, r.ev.Version)
			continue
		}
		tr := trs[i]
		if string(r.ev.Status) != tr.to || r.ev.Kind != tr.kind || r.ev.AmountMinor != tr.amount || r.ev.RefundID != tr.refund {
			v.add("%s: topic says %s %s %d, the committed transition %s %s %d", r.eventID, r.ev.Kind, r.ev.Status, r.ev.AmountMinor, tr.kind, tr.to, tr.amount)
		}
	}
	return v.result("I8", "nothing from a rolled-back transaction reaches the topic", len(snap.state),
		fmt.Sprintf("%d read_committed records each match a committed transition (status, kind, amount, refund id) of the database; a read_uncommitted consumer sees %d records of the simulated payments (%d more: aborted or open Kafka transactions, which read_committed consumers never see)",
			len(snap.state), snap.uncommitted, snap.uncommitted-len(snap.state)))
}

func checkI9(o *Oracle, drained bool, why string, took, stallLimit time.Duration) InvariantResult {
	var v violations
	if !drained {
		v.add("backlog not drained after %s: %s", took.Round(time.Millisecond), why)
	}
	how := fmt.Sprintf("backlog drained in %s after delivery", took.Round(time.Millisecond))
	if o.Samples != nil {
		if o.Samples.LongestStall > stallLimit {
			v.add("no progress for %s with a backlog (limit %s)", o.Samples.LongestStall.Round(time.Millisecond), stallLimit)
		}
		how += fmt.Sprintf("; %d samples over %s (%d could not read): offsets advanced %d, longest time with a backlog and no progress %s (limit %s)",
			o.Samples.Polls, o.Samples.Span.Round(time.Millisecond), o.Samples.Failed, o.Samples.Advanced, o.Samples.LongestStall.Round(time.Millisecond), stallLimit)
	} else {
		how += "; no sampler: progress during the run not watched"
	}
	return v.result("I9", "progress during faults, backlog drains after", 1, how)
}

func checkI10(o *Oracle, snap *snapshot) InvariantResult {
	if len(o.Poison) == 0 {
		return InvariantResult{ID: "I10", Name: "poison never blocks a partition", OK: true, Skipped: true,
			Detail: "not exercised: no poison planted (--poison N)"}
	}
	var v violations
	quarantined := map[[2]int64]bool{}
	for _, d := range snap.deliveries {
		if d.status == "quarantined" {
			quarantined[[2]int64{int64(d.partition), d.offset}] = true
		}
	}
	for _, p := range o.Poison {
		if !quarantined[[2]int64{int64(p.Partition), p.Offset}] {
			v.add("poison at %d@%d not quarantined", p.Partition, p.Offset)
		}
		if snap.stored[p.Partition] <= p.Offset {
			v.add("partition %d stuck at %d, poison at %d", p.Partition, snap.stored[p.Partition], p.Offset)
		}
	}
	// Records after the poison on its partition were applied.
	after := 0
	for _, d := range snap.deliveries {
		for _, p := range o.Poison {
			if d.partition == p.Partition && d.offset > p.Offset && d.status != "quarantined" {
				after++
				break
			}
		}
	}
	return v.result("I10", "poison never blocks a partition", len(o.Poison),
		fmt.Sprintf("%d poison records each quarantined, their partitions' stored offsets past them, %d later deliveries of simulated payments decided on those partitions", len(o.Poison), after))
}
