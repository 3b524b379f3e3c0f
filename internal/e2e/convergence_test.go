package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"maps"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/paystream/paystream/internal/envelope"
	"github.com/paystream/paystream/internal/payment"
	"github.com/paystream/paystream/internal/payment/paymenttest"
	"github.com/paystream/paystream/internal/provider"
	"github.com/paystream/paystream/internal/testenv"
	"github.com/paystream/paystream/processor"
)

var convergenceSeed = flag.Uint64("e2e.seed", 0, "seed for TestConvergenceThroughPipeline (0: random, logged)")

// Shorter names for the statuses the generator uses.
const (
	stPending    = payment.StatusPending
	stAuthorized = payment.StatusAuthorized
	stPaid       = payment.StatusPaid
	stFailed     = payment.StatusFailed
	stCanceled   = payment.StatusCanceled
	stRefunded   = payment.StatusRefunded
	stPartially  = payment.StatusPartiallyRefunded
	stDisputed   = payment.StatusDisputed
	stWon        = payment.StatusDisputeWon
	stLost       = payment.StatusDisputeLost
)

var allStatuses = []payment.Status{
	stPending, stAuthorized, stPaid, stFailed, stCanceled, stRefunded, stPartially, stDisputed, stWon, stLost,
}

// convPayment is one generated payment: its true history, what is
// delivered to the raw topic for it, and what the machine says must come of
// both.
type convPayment struct {
	source, id, key string
	facts           []payment.Fact   // the true history, in order
	delivered       []provider.Event // produced to the raw topic, in this order
	// distinct are the delivered events with a first-seen dedup key, in
	// order: the processor records the others as duplicate_event.
	distinct     []provider.Event
	redeliveries int // deliveries of a dedup key already delivered
	aliases      int // facts also sent under a second event id
	// want is in-order delivery of the true facts; exact is the machine's
	// replay of the distinct deliveries, which the processor must match
	// transition for transition.
	want, exact payment.Replayed
}

// eventType names a fact the way source's gateway would.
func eventType(source string, s payment.Status, alias bool) string {
	if alias {
		return strings.ToUpper(source) + "_" + strings.ToUpper(string(s))
	}
	return source + ".payment." + string(s)
}

// genDeliveries turns p's facts into events and delivers them as gateways
// do: in a random order, some facts also under a second event id (Asaas's
// PAYMENT_CONFIRMED then PAYMENT_RECEIVED), and some events redelivered
// with the same id (retries, resend buttons).
func genDeliveries(r *rand.Rand, p *convPayment) {
	var evs []provider.Event
	for j, f := range p.facts {
		// Event ids do not mention the source: acme's and stripe's
		// payments share ids, so deduplication must be per source.
		id := fmt.Sprintf("evt_%s_%02d", p.id, j)
		evs = append(evs, provider.Event{EventID: id, DedupKey: id, PaymentID: p.id, Type: eventType(p.source, f.Status, false), Fact: f})
		if r.IntN(4) == 0 {
			alias := id + "_alias"
			evs = append(evs, provider.Event{EventID: alias, DedupKey: alias, PaymentID: p.id, Type: eventType(p.source, f.Status, true), Fact: f})
			p.aliases++
		}
	}
	out := make([]provider.Event, 0, 2*len(evs))
	for _, i := range r.Perm(len(evs)) {
		out = append(out, evs[i])
	}
	for _, ev := range evs {
		for r.IntN(4) == 0 {
			out = slices.Insert(out, r.IntN(len(out)+1), ev)
		}
	}
	p.delivered = out
	seen := map[string]bool{}
	for _, ev := range out {
		if seen[ev.DedupKey] {
			p.redeliveries++
			continue
		}
		seen[ev.DedupKey] = true
		p.distinct = append(p.distinct, ev)
	}
}

func factsOf(evs []provider.Event) []payment.Fact {
	fs := make([]payment.Fact, len(evs))
	for i, ev := range evs {
		fs[i] = ev.Fact
	}
	return fs
}

// genPayments generates at least min payments, and more until every status
// is some payment's final (in-order) status at least twice, so that the
// run cannot pass without covering all of them.
func genPayments(t *testing.T, r *rand.Rand, min int) []*convPayment {
	t.Helper()
	var m payment.Machine
	start := time.Date(2026, 11, 2, 9, 0, 0, 0, time.UTC)
	finals := map[payment.Status]int{}
	covered := func() bool {
		for _, s := range allStatuses {
			if finals[s] < 2 {
				return false
			}
		}
		return true
	}
	var ps []*convPayment
	for i := 0; i < min || !covered(); i++ {
		if i == 5000 {
			t.Fatalf("5000 histories and still no coverage of every final status: %v", finals)
		}
		source := []string{"acme", "stripe"}[i%2]
		id := fmt.Sprintf("pay_%04d", i/2)
		p := &convPayment{source: source, id: id, key: source + ":" + id}
		p.facts = paymenttest.History(r, start.Add(time.Duration(i)*time.Minute), paymenttest.Options{})
		genDeliveries(r, p)
		p.want = m.Replay(payment.State{}, p.facts)
		p.exact = m.Replay(payment.State{}, factsOf(p.distinct))
		// The machine alone must converge, or an e2e failure would blame
		// the pipeline for a state machine bug.
		if !p.exact.State.Equivalent(p.want.State) {
			t.Fatalf("seed bug in package payment, not the pipeline: %s diverges in memory:\n got  %+v\n want %+v", p.key, p.exact.State, p.want.State)
		}
		finals[p.want.State.Status]++
		ps = append(ps, p)
	}
	return ps
}

// TestConvergenceThroughPipeline is the order-independence property on the
// real pipeline: hundreds of random payment histories (every status, two
// sources sharing payment and event ids), each payment's events delivered
// in a random order with redeliveries of the same event and the same fact
// under other event ids, produced to a real raw topic with several
// partitions and applied by the real processor in small batches that mix
// payments, then relayed by the sink to a real state topic. Per payment:
//
//   - the stored state is Equivalent to in-order delivery's, and its
//     transitions, postings, version and inbox verdicts are exactly what
//     payment.Machine.Replay makes of the delivered order (the processor
//     is the machine, persisted);
//   - the ledger, summed from ledger_postings alone, equals the in-order
//     state's Balances;
//   - the normalized events, deduplicated by event id (duplicates counted,
//     and byte-identical), are versions 1..n in order, each one's
//     previous_status the status before it, each snapshot matching its
//     transition, and the last one's status the stored status.
//
// Rerun a failing seed with: go test ./internal/e2e -run TestConvergenceThroughPipeline -e2e.seed=N
func TestConvergenceThroughPipeline(t *testing.T) {
	t.Parallel()
	r := rand.New(rand.NewPCG(testenv.Seed(t, *convergenceSeed, "./internal/e2e", "e2e.seed"), 0))

	db := testenv.NewDB(t)
	brokers := testenv.Kafka(t)
	raw := testenv.Topic(t, "raw", 4)
	state := testenv.Topic(t, "state", 3)
	group := testenv.Group(t)

	ps := genPayments(t, r, 500)
	byKey := map[string]*convPayment{}
	var recs []*kgo.Record
	next := make([]int, len(ps))
	left := 0
	for _, p := range ps {
		byKey[p.key] = p
		left += len(p.delivered)
	}
	// Interleave the payments, each one's deliveries in its order.
	for left > 0 {
		i := r.IntN(len(ps))
		p := ps[i]
		if next[i] == len(p.delivered) {
			continue
		}
		recs = append(recs, &kgo.Record{Topic: raw, Key: []byte(p.key), Value: envelopeValue(t, p.source, p.key, p.delivered[next[i]])})
		next[i]++
		left--
	}

	start := time.Now()
	watch := watchOffsets(t, db.Pool, group, raw)
	proc := runProcessor(t, db.Pool, processor.Config{Brokers: brokers, Topic: raw, Group: group, BatchMaxRecords: 7})
	relay := runSink(t, db.Pool, brokers, state)
	// Traffic arrives while the processor runs.
	for i := 0; i < len(recs); i += 400 {
		testenv.Produce(t, brokers, recs[i:min(i+400, len(recs))]...)
	}
	ends := testenv.EndOffsets(t, brokers, raw)
	// Generous ceilings: a loaded CI machine under -race is slow; a healthy
	// run takes seconds.
	testenv.WaitFor(t, 90*time.Second, func() error { return testenv.OffsetsBehind(t, db.Pool, group, raw, ends) })
	appliedIn := time.Since(start)
	proc.Stop()
	// The relay does not drain when stopped (what it has not published, its
	// next leader publishes from the checkpoint): wait until it confirmed
	// every state event the processor committed.
	waitRelayed(t, db, 90*time.Second)
	relay.Stop()
	watch.check(t)
	processed := time.Since(start)

	out := committedState(t, brokers, state)
	t.Logf("%d payments, %d raw records, %d state records: applied in %s, relayed by %s",
		len(ps), len(recs), len(out), appliedIn.Round(time.Millisecond), processed.Round(time.Millisecond))

	e := &errCap{t: t, left: 40}
	checkInbox(t, e, db, byKey, len(recs))
	checkPayments(t, e, db, ps)
	checkStateTopic(t, e, ps, byKey, out)
	logCoverage(t, ps)
}

// checkInbox: every record is in the inbox exactly once, redeliveries are
// recorded as duplicate_event, and every first delivery has the verdict
// the machine gives it in the delivered order.
func checkInbox(t *testing.T, e *errCap, db *testenv.DB, byKey map[string]*convPayment, total int) {
	t.Helper()
	if n := count(t, db.Pool, `SELECT count(DISTINCT (topic, partition, kafka_offset)) FROM deliveries`); n != total {
		e.Errorf("distinct records in the inbox = %d, want %d", n, total)
	}
	if n := count(t, db.Pool, `SELECT count(*) FROM deliveries`); n != total {
		e.Errorf("inbox rows = %d, want %d", n, total)
	}
	type verdict struct{ status, reason string }
	rows, err := db.Pool.Query(context.Background(), `
		SELECT payment_key, source, dedup_key, status, COALESCE(reason, ''), duplicate_of IS NOT NULL FROM deliveries ORDER BY id`)
	if err != nil {
		t.Fatal(err)
	}
	firsts := map[string]map[string]verdict{} // payment → dedup key → verdict
	dups := map[string]int{}
	for rows.Next() {
		var key, source, dedup string
		var v verdict
		var dup bool
		if err := rows.Scan(&key, &source, &dedup, &v.status, &v.reason, &dup); err != nil {
			t.Fatal(err)
		}
		p := byKey[key]
		if p == nil || p.source != source {
			e.Errorf("inbox row for unknown payment %q (source %q)", key, source)
			continue
		}
		if dup {
			if v != (verdict{"ignored", "duplicate_event"}) {
				e.Errorf("%s: redelivery of %s recorded as %v, want ignored/duplicate_event", key, dedup, v)
			}
			dups[key]++
			continue
		}
		if firsts[key] == nil {
			firsts[key] = map[string]verdict{}
		}
		if _, ok := firsts[key][dedup]; ok {
			e.Errorf("%s: two first deliveries of %s", key, dedup)
		}
		firsts[key][dedup] = v
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	for key, p := range byKey {
		if dups[key] != p.redeliveries {
			e.Errorf("%s: %d inbox rows recorded as redeliveries, want %d", key, dups[key], p.redeliveries)
		}
		for i, ev := range p.distinct {
			d := p.exact.Decisions[i]
			want := verdict{string(d.Outcome), d.Reason}
			if got, ok := firsts[key][ev.DedupKey]; !ok {
				e.Errorf("%s: no inbox row for %s", key, ev.DedupKey)
			} else if got != want {
				e.Errorf("%s: %s (%s) recorded as %v, want %v as Machine.Replay decides", key, ev.DedupKey, ev.Type, got, want)
			}
		}
	}
}

// checkPayments: each payment's stored state, transitions and ledger.
func checkPayments(t *testing.T, e *errCap, db *testenv.DB, ps []*convPayment) {
	t.Helper()
	ctx := context.Background()
	type stored struct {
		status      string
		version     int64
		state       payment.State
		held        bool
		transitions int
		postings    int
	}
	got := map[string]*stored{}
	rows, err := db.Pool.Query(ctx, `
		SELECT p.payment_key, p.status, p.version, p.state, p.held,
		       (SELECT count(*) FROM payment_transitions t WHERE t.payment_key = p.payment_key),
		       (SELECT count(*) FROM ledger_postings l WHERE l.payment_key = p.payment_key)
		  FROM payments p`)
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var key string
		s := &stored{}
		if err := rows.Scan(&key, &s.status, &s.version, &s.state, &s.held, &s.transitions, &s.postings); err != nil {
			t.Fatal(err)
		}
		got[key] = s
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	ledgers := ledgerByPayment(t, db.Pool)

	for _, p := range ps {
		wantPostings := 0
		for _, tr := range p.exact.Transitions {
			wantPostings += 2 * len(tr.Movements) // the view has two legs per movement
		}
		s := got[p.key]
		if p.exact.State.Version == 0 {
			if s != nil {
				e.Errorf("%s: stored (%s v%d) but no delivered fact applies", p.key, s.status, s.version)
			}
			continue
		}
		if s == nil {
			e.Errorf("%s: not stored, want %s v%d", p.key, p.want.State.Status, p.exact.State.Version)
			continue
		}
		if !s.state.Equivalent(p.want.State) {
			e.Errorf("%s diverged from in-order delivery:\n got  %+v\n want %+v\nin order:%s\ndelivered:%s",
				p.key, s.state, p.want.State, fmtFacts(p.facts), fmtEvents(p.delivered))
		}
		if s.status != string(p.want.State.Status) || s.state.Status != p.want.State.Status {
			e.Errorf("%s: status column %q, state %q, want %q", p.key, s.status, s.state.Status, p.want.State.Status)
		}
		if s.version != p.exact.State.Version || s.state.Version != s.version {
			e.Errorf("%s: version column %d, state %d, want %d", p.key, s.version, s.state.Version, p.exact.State.Version)
		}
		if s.held {
			e.Errorf("%s: held, nothing was poison", p.key)
		}
		if s.transitions != len(p.exact.Transitions) {
			e.Errorf("%s: %d transitions, want %d", p.key, s.transitions, len(p.exact.Transitions))
		}
		if s.postings != wantPostings {
			e.Errorf("%s: %d ledger postings, want %d (a duplicate effect would show here)", p.key, s.postings, wantPostings)
		}
		if want := p.want.State.Balances(); !maps.Equal(ledgers[p.key], want) {
			e.Errorf("%s: ledger from postings %v, want in-order state's balances %v", p.key, ledgers[p.key], want)
		}
	}
	for key := range got {
		found := false
		for _, p := range ps {
			found = found || p.key == key
		}
		if !found {
			e.Errorf("unexpected payment %s stored", key)
		}
	}
}

// checkStateTopic: per payment, the normalized events (deduplicated by
// event id) are the machine's transitions, gapless and in order.
func checkStateTopic(t *testing.T, e *errCap, ps []*convPayment, byKey map[string]*convPayment, out []stateRecord) {
	t.Helper()
	seen := map[string][]byte{}
	events := map[string][]envelope.State{}
	duplicates := 0
	for _, sr := range out {
		if prev, ok := seen[sr.eventID]; ok {
			duplicates++
			if !bytes.Equal(prev, sr.raw) {
				e.Errorf("event %s published twice with different payloads:\n%s\n%s", sr.eventID, prev, sr.raw)
			}
			continue
		}
		seen[sr.eventID] = sr.raw
		if byKey[sr.ev.PaymentKey] == nil {
			e.Errorf("state event %s for unknown payment %q", sr.eventID, sr.ev.PaymentKey)
			continue
		}
		events[sr.ev.PaymentKey] = append(events[sr.ev.PaymentKey], sr.ev)
	}
	t.Logf("state topic: %d records, %d distinct event ids, %d duplicates", len(out), len(seen), duplicates)

	for _, p := range ps {
		evs := events[p.key]
		if len(evs) != len(p.exact.Transitions) {
			e.Errorf("%s: %d distinct state events, want one per transition (%d)", p.key, len(evs), len(p.exact.Transitions))
			continue
		}
		prev := payment.Status("")
		for k, ev := range evs {
			tr := p.exact.Transitions[k]
			v := int64(k + 1)
			switch {
			case ev.Version != v:
				e.Errorf("%s: state event #%d has version %d, want %d (gapless, never regressing)", p.key, k+1, ev.Version, v)
			case ev.EventID != envelope.StateEventID(p.key, v):
				e.Errorf("%s v%d: event id %q", p.key, v, ev.EventID)
			case ev.PreviousStatus != prev:
				e.Errorf("%s v%d: previous_status %q, but v%d's status is %q", p.key, v, ev.PreviousStatus, v-1, prev)
			case ev.Payment.Version != v || ev.Payment.Status != ev.Status:
				e.Errorf("%s v%d: payment snapshot is v%d %q, event says %q", p.key, v, ev.Payment.Version, ev.Payment.Status, ev.Status)
			case ev.Status != tr.To || ev.Kind != tr.Kind || ev.AmountMinor != tr.AmountMinor || ev.RefundID != tr.RefundID || ev.Source != p.source:
				e.Errorf("%s v%d: event %s %s %d %q, want transition %s %s %d %q", p.key, v,
					ev.Status, ev.Kind, ev.AmountMinor, ev.RefundID, tr.To, tr.Kind, tr.AmountMinor, tr.RefundID)
			}
			prev = ev.Status
		}
		if len(evs) > 0 {
			last := evs[len(evs)-1]
			if last.Status != p.want.State.Status || !last.Payment.Equivalent(p.want.State) {
				e.Errorf("%s: last state event says %s %+v, want in-order state %+v", p.key, last.Status, last.Payment, p.want.State)
			}
		}
	}
}

// logCoverage logs what the run exercised, and fails if the generator
// stopped reaching the corners that make the property worth checking.
func logCoverage(t *testing.T, ps []*convPayment) {
	t.Helper()
	var m payment.Machine
	seen := map[string]int{}
	for _, p := range ps {
		seen["final "+string(p.want.State.Status)]++
		seen["redeliveries"] += p.redeliveries
		seen["aliases"] += p.aliases
		seen["source "+p.source]++
		for _, tr := range p.exact.Transitions {
			seen["kind "+tr.Kind]++
		}
		facts := factsOf(p.distinct)
		for i, d := range p.exact.Decisions {
			seen[string(d.Outcome)+" "+d.Reason]++
			if d.Outcome == payment.OutcomeDeferred {
				seen["left deferred"]++
			}
			// Deferred when it arrived, applied later by the transaction
			// that applied its predecessor.
			if d.Outcome == payment.OutcomeApplied && m.Replay(payment.State{}, facts[:i+1]).Decisions[i].Outcome == payment.OutcomeDeferred {
				seen["deferred, then applied"]++
			}
		}
		if len(p.exact.Transitions) != len(p.want.Transitions) {
			seen["order changed the transitions"]++
		}
	}
	t.Logf("coverage: %v", seen)
	for _, k := range []string{
		"redeliveries", "aliases", "order changed the transitions", "source acme", "source stripe",
		"kind " + payment.KindCapture, "kind " + payment.KindRefund, "kind " + payment.KindDispute,
		"ignored " + payment.ReasonDuplicateFact, "ignored " + payment.ReasonStale,
		"left deferred", "deferred, then applied", "kind " + payment.KindRefundIdentified,
	} {
		if seen[k] == 0 {
			t.Errorf("the run never covered %q", k)
		}
	}
}

// errCap reports errors to t, and stops the test after the first few: a
// broken pipeline would otherwise report every payment.
type errCap struct {
	t    *testing.T
	left int
}

func (e *errCap) Errorf(format string, args ...any) {
	e.t.Helper()
	e.t.Errorf(format, args...)
	if e.left--; e.left == 0 {
		e.t.Fatalf("too many errors; stopping here (rerun with the seed above)")
	}
}

func fmtFacts(fs []payment.Fact) string {
	var b strings.Builder
	for _, f := range fs {
		b.WriteString("\n\t" + fmtFact(f))
	}
	return b.String()
}

func fmtEvents(evs []provider.Event) string {
	var b strings.Builder
	for _, ev := range evs {
		b.WriteString("\n\t" + ev.DedupKey + " " + fmtFact(ev.Fact))
	}
	return b.String()
}

func fmtFact(f payment.Fact) string {
	b, _ := json.Marshal(f)
	return string(b)
}

// TestDeferredThenAppliedInOneBatch: an event deferred for its predecessor
// and applied when the predecessor arrives later in the same batch is
// recorded as processed — its inbox row must say what happened to it, as
// the transition it caused does.
func TestDeferredThenAppliedInOneBatch(t *testing.T) {
	t.Parallel()
	db := testenv.NewDB(t)
	brokers := testenv.Kafka(t)
	raw := testenv.Topic(t, "raw", 1)
	group := testenv.Group(t)
	at := time.Date(2026, 11, 5, 9, 0, 0, 0, time.UTC)
	var recs []*kgo.Record
	for i := range 20 {
		id := fmt.Sprintf("pay_%02d", i)
		key := "acme:" + id
		refund := provider.Event{EventID: "re_" + id, DedupKey: "re_" + id, PaymentID: id, Type: "refund.created",
			Fact: payment.Fact{Status: stPartially, RefundID: "re_1", AmountMinor: 10, Currency: "BRL", OccurredAt: at.Add(time.Hour)}}
		dispute := provider.Event{EventID: "dp_" + id, DedupKey: "dp_" + id, PaymentID: id, Type: "dispute.created",
			Fact: payment.Fact{Status: stDisputed, AmountMinor: 20, Currency: "BRL", OccurredAt: at.Add(2 * time.Hour)}}
		paid := provider.Event{EventID: "pd_" + id, DedupKey: "pd_" + id, PaymentID: id, Type: "payment.paid",
			Fact: payment.Fact{Status: stPaid, AmountMinor: 100, Currency: "BRL", OccurredAt: at}}
		for _, ev := range []provider.Event{refund, dispute, paid} {
			recs = append(recs, &kgo.Record{Topic: raw, Key: []byte(key), Value: envelopeValue(t, "acme", key, ev)})
		}
	}
	// All on the topic first, so each payment's three events share a batch.
	testenv.Produce(t, brokers, recs...)
	runProcessor(t, db.Pool, processor.Config{Brokers: brokers, Topic: raw, Group: group, BatchMaxRecords: 60})
	testenv.WaitFor(t, 30*time.Second, func() error {
		return testenv.OffsetsBehind(t, db.Pool, group, raw, map[int32]int64{0: int64(len(recs))})
	})
	if n := count(t, db.Pool, `SELECT count(*) FROM payment_transitions`); n != 60 {
		t.Fatalf("transitions = %d, want 60 (paid, refund, dispute per payment)", n)
	}
	rows, err := db.Pool.Query(context.Background(), `
		SELECT i.dedup_key, i.status, COALESCE(i.reason, '') FROM deliveries i
		  JOIN payment_transitions tr ON tr.delivery_id = i.id
		 WHERE i.status <> 'processed' ORDER BY i.id`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	for rows.Next() {
		var dedup, status, reason string
		if err := rows.Scan(&dedup, &status, &reason); err != nil {
			t.Fatal(err)
		}
		t.Errorf("%s caused a transition but its inbox row says %s/%s, want processed", dedup, status, reason)
	}
}
