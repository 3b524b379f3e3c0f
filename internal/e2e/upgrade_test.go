package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"net/url"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
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
	slot := setupSlot(t, pool)
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
	testenv.Produce(t, brokers, recs...)
	testenv.WaitFor(t, 60*time.Second, func() error { return testenv.OffsetsBehind(t, pool, group, raw, map[int32]int64{0: int64(len(recs))}) })

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
		if p.Status != want.status || p.Version != want.version || p.Held || !maps.Equal(bal, want.bal) {
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

// TestUpgradeUnderTraffic: processors of the old schema keep committing
// batches (offset row locked, inbox row, payment, transition, postings,
// an unpublished outbox event, the offset moved) in a loop on four
// partitions while migrations.Apply upgrades the schema under them. The
// inbox is large, so the upgrade takes seconds. Every batch that committed
// must have its state event on the state topic once, relayed from the
// slot; the batches after the upgrade fail (their tables are gone) with
// their offsets not moved, for the new processor to apply again.
//
// Before, the upgrade read the outbox without a lock: batches that
// committed between that read and its first conflicting lock (the ALTER of
// payment_transitions, after the inbox copy) were dropped with the outbox.
func TestUpgradeUnderTraffic(t *testing.T) {
	t.Parallel()
	base := testenv.NewDB(t)
	pool, _ := oldSchema(t, base)
	brokers := testenv.Kafka(t)
	ctx := t.Context()
	setupSlot(t, pool) // paystream migrate creates it before migrating

	// History that makes the upgrade slow: 200,000 inbox rows to copy.
	const history = 200_000
	if _, err := pool.Exec(ctx, `
		INSERT INTO inbox (source, dedup_key, event_id, event_type, payment_key, status, attempts, payload, topic, partition, kafka_offset, received_at)
		SELECT 'acme', 'old_' || i, 'old_' || i, 'payment.paid', 'acme:old_' || (i % 5000), 'processed', 1,
		       convert_to(repeat('x', 200), 'UTF8'), 'old.raw', 0, i, now()
		  FROM generate_series(1, $1::int) AS i`, history); err != nil {
		t.Fatal(err)
	}
	const group, topic, writers = "old-group", "old.raw.traffic", 4
	for p := range writers {
		if _, err := pool.Exec(ctx, `INSERT INTO consumer_offsets (group_id, topic, partition, next_offset, owner_epoch) VALUES ($1, $2, $3, 0, 1)`, group, topic, p); err != nil {
			t.Fatal(err)
		}
	}

	type writerResult struct {
		committed           []string // event ids of the committed batches
		afterMigrateStarted int
		err                 error // what stopped it
	}
	var migrateStarted atomic.Bool
	results := make(chan writerResult, writers)
	stop := make(chan struct{})
	for p := range writers {
		go func() {
			var r writerResult
			for i := 0; ; i++ {
				select {
				case <-stop:
					results <- r
					return
				default:
				}
				started := migrateStarted.Load()
				id, err := oldBatch(ctx, pool, group, topic, int32(p), fmt.Sprintf("acme:traffic_%d_%d", p, i))
				if err != nil {
					r.err = err
					results <- r
					return
				}
				r.committed = append(r.committed, id)
				if started {
					r.afterMigrateStarted++
				}
				time.Sleep(2 * time.Millisecond)
			}
		}()
	}
	time.Sleep(500 * time.Millisecond) // traffic before the upgrade, not synchronization
	migrateStarted.Store(true)
	began := time.Now()
	if _, err := migrations.Apply(ctx, pool); err != nil {
		close(stop)
		t.Fatalf("upgrade under traffic: %v", err)
	}
	took := time.Since(began)
	close(stop)
	var want []string
	var during int
	for range writers {
		r := <-results
		want = append(want, r.committed...)
		during += r.afterMigrateStarted
		var pgErr *pgconn.PgError
		if r.err != nil && (!errors.As(r.err, &pgErr) || pgErr.Code != "42P01") {
			t.Errorf("an old batch failed with %v, want undefined_table (42P01) once the upgrade dropped its tables", r.err)
		}
	}
	t.Logf("upgrade took %v; %d old batches committed, %d of them after the upgrade started", took.Round(time.Millisecond), len(want), during)
	if len(want) == 0 {
		t.Fatal("no old batch committed")
	}
	// The offsets moved only with the committed batches.
	if n := count(t, pool, `SELECT COALESCE(sum(next_offset), 0)::int FROM consumer_offsets WHERE group_id = $1`, group); n != len(want) {
		t.Errorf("stored offsets add up to %d, want %d: one per committed batch", n, len(want))
	}

	state := testenv.Topic(t, "state", 1)
	runSink(t, pool, brokers, state)
	var got map[string]int
	testenv.WaitFor(t, 2*time.Minute, func() error {
		got = map[string]int{}
		for _, r := range committedState(t, brokers, state) {
			got[r.eventID]++
		}
		var missing int
		for _, id := range want {
			if got[id] == 0 {
				missing++
			}
		}
		if missing > 0 {
			return fmt.Errorf("%d of %d committed old batches' state events are not on the state topic", missing, len(want))
		}
		return nil
	})
	for id, n := range got {
		if n != 1 {
			t.Errorf("state event %s published %d times, want once", id, n)
		}
	}
}

// oldBatch commits, as a processor of schema version 3 did, one batch of
// one paid event on partition: the partition's offset row locked first,
// an inbox row, a new payment, its transition and postings, its state
// event as an unpublished outbox row, and the offset moved on. It returns
// the state event's id.
func oldBatch(ctx context.Context, pool *pgxpool.Pool, group, topic string, partition int32, key string) (string, error) {
	var m payment.Machine
	fact := payment.Fact{Status: payment.StatusPaid, AmountMinor: 1000, Currency: "BRL", OccurredAt: time.Date(2026, 11, 20, 9, 0, 0, 0, time.UTC)}
	d := m.Apply(payment.State{}, fact)
	tr := d.Transitions[0]
	eventID := envelope.StateEventID(key, tr.Version)
	err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		var next int64
		if err := tx.QueryRow(ctx, `SELECT next_offset FROM consumer_offsets WHERE group_id = $1 AND topic = $2 AND partition = $3 FOR UPDATE`,
			group, topic, partition).Scan(&next); err != nil {
			return err
		}
		var inboxID int64
		if err := tx.QueryRow(ctx, `
			INSERT INTO inbox (source, dedup_key, event_id, event_type, payment_key, status, attempts, payload, topic, partition, kafka_offset, occurred_at, received_at)
			VALUES ('acme', $1, $1, 'payment.paid', $2, 'processed', 1, '\x7b7d', $3, $4, $5, $6, now()) RETURNING id`,
			"evt_"+key, key, topic, partition, next, fact.OccurredAt).Scan(&inboxID); err != nil {
			return err
		}
		st, _ := json.Marshal(d.State)
		if _, err := tx.Exec(ctx, `INSERT INTO payments (payment_key, source, payment_id, status, version, amount_minor, currency, state)
			VALUES ($1, 'acme', $1, $2, $3, $4, 'BRL', $5)`, key, d.State.Status, d.State.Version, d.State.AmountMinor, st); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, `INSERT INTO payment_transitions (payment_key, version, from_status, to_status, kind, amount_minor, currency, inbox_id)
			VALUES ($1, $2, $3, $4, $5, $6, $7, $8)`, key, tr.Version, tr.From, tr.To, tr.Kind, tr.AmountMinor, tr.Currency, inboxID); err != nil {
			return err
		}
		for _, p := range tr.Postings() {
			if _, err := tx.Exec(ctx, `INSERT INTO ledger_postings (payment_key, version, account, amount_minor, currency) VALUES ($1, $2, $3, $4, $5)`,
				key, tr.Version, p.Account, p.AmountMinor, p.Currency); err != nil {
				return err
			}
		}
		payload, _ := json.Marshal(envelope.State{EventID: eventID, PaymentKey: key, Version: tr.Version, Status: tr.To})
		if _, err := tx.Exec(ctx, `INSERT INTO outbox (payment_key, version, event_id, payload) VALUES ($1, $2, $3, $4)`, key, tr.Version, eventID, payload); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, `UPDATE consumer_offsets SET next_offset = $4 WHERE group_id = $1 AND topic = $2 AND partition = $3`, group, topic, partition, next+1)
		return err
	})
	return eventID, err
}

// TestUpgradeRefusesToOverrunSlot runs on a private Postgres whose
// max_slot_wal_keep_size is 16 MiB, with the sink's slot created before
// the upgrade (as paystream migrate does) and an outbox of 48 MiB of
// unpublished events next to 100,000 inbox rows. Emitting them in the
// upgrade's one transaction would write more WAL than the slot may retain:
// the upgrade must refuse, in one line naming the slot and what to do,
// before changing anything, and the slot must survive a checkpoint. With
// max_slot_wal_keep_size raised, it upgrades, and the slot still survives.
// Before, the upgrade ran, and the checkpoint after it invalidated the
// slot (wal_status lost): the sink could relay nothing more.
func TestUpgradeRefusesToOverrunSlot(t *testing.T) {
	testenv.SkipIfShort(t)
	pg := &pgPair{dir: t.TempDir(), port: testenv.FreePorts(t, 2)}
	pg.primary = fmt.Sprintf("postgres://paystream@127.0.0.1:%d/paystream?sslmode=disable", pg.port)
	t.Cleanup(func() { pg.stack(t, "down", "--purge") })
	pg.stack(t, "postgres-up")
	ctx := t.Context()
	admin, err := pgxpool.New(ctx, pg.primary)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(admin.Close)
	pool, _ := oldSchema(t, &testenv.DB{Pool: admin, URL: pg.primary, Schema: "public"})

	const events, inbox = 12_000, 100_000
	for _, q := range []string{
		`INSERT INTO payments (payment_key, source, payment_id, status, version, state)
		 SELECT 'acme:big_' || i, 'acme', 'big_' || i, 'paid', 1, '{}' FROM generate_series(1, $1::int) AS i`,
		`INSERT INTO payment_transitions (payment_key, version, from_status, to_status, kind)
		 SELECT 'acme:big_' || i, 1, '', 'paid', 'capture' FROM generate_series(1, $1::int) AS i`,
		`INSERT INTO outbox (payment_key, version, event_id, payload)
		 SELECT 'acme:big_' || i, 1, 'acme:big_' || i || ':1',
		        jsonb_build_object('event_id', 'acme:big_' || i || ':1', 'payment_key', 'acme:big_' || i, 'version', 1, 'status', 'paid',
		                           'metadata', repeat(md5(i::text), 125))
		   FROM generate_series(1, $1::int) AS i`,
	} {
		if _, err := pool.Exec(ctx, q, events); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := pool.Exec(ctx, `
		INSERT INTO inbox (source, dedup_key, event_id, event_type, payment_key, status, attempts, payload, topic, partition, kafka_offset, received_at)
		SELECT 'acme', 'old_' || i, 'old_' || i, 'payment.paid', 'acme:old_' || (i % 5000), 'processed', 1,
		       convert_to(repeat(md5(i::text), 6), 'UTF8'), 'old.raw', 0, i, now()
		  FROM generate_series(1, $1::int) AS i`, inbox); err != nil {
		t.Fatal(err)
	}
	slot := setupSlot(t, pool)
	keep := func(size string) {
		t.Helper()
		if _, err := admin.Exec(ctx, `ALTER SYSTEM SET max_slot_wal_keep_size = '`+size+`'`); err != nil {
			t.Fatal(err)
		}
		if _, err := admin.Exec(ctx, `SELECT pg_reload_conf()`); err != nil {
			t.Fatal(err)
		}
		testenv.WaitFor(t, 10*time.Second, func() error {
			var v string
			if err := admin.QueryRow(ctx, `SHOW max_slot_wal_keep_size`).Scan(&v); err != nil || v != size {
				return fmt.Errorf("max_slot_wal_keep_size = %q (%v), want %s", v, err, size)
			}
			return nil
		})
	}
	walStatus := func() string {
		t.Helper()
		if _, err := admin.Exec(ctx, `CHECKPOINT`); err != nil {
			t.Fatal(err)
		}
		var s string
		if err := admin.QueryRow(ctx, `SELECT wal_status FROM pg_replication_slots WHERE slot_name = $1`, slot).Scan(&s); err != nil {
			t.Fatal(err)
		}
		return s
	}
	var outboxBytes int64
	if err := pool.QueryRow(ctx, `SELECT sum(octet_length(payload::text)) FROM outbox`).Scan(&outboxBytes); err != nil {
		t.Fatal(err)
	}
	t.Logf("outbox: %d unpublished events, %.1f MiB", events, float64(outboxBytes)/(1<<20))

	keep("16MB")
	_, err = migrations.Apply(ctx, pool)
	if s := walStatus(); s == "lost" || s == "unreserved" {
		t.Fatalf("after the upgrade (error %v) the sink's slot is %s: the upgrade's WAL overran max_slot_wal_keep_size", err, s)
	}
	if !errors.Is(err, migrations.ErrUpgradeWAL) {
		t.Fatalf("upgrade with 16MB max_slot_wal_keep_size: %v, want ErrUpgradeWAL", err)
	}
	t.Logf("refused: %v", err)
	if strings.Contains(err.Error(), "\n") || !strings.Contains(err.Error(), slot) {
		t.Errorf("refusal is not one line naming slot %s: %q", slot, err)
	}
	if n := count(t, pool, `SELECT count(*)::int FROM outbox WHERE published_at IS NULL`); n != events {
		t.Errorf("after the refusal the outbox holds %d unpublished events, want all %d", n, events)
	}

	keep("1GB")
	var before string
	if err := admin.QueryRow(ctx, `SELECT pg_current_wal_insert_lsn()::text`).Scan(&before); err != nil {
		t.Fatal(err)
	}
	if _, err := migrations.Apply(ctx, pool); err != nil {
		t.Fatalf("upgrade with 1GB max_slot_wal_keep_size: %v", err)
	}
	var wrote float64
	if err := admin.QueryRow(ctx, `SELECT pg_wal_lsn_diff(pg_current_wal_insert_lsn(), $1::pg_lsn)::float8`, before).Scan(&wrote); err != nil {
		t.Fatal(err)
	}
	t.Logf("the upgrade wrote %.1f MiB of WAL", wrote/(1<<20))
	if s := walStatus(); s == "lost" || s == "unreserved" {
		t.Errorf("after the upgrade the sink's slot is %s", s)
	}
}
