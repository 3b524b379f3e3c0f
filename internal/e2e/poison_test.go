package e2e

import (
	"bytes"
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/paystream/paystream/internal/payment"
	"github.com/paystream/paystream/internal/provider"
	"github.com/paystream/paystream/internal/testenv"
	"github.com/paystream/paystream/processor"
)

// TestPoisonNeverBlocksPartition: on one partition, an authentic record
// Postgres refuses (an envelope whose event type and dedup key carry NUL,
// as an older or buggy ingest would produce), an undecodable record (not
// JSON) and a JSON record that is not an envelope are each quarantined,
// with a reason and the record byte-exact, in the transaction that
// advances the partition's offset. They never block the partition: later
// events of other payments are applied. The payments they belong to are
// held: their later events are deferred (payment_held), not applied, until
// an operator replays them. A redelivery of the poison is quarantined too,
// against its first delivery.
func TestPoisonNeverBlocksPartition(t *testing.T) {
	t.Parallel()
	db := testenv.NewDB(t)
	brokers := testenv.Kafka(t)
	raw := testenv.Topic(t, "raw", 1) // one partition: everything below shares it
	group := testenv.Group(t)
	at := time.Date(2026, 11, 3, 10, 0, 0, 0, time.UTC)

	event := func(id, paymentID string, f payment.Fact) provider.Event {
		f.OccurredAt, at = at, at.Add(time.Minute)
		return provider.Event{EventID: id, DedupKey: id, PaymentID: paymentID, Type: "payment." + string(f.Status), Fact: f}
	}
	good := func(paymentID, id string, f payment.Fact) *kgo.Record {
		key := "acme:" + paymentID
		return &kgo.Record{Topic: raw, Key: []byte(key), Value: envelopeValue(t, "acme", key, event(id, paymentID, f))}
	}
	pending := func(amount int64) payment.Fact {
		return payment.Fact{Status: payment.StatusPending, AmountMinor: amount, Currency: "BRL"}
	}
	paid := func(amount int64) payment.Fact {
		return payment.Fact{Status: payment.StatusPaid, AmountMinor: amount, Currency: "BRL"}
	}

	// The poison: authentic, decodable, but its type and dedup key hold
	// NUL, which Postgres text refuses.
	nul := event("evt_p_paid\x00x", "pay_p", paid(700))
	nul.Type = "payment.paid\x00"
	poison := &kgo.Record{Topic: raw, Key: []byte("acme:pay_p"), Value: envelopeValue(t, "acme", "acme:pay_p", nul)}
	if !bytes.Contains(poison.Value, []byte(`\u0000`)) {
		t.Fatalf("poison envelope does not carry NUL: %s", poison.Value)
	}
	notJSON := &kgo.Record{Topic: raw, Key: []byte("acme:pay_j"), Value: []byte("\x00\x01 not json {")}
	notEnvelope := &kgo.Record{Topic: raw, Value: []byte(`{"v":1,"hello":"world"}`)} // no key, no source

	recs := []*kgo.Record{
		/* 0 */ good("pay_a", "evt_a_pending", pending(100)),
		/* 1 */ good("pay_p", "evt_p_pending", pending(700)),
		/* 2 */ poison,
		/* 3 */ good("pay_b", "evt_b_paid", paid(200)),
		/* 4 */ good("pay_p", "evt_p_paid", paid(700)), // the same payment, valid: held
		/* 5 */ good("pay_p", "evt_p_refund", payment.Fact{Status: payment.StatusPartiallyRefunded, RefundID: "re_1", AmountMinor: 50, Currency: "BRL"}),
		/* 6 */ notJSON,
		/* 7 */ good("pay_a", "evt_a_paid", paid(100)),
		/* 8 */ good("pay_j", "evt_j_paid", paid(300)), // held by the undecodable record's key
		/* 9 */ notEnvelope,
		/* 10 */ good("pay_c", "evt_c_paid", paid(400)),
		/* 11 */ poison, // redelivered
		/* 12 */ good("pay_d", "evt_d_paid", paid(500)),
	}
	const (
		offPoison, offNotJSON, offNotEnvelope, offPoisonAgain = 2, 6, 9, 11
	)
	// Everything is on the topic before the processor starts, so batches of
	// five put the poison in the middle of a transaction with good records.
	testenv.Produce(t, brokers, recs...)
	watch := watchOffsets(t, db.Pool, group, raw)
	runProcessor(t, db.Pool, processor.Config{Brokers: brokers, Topic: raw, Group: group, BatchMaxRecords: 5})
	testenv.WaitFor(t, 30*time.Second, func() error {
		return testenv.OffsetsBehind(t, db.Pool, group, raw, map[int32]int64{0: int64(len(recs))})
	})
	watch.check(t)

	ctx := context.Background()
	type row struct {
		id                          int64
		source, dedup, typ, payment string
		status, reason              string
		dupOf                       *int64
		payload                     []byte
	}
	rows, err := db.Pool.Query(ctx, `
		SELECT kafka_offset, id, source, dedup_key, event_type, payment_key, status, COALESCE(reason, ''), duplicate_of, record
		  FROM deliveries WHERE topic = $1 AND partition = 0`, raw)
	if err != nil {
		t.Fatal(err)
	}
	inbox := map[int64]row{}
	for rows.Next() {
		var off int64
		var r row
		if err := rows.Scan(&off, &r.id, &r.source, &r.dedup, &r.typ, &r.payment, &r.status, &r.reason, &r.dupOf, &r.payload); err != nil {
			t.Fatal(err)
		}
		inbox[off] = r
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	if len(inbox) != len(recs) {
		t.Fatalf("inbox has %d rows, want one per record (%d)", len(inbox), len(recs))
	}

	// The three bad records: quarantined, with a reason, byte-exact.
	for _, off := range []int64{offPoison, offNotJSON, offNotEnvelope, offPoisonAgain} {
		r := inbox[off]
		if r.status != "quarantined" {
			t.Errorf("offset %d: status %q, want quarantined", off, r.status)
		}
		if strings.TrimSpace(r.reason) == "" {
			t.Errorf("offset %d: quarantined without a reason", off)
		}
		if !bytes.Equal(r.payload, recs[off].Value) {
			t.Errorf("offset %d: payload not kept byte-exact:\n got  %q\n want %q", off, r.payload, recs[off].Value)
		}
	}
	if r := inbox[offPoison]; r.source != "acme" || r.payment != "acme:pay_p" || r.dupOf != nil || strings.Contains(r.dedup+r.typ, "\x00") {
		t.Errorf("poison row: source %q, payment %q, dedup %q, type %q, duplicate_of %v; want acme, acme:pay_p, its own dedup slot, NUL cleaned",
			r.source, r.payment, r.dedup, r.typ, r.dupOf)
	}
	if r := inbox[offPoisonAgain]; r.dupOf == nil || *r.dupOf != inbox[offPoison].id {
		t.Errorf("redelivered poison: duplicate_of %v, want the first delivery's id %d", r.dupOf, inbox[offPoison].id)
	}
	if r := inbox[offNotJSON]; r.payment != "acme:pay_j" || !strings.Contains(r.reason, "undecodable") {
		t.Errorf("undecodable row: payment %q, reason %q; want the record key and an undecodable reason", r.payment, r.reason)
	}
	t.Logf("poison reason: %s", inbox[offPoison].reason)

	// Other payments on the same partition, before and after the poison.
	for off, want := range map[int64]string{0: "processed", 1: "processed", 3: "processed", 7: "processed", 10: "processed", 12: "processed"} {
		if r := inbox[off]; r.status != want {
			t.Errorf("offset %d (%s): status %q reason %q, want %s", off, r.payment, r.status, r.reason, want)
		}
	}
	for key, want := range map[string]string{"acme:pay_a": "paid", "acme:pay_b": "paid", "acme:pay_c": "paid", "acme:pay_d": "paid"} {
		var status string
		var held bool
		if err := db.Pool.QueryRow(ctx, `SELECT status, held FROM payments WHERE payment_key = $1`, key).Scan(&status, &held); err != nil {
			t.Errorf("%s: %v", key, err)
			continue
		}
		if status != want || held {
			t.Errorf("%s: status %q held %v, want %s, not held", key, status, held, want)
		}
	}

	// The poisoned payments are held; their later events wait.
	for _, off := range []int64{4, 5, 8} {
		if r := inbox[off]; r.status != "deferred" || r.reason != "payment_held" {
			t.Errorf("offset %d (%s): status %q reason %q, want deferred/payment_held", off, r.payment, r.status, r.reason)
		}
	}
	for key, wantVersion := range map[string]int64{"acme:pay_p": 1, "acme:pay_j": 0} {
		var status string
		var version int64
		var held bool
		var reason *string
		if err := db.Pool.QueryRow(ctx, `SELECT status, version, held, held_reason FROM payments WHERE payment_key = $1`, key).Scan(&status, &version, &held, &reason); err != nil {
			t.Errorf("%s: %v", key, err)
			continue
		}
		if !held || reason == nil || *reason == "" || version != wantVersion {
			t.Errorf("%s: held %v, reason %v, version %d; want held with a reason, version %d (nothing applied after the poison)", key, held, reason, version, wantVersion)
		}
		if n := count(t, db.Pool, `SELECT count(*) FROM payment_transitions WHERE payment_key = $1`, key); int64(n) != wantVersion {
			t.Errorf("%s: %d transitions, want %d", key, n, wantVersion)
		}
		if n := count(t, db.Pool, `SELECT count(*) FROM ledger_postings WHERE payment_key = $1`, key); n != 0 {
			t.Errorf("%s: %d ledger postings, want none: money moved on a held payment", key, n)
		}
	}
	if n := count(t, db.Pool, `SELECT count(*) FROM payments WHERE held`); n != 2 {
		t.Errorf("%d payments held, want 2 (a keyless record holds nothing)", n)
	}
	if n := count(t, db.Pool, `SELECT count(*) FROM deliveries WHERE status = 'received'`); n != 0 {
		t.Errorf("%d inbox rows left undecided", n)
	}
}

// TestPoisonAloneInBatches is the poison case with one record per batch:
// each bad record's transaction stores the quarantine row and the next
// offset together, and the worker moves on.
func TestPoisonAloneInBatches(t *testing.T) {
	t.Parallel()
	db := testenv.NewDB(t)
	brokers := testenv.Kafka(t)
	raw := testenv.Topic(t, "raw", 1)
	group := testenv.Group(t)

	var recs []*kgo.Record
	for i := range 20 {
		key := fmt.Sprintf("acme:pay_%02d", i)
		switch i % 4 {
		case 1:
			ev := provider.Event{EventID: fmt.Sprintf("evt_%d\x00", i), DedupKey: fmt.Sprintf("evt_%d\x00", i), PaymentID: key[5:], Type: "payment.paid\x00",
				Fact: payment.Fact{Status: payment.StatusPaid, AmountMinor: 10, Currency: "BRL", OccurredAt: time.Now().UTC()}}
			recs = append(recs, &kgo.Record{Topic: raw, Key: []byte(key), Value: envelopeValue(t, "acme", key, ev)})
		case 3:
			recs = append(recs, &kgo.Record{Topic: raw, Key: []byte(key), Value: []byte("]")})
		default:
			ev := provider.Event{EventID: fmt.Sprintf("evt_%d", i), DedupKey: fmt.Sprintf("evt_%d", i), PaymentID: key[5:], Type: "payment.paid",
				Fact: payment.Fact{Status: payment.StatusPaid, AmountMinor: 10, Currency: "BRL", OccurredAt: time.Now().UTC()}}
			recs = append(recs, &kgo.Record{Topic: raw, Key: []byte(key), Value: envelopeValue(t, "acme", key, ev)})
		}
	}
	watch := watchOffsets(t, db.Pool, group, raw)
	runProcessor(t, db.Pool, processor.Config{Brokers: brokers, Topic: raw, Group: group, BatchMaxRecords: 1})
	for _, r := range recs {
		testenv.Produce(t, brokers, r) // one at a time, so they trickle in
	}
	testenv.WaitFor(t, 30*time.Second, func() error {
		return testenv.OffsetsBehind(t, db.Pool, group, raw, map[int32]int64{0: int64(len(recs))})
	})
	watch.check(t)
	if n := count(t, db.Pool, `SELECT count(*) FROM deliveries WHERE status = 'quarantined' AND reason <> ''`); n != 10 {
		t.Errorf("quarantined with a reason = %d, want 10", n)
	}
	if n := count(t, db.Pool, `SELECT count(*) FROM deliveries WHERE status = 'processed'`); n != 10 {
		t.Errorf("processed = %d, want 10", n)
	}
	if n := count(t, db.Pool, `SELECT count(*) FROM ledger_postings`); n != 20 {
		t.Errorf("ledger postings = %d, want 20 (two per capture)", n)
	}
}
