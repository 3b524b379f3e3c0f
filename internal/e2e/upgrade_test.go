package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/url"
	"slices"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/paystream/paystream/internal/envelope"
	"github.com/paystream/paystream/internal/payment"
	"github.com/paystream/paystream/internal/provider"
	"github.com/paystream/paystream/internal/statelog"
	"github.com/paystream/paystream/internal/store"
	"github.com/paystream/paystream/internal/testenv"
	"github.com/paystream/paystream/migrations"
	"github.com/paystream/paystream/processor"
	"github.com/paystream/paystream/sink"
)

// TestUpgradeInPlace: a schema filled by migrations 001-003 the way the
// processor of that schema did (inbox rows with byte-exact envelopes, a
// redelivery, signed postings, a published and an unpublished outbox
// event, a deferred refund, a quarantined event and its held payment)
// upgrades with migrations.Apply and keeps working:
//
//   - the postings become movements, the inbox becomes deliveries and
//     dedup keys, the outbox is gone and its unpublished event is in the
//     WAL as a state message (read back through a test_decoding slot);
//   - the pipeline on top applies new events to old payments (paid
//     resumes the old deferred refund), a redelivery of an old event is
//     duplicate_event;
//   - the held payment is replayed, and inspect shows everything.
func TestUpgradeInPlace(t *testing.T) {
	t.Parallel()
	base := testenv.NewDB(t) // only for its database; the old schema lives next to it
	pool, schema := oldSchema(t, base)
	brokers := testenv.Kafka(t)
	raw := testenv.Topic(t, "raw", 1)
	ctx := context.Background()
	var m payment.Machine
	at := time.Date(2026, 11, 20, 9, 0, 0, 0, time.UTC)

	type event struct {
		key string
		ev  provider.Event
		env []byte
	}
	mk := func(paymentID, id string, f payment.Fact) event {
		f.OccurredAt, at = at, at.Add(time.Minute)
		key := "acme:" + paymentID
		ev := provider.Event{EventID: id, DedupKey: id, PaymentID: paymentID, Type: "payment." + string(f.Status), Fact: f}
		return event{key, ev, envelopeValue(t, "acme", key, ev)}
	}
	brl := func(s payment.Status, amount int64) payment.Fact {
		return payment.Fact{Status: s, AmountMinor: amount, Currency: "BRL"}
	}
	aPending, aPaid := mk("pay_a", "evt_a_pending", brl(payment.StatusPending, 1000)), mk("pay_a", "evt_a_paid", brl(payment.StatusPaid, 1000))
	dPending := mk("pay_d", "evt_d_pending", brl(payment.StatusPending, 500))
	dRefund := mk("pay_d", "evt_d_refund", payment.Fact{Status: payment.StatusPartiallyRefunded, RefundID: "re_1", AmountMinor: 200, Currency: "BRL"})
	hPaid := mk("pay_h", "evt_h_paid", brl(payment.StatusPaid, 700))

	// The old processor's rows, as its SQL wrote them.
	a1 := m.Apply(payment.State{}, aPending.ev.Fact)
	a2 := m.Apply(a1.State, aPaid.ev.Fact)
	d1 := m.Apply(payment.State{}, dPending.ev.Fact)
	if dr := m.Apply(d1.State, dRefund.ev.Fact); dr.Outcome != payment.OutcomeDeferred {
		t.Fatalf("refund before paid: %+v, want deferred", dr)
	}
	err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		offset := int64(0)
		inbox := func(e event, status, reason string, dupOf *int64) int64 {
			var id int64
			fact, _ := json.Marshal(e.ev.Fact)
			err := tx.QueryRow(ctx, `
				INSERT INTO inbox (source, dedup_key, event_id, event_type, payment_key, status, reason, attempts, duplicate_of, fact, payload,
				                   topic, partition, kafka_offset, occurred_at, received_at)
				VALUES ('acme', $1, $1, $2, $3, $4, NULLIF($5, ''), 1, $6, $7, $8, 'old.raw', 0, $9, $10, now()) RETURNING id`,
				e.ev.DedupKey, e.ev.Type, e.key, status, reason, dupOf, fact, e.env, offset, e.ev.Fact.OccurredAt).Scan(&id)
			if err != nil {
				t.Fatal(err)
			}
			offset++
			return id
		}
		aPendingID := inbox(aPending, "processed", "", nil)
		aPaidID := inbox(aPaid, "processed", "", nil)
		inbox(aPaid, "ignored", "duplicate_event", &aPaidID)
		dPendingID := inbox(dPending, "processed", "", nil)
		inbox(dRefund, "deferred", payment.ReasonNeedsPredecessor, nil)
		inbox(hPaid, "quarantined", "refused by an old bug", nil)
		for _, p := range []struct {
			e event
			s payment.State
		}{{aPaid, a2.State}, {dPending, d1.State}} {
			st, _ := json.Marshal(p.s)
			if _, err := tx.Exec(ctx, `INSERT INTO payments (payment_key, source, payment_id, status, version, amount_minor, currency, state)
				VALUES ($1, 'acme', $2, $3, $4, $5, $6, $7)`, p.e.key, p.e.ev.PaymentID, p.s.Status, p.s.Version, p.s.AmountMinor, p.s.Currency, st); err != nil {
				t.Fatal(err)
			}
		}
		if _, err := tx.Exec(ctx, `INSERT INTO payments (payment_key, source, payment_id, status, version, state, held, held_reason)
			VALUES ('acme:pay_h', 'acme', '', '', 0, '{}', true, 'refused by an old bug')`); err != nil {
			t.Fatal(err)
		}
		tr := func(key string, inboxID int64, ts ...payment.Transition) {
			for _, tr := range ts {
				if _, err := tx.Exec(ctx, `INSERT INTO payment_transitions (payment_key, version, from_status, to_status, kind, amount_minor, currency, inbox_id)
					VALUES ($1, $2, $3, $4, $5, $6, $7, $8)`, key, tr.Version, tr.From, tr.To, tr.Kind, tr.AmountMinor, tr.Currency, inboxID); err != nil {
					t.Fatal(err)
				}
				for _, p := range tr.Postings() {
					if _, err := tx.Exec(ctx, `INSERT INTO ledger_postings (payment_key, version, account, amount_minor, currency) VALUES ($1, $2, $3, $4, $5)`,
						key, tr.Version, p.Account, p.AmountMinor, p.Currency); err != nil {
						t.Fatal(err)
					}
				}
				payload, _ := json.Marshal(envelope.State{EventID: envelope.StateEventID(key, tr.Version), PaymentKey: key, Version: tr.Version, Status: tr.To})
				if _, err := tx.Exec(ctx, `INSERT INTO outbox (payment_key, version, event_id, payload, published_at)
					VALUES ($1, $2::bigint, $3, $4, CASE WHEN $2::bigint = 2 THEN NULL ELSE now() END)`, key, tr.Version, envelope.StateEventID(key, tr.Version), payload); err != nil {
					t.Fatal(err)
				}
			}
		}
		tr(aPending.key, aPendingID, a1.Transitions...)
		tr(aPaid.key, aPaidID, a2.Transitions...)
		tr(dPending.key, dPendingID, d1.Transitions...)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}

	// The relay's slot exists before the upgrade (paystream migrate creates
	// it); a test_decoding slot next to it lets the test read the WAL.
	slot, err := sink.SetupSlot(ctx, pool)
	if err != nil {
		t.Fatal(err)
	}
	peek := slot + "_peek"
	if _, err := pool.Exec(ctx, `SELECT pg_create_logical_replication_slot($1, 'test_decoding')`, peek); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		for _, s := range []string{peek, slot} {
			_, _ = pool.Exec(context.Background(), `SELECT pg_drop_replication_slot($1)`, s)
		}
		_, _ = pool.Exec(context.Background(), `DROP PUBLICATION IF EXISTS `+pgx.Identifier{slot}.Sanitize())
	})

	if _, err := migrations.Apply(ctx, pool); err != nil {
		t.Fatalf("upgrade: %v", err)
	}

	// The unpublished outbox event is a state message of the upgrade.
	var frames [][]byte
	rows, err := pool.Query(ctx, `SELECT data FROM pg_logical_slot_peek_binary_changes($1, NULL, NULL)`, peek)
	if err != nil {
		t.Fatal(err)
	}
	frames, err = pgx.CollectRows(rows, pgx.RowTo[[]byte])
	if err != nil {
		t.Fatal(err)
	}
	var emitted []string
	prefix := []byte("prefix: " + statelog.Prefix(schema) + ",")
	for _, f := range frames {
		if i := bytes.Index(f, prefix); i >= 0 {
			emitted = append(emitted, string(f))
		}
	}
	if len(emitted) != 1 || !bytes.Contains([]byte(emitted[0]), []byte("acme:pay_a:2")) {
		t.Errorf("state messages of the upgrade = %q, want the one unpublished outbox event (acme:pay_a:2)", emitted)
	}

	for q, want := range map[string]int{
		`SELECT count(*) FROM deliveries`:         6,
		`SELECT count(*) FROM dedup_keys`:         5,
		`SELECT count(*) FROM ledger_movements`:   1,
		`SELECT count(*) FROM ledger_postings`:    2,
		`SELECT count(*) FROM deliveries_default`: 0,
		`SELECT count(*) FROM pg_tables WHERE schemaname = current_schema() AND tablename IN ('inbox', 'outbox')`: 0,
	} {
		if n := count(t, pool, q); n != want {
			t.Errorf("after the upgrade, %s = %d, want %d", q, n, want)
		}
	}

	// The pipeline on top: a new topic and group.
	group := testenv.Group(t)
	runProcessor(t, pool, processor.Config{Brokers: brokers, Topic: raw, Group: group})
	dPaid := mk("pay_d", "evt_d_paid", brl(payment.StatusPaid, 500))
	aRefund := mk("pay_a", "evt_a_refund", payment.Fact{Status: payment.StatusRefunded, AmountMinor: 1000, Currency: "BRL"})
	recs := []*kgo.Record{
		{Topic: raw, Key: []byte(aPaid.key), Value: aPaid.env}, // an old event, redelivered
		{Topic: raw, Key: []byte(dPaid.key), Value: dPaid.env},
		{Topic: raw, Key: []byte(aRefund.key), Value: aRefund.env},
	}
	produceRaw(t, brokers, recs...)
	testenv.WaitFor(t, 60*time.Second, func() error { return caughtUp(t, pool, group, raw, map[int32]int64{0: int64(len(recs))}) })

	outcome := func(dedup string) string {
		var s, r string
		if err := pool.QueryRow(ctx, `SELECT status, COALESCE(reason, '') FROM deliveries WHERE dedup_key = $1 ORDER BY id DESC LIMIT 1`, dedup).Scan(&s, &r); err != nil {
			t.Fatal(err)
		}
		return s + "/" + r
	}
	for dedup, want := range map[string]string{
		"evt_a_paid":   "ignored/duplicate_event",
		"evt_d_paid":   "processed/",
		"evt_d_refund": "processed/", // the old deferred refund, resumed by paid
		"evt_a_refund": "processed/",
	} {
		if got := outcome(dedup); got != want {
			t.Errorf("%s: %s, want %s", dedup, got, want)
		}
	}

	report, err := processor.Replay(ctx, pool, "acme:pay_h", processor.ReplayOptions{})
	if err != nil {
		t.Fatalf("replay the held payment: %v", err)
	}
	if report.Replayed["processed"] != 1 {
		t.Errorf("replay report %+v, want one event processed", report)
	}

	for key, want := range map[string]struct {
		status  string
		version int64
		bal     map[string]int64
	}{
		"acme:pay_a": {"refunded", 3, map[string]int64{}},
		"acme:pay_d": {"partially_refunded", 3, map[string]int64{"gateway_receivable:BRL": 300, "merchant_payable:BRL": -300}},
		"acme:pay_h": {"paid", 1, map[string]int64{"gateway_receivable:BRL": 700, "merchant_payable:BRL": -700}},
	} {
		p, err := store.InspectPayment(ctx, pool, key)
		if err != nil {
			t.Fatal(err)
		}
		bal := map[string]int64{}
		for k, v := range p.Balances {
			if v != 0 {
				bal[k] = v
			}
		}
		if p.Status != want.status || p.Version != want.version || p.Held || !equalBalances(bal, want.bal) {
			t.Errorf("inspect %s: %s v%d held=%v balances %v; want %s v%d, balances %v", key, p.Status, p.Version, p.Held, bal, want.status, want.version, want.bal)
		}
		if len(p.Transitions) != int(want.version) {
			t.Errorf("inspect %s: %d transitions, want %d", key, len(p.Transitions), want.version)
		}
	}

	// The sink, upgraded too, relays what the slot kept from before the
	// upgrade on: the upgrade's message of frame format 1 (the outbox
	// event) and the new processor's and replay's of format 2, each event
	// once.
	state := testenv.Topic(t, "state", 1)
	runSink(t, pool, brokers, state)
	want := []string{"acme:pay_a:2", "acme:pay_a:3", "acme:pay_d:2", "acme:pay_d:3", "acme:pay_h:1"}
	var got []string
	testenv.WaitFor(t, time.Minute, func() error {
		got = got[:0]
		for _, r := range committedState(t, brokers, state) {
			got = append(got, r.eventID)
		}
		if len(got) < len(want) {
			return fmt.Errorf("%d state events on the topic, want %d", len(got), len(want))
		}
		return nil
	})
	slices.Sort(got)
	if !slices.Equal(got, want) {
		t.Errorf("state events after the upgrade: %q, want %q", got, want)
	}
}

func equalBalances(a, b map[string]int64) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if b[k] != v {
			return false
		}
	}
	return true
}

// oldSchema creates a schema next to base's, migrated to version 3 (the
// schema before deliveries, movements and the WAL-only state events), and
// returns a pool confined to it and its name. It is dropped when the test
// ends.
func oldSchema(t *testing.T, base *testenv.DB) (*pgxpool.Pool, string) {
	t.Helper()
	name := base.Schema + "_old"
	if _, err := base.Pool.Exec(t.Context(), "CREATE SCHEMA "+pgx.Identifier{name}.Sanitize()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if _, err := base.Pool.Exec(ctx, "DROP SCHEMA "+pgx.Identifier{name}.Sanitize()+" CASCADE"); err != nil {
			t.Errorf("drop schema %s: %v", name, err)
		}
	})
	u, err := url.Parse(base.URL)
	if err != nil || u.Scheme == "" {
		t.Fatalf("testenv URL %q is not a URL (%v)", base.URL, err)
	}
	q := u.Query()
	q.Set("search_path", name)
	u.RawQuery = q.Encode()
	cfg, err := pgxpool.ParseConfig(u.String())
	if err != nil {
		t.Fatal(err)
	}
	cfg.ConnConfig.RuntimeParams["search_path"] = name
	pool, err := pgxpool.NewWithConfig(t.Context(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	if _, err := migrations.ApplyTo(t.Context(), pool, 3); err != nil {
		t.Fatal(err)
	}
	return pool, name
}
