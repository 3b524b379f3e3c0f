package e2e

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/paystream/paystream/internal/ledger"
	"github.com/paystream/paystream/internal/testenv"
	"github.com/paystream/paystream/processor"
)

// historyRecords are the raw records of hs, each payment's events in order
// (payments one after another).
func historyRecords(t *testing.T, topic string, hs []history) []*kgo.Record {
	t.Helper()
	var recs []*kgo.Record
	for _, h := range hs {
		for _, ev := range h.events {
			recs = append(recs, rawRecord(t, topic, h.key, ev))
		}
	}
	return recs
}

// effects counts what the pipeline wrote that has an effect.
type effects struct {
	transitions, postings, movements, held, quarantined int
}

func takeEffects(t *testing.T, pool *pgxpool.Pool) effects {
	t.Helper()
	var e effects
	err := pool.QueryRow(context.Background(), `
		SELECT (SELECT count(*) FROM payment_transitions), (SELECT count(*) FROM ledger_postings), (SELECT count(*) FROM ledger_movements),
		       (SELECT count(*) FROM payments WHERE held), (SELECT count(*) FROM deliveries WHERE status = 'quarantined')`).
		Scan(&e.transitions, &e.postings, &e.movements, &e.held, &e.quarantined)
	if err != nil {
		t.Fatal(err)
	}
	return e
}

// checkExactlyOnce fails the test unless the database holds exactly the
// effects of applying each of hs's events once, in order: transitions,
// postings, ledger movements and every payment's ledger balances.
func checkExactlyOnce(t *testing.T, pool *pgxpool.Pool, hs []history) {
	t.Helper()
	var want effects
	balances := map[string]map[ledger.Key]int64{}
	for _, h := range hs {
		r := h.inOrder()
		want.transitions += len(r.Transitions)
		for _, tr := range r.Transitions {
			want.movements += len(tr.Movements)
			want.postings += 2 * len(tr.Movements) // the view has two legs per movement
		}
		if b := r.State.Balances(); len(b) > 0 {
			balances[h.key] = b
		}
	}
	if got := takeEffects(t, pool); got != want {
		t.Errorf("effects %+v, want %+v (each event applied once, nothing held or quarantined)", got, want)
	}
	got := ledgerByPayment(t, pool)
	for key, w := range balances {
		if !maps.Equal(got[key], w) {
			t.Errorf("%s: ledger balances %v, want %v", key, got[key], w)
		}
	}
	if len(got) != len(balances) {
		t.Errorf("ledger has %d payments with balances, want %d", len(got), len(balances))
	}
}

// waitCaughtUp waits until group's stored offsets reach topic's end offsets.
func waitCaughtUp(t *testing.T, pool *pgxpool.Pool, brokers []string, group, topic string, timeout time.Duration) {
	t.Helper()
	ends := testenv.EndOffsets(t, brokers, topic)
	testenv.WaitFor(t, timeout, func() error { return testenv.OffsetsBehind(t, pool, group, topic, ends) })
}

// TestNewGroupRereadsAsDuplicates: a second consumer group over the same
// topic and database re-reads every record from the start. Each comes out
// as an ignored duplicate_event row and nothing is applied twice. Before
// the inbox's (topic, partition, kafka_offset) key was dropped, group B's
// first insert conflicted with group A's row and its batch was retried
// forever (23505 was poison, and quarantining conflicted again).
func TestNewGroupRereadsAsDuplicates(t *testing.T) {
	db := testenv.NewDB(t)
	brokers := testenv.Kafka(t)
	raw := testenv.Topic(t, "raw", 3)
	hs := genHistories(60)
	recs := historyRecords(t, raw, hs)
	testenv.Produce(t, brokers, recs...)

	groupA, groupB := testenv.Group(t)+"-a", testenv.Group(t)+"-b"
	a := runProcessor(t, db.Pool, processor.Config{Brokers: brokers, Topic: raw, Group: groupA})
	waitCaughtUp(t, db.Pool, brokers, groupA, raw, 60*time.Second)
	a.Stop()
	checkExactlyOnce(t, db.Pool, hs)
	before := takeEffects(t, db.Pool)
	inboxA := count(t, db.Pool, `SELECT count(*) FROM deliveries`)
	maxA := count(t, db.Pool, `SELECT max(id) FROM deliveries`)

	start := time.Now()
	b := runProcessor(t, db.Pool, processor.Config{Brokers: brokers, Topic: raw, Group: groupB})
	waitCaughtUp(t, db.Pool, brokers, groupB, raw, 60*time.Second)
	b.Stop()
	t.Logf("group B re-read %d records in %s", len(recs), time.Since(start).Round(time.Millisecond))

	if n := count(t, db.Pool, `SELECT count(*) FROM deliveries`) - inboxA; n != len(recs) {
		t.Errorf("group B wrote %d inbox rows, want one per record (%d)", n, len(recs))
	}
	if n := count(t, db.Pool, `SELECT count(*) FROM deliveries WHERE id > $1 AND status = 'ignored' AND reason = 'duplicate_event'`, maxA); n != len(recs) {
		t.Errorf("only %d of group B's %d rows are ignored duplicate_event rows", n, len(recs))
	}
	if after := takeEffects(t, db.Pool); after != before {
		t.Errorf("group B changed effects: %+v, before %+v", after, before)
	}
	checkExactlyOnce(t, db.Pool, hs)
}

// recreateTopic deletes topic and creates it again with the same name and
// partitions, and returns once metadata shows the new incarnation (a new
// topic ID) with a leader for every partition.
func recreateTopic(t *testing.T, brokers []string, topic string, partitions int32) {
	t.Helper()
	adm := testenv.Admin(t, brokers)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	md, err := adm.Metadata(ctx, topic)
	if err != nil {
		t.Fatal(err)
	}
	oldID := md.Topics[topic].ID
	if resp, err := adm.DeleteTopic(ctx, topic); err != nil || resp.Err != nil {
		t.Fatalf("delete topic: %v %v", err, resp.Err)
	}
	testenv.WaitFor(t, 60*time.Second, func() error {
		resp, err := adm.CreateTopic(ctx, partitions, 1, nil, topic)
		if err == nil {
			err = resp.Err
		}
		if err != nil && !errors.Is(err, kerr.TopicAlreadyExists) {
			return err
		}
		md, err := adm.Metadata(ctx, topic)
		if err != nil {
			return err
		}
		td := md.Topics[topic]
		if td.Err != nil || td.ID == oldID || len(td.Partitions) != int(partitions) {
			return fmt.Errorf("topic %s: id %s (old %s), %d partitions, err %v", topic, td.ID, oldID, len(td.Partitions), td.Err)
		}
		for _, p := range td.Partitions {
			if p.Leader < 0 || p.Err != nil {
				return fmt.Errorf("partition %d: leader %d, err %v", p.Partition, p.Leader, p.Err)
			}
		}
		return nil
	})
}

// TestRecreatedTopicResumesFromStart: the raw topic is processed, deleted
// and recreated under the same name (a new topic ID, offsets from 0 again)
// and new events are produced to it. They are all applied: the claim sees
// the new topic ID and resumes each partition from its start instead of
// the dead incarnation's stored offset (before: a fetch past the new
// topic's end that never returned a record, or, with more new records than
// old, a silent skip of the first ones).
func TestRecreatedTopicResumesFromStart(t *testing.T) {
	db := testenv.NewDB(t)
	brokers := testenv.Kafka(t)
	raw := testenv.Topic(t, "raw", 3)
	group := testenv.Group(t)
	first := genHistories(60)
	testenv.Produce(t, brokers, historyRecords(t, raw, first)...)
	p := runProcessor(t, db.Pool, processor.Config{Brokers: brokers, Topic: raw, Group: group})
	waitCaughtUp(t, db.Pool, brokers, group, raw, 60*time.Second)
	p.Stop()
	oldOffsets := testenv.StoredOffsets(t, db.Pool, group, raw)

	recreateTopic(t, brokers, raw, 3)
	// Fewer records than before: every partition's new end is below the
	// offset stored for the old incarnation.
	second := genHistories(75)[60:]
	testenv.Produce(t, brokers, historyRecords(t, raw, second)...)
	ends := testenv.EndOffsets(t, brokers, raw)
	for part, end := range ends {
		t.Logf("partition %d: old incarnation stored %d, new end %d", part, oldOffsets[part], end)
	}

	p = runProcessor(t, db.Pool, processor.Config{Brokers: brokers, Topic: raw, Group: group})
	testenv.WaitFor(t, 60*time.Second, func() error { return testenv.OffsetsBehind(t, db.Pool, group, raw, ends) })
	p.Stop()
	checkExactlyOnce(t, db.Pool, append(first, second...))
	if n := count(t, db.Pool, `SELECT count(DISTINCT topic_id) FROM consumer_offsets WHERE group_id = $1`, group); n != 1 {
		t.Errorf("consumer_offsets holds %d topic ids for the group, want 1 (the new incarnation's)", n)
	}
}
