package processor

import (
	"context"
	"encoding/json"
	"testing"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"

	"github.com/paystream/paystream/internal/envelope"
	"github.com/paystream/paystream/internal/statelog"
	"github.com/paystream/paystream/internal/testenv"
	"github.com/paystream/paystream/sink"
)

// stateSlot creates the sink's slot (pgoutput, an empty publication) on
// db's schema, dropped at the end of the test.
func stateSlot(t *testing.T, db *testenv.DB) string {
	t.Helper()
	slot, err := sink.SetupSlot(context.Background(), db.Pool)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_, _ = db.Pool.Exec(context.Background(), `SELECT pg_drop_replication_slot($1)`, slot)
		_, _ = db.Pool.Exec(context.Background(), `DROP PUBLICATION IF EXISTS `+pgx.Identifier{slot}.Sanitize())
	})
	return slot
}

// peekStateMessages reads the state messages of db's schema from slot,
// without consuming them, and counts them by transaction.
func peekStateMessages(t *testing.T, db *testenv.DB, slot string) (messages [][]byte, perTxn map[uint32]int) {
	t.Helper()
	rows, err := db.Pool.Query(context.Background(), `SELECT data FROM pg_logical_slot_peek_binary_changes($1, NULL, NULL,
		'proto_version', '1', 'publication_names', $2, 'messages', 'true')`, slot, slot)
	if err != nil {
		t.Fatal(err)
	}
	changes, err := pgx.CollectRows(rows, pgx.RowTo[[]byte])
	if err != nil {
		t.Fatal(err)
	}
	prefix := statelog.Prefix(db.Schema)
	perTxn = map[uint32]int{}
	var xid uint32
	for _, c := range changes {
		m, err := pglogrepl.Parse(c)
		if err != nil {
			t.Fatal(err)
		}
		switch m := m.(type) {
		case *pglogrepl.BeginMessage:
			xid = m.Xid
		case *pglogrepl.LogicalDecodingMessage:
			if m.Prefix == prefix {
				messages = append(messages, m.Content)
				perTxn[xid]++
			}
		}
	}
	return messages, perTxn
}

// TestBatchEmitsOneStateMessage: a batch transaction writes all its state
// events as one state message of its own schema's prefix, in frame format
// 2, holding every transition the batch made, per payment in version
// order, each payload the state event of its key and version.
func TestBatchEmitsOneStateMessage(t *testing.T) {
	t.Parallel()
	db := testenv.NewDB(t)
	ctx := context.Background()
	slot := stateSlot(t, db)
	recs := zombieRecords(t, 6) // two payments: pending, paid, partially refunded each
	epoch, _ := mustClaim(t, db.Pool)
	if _, err := commitBatch(ctx, db.Pool, zombieApplier(), zombieGroup, epoch, recs); err != nil {
		t.Fatal(err)
	}

	messages, perTxn := peekStateMessages(t, db, slot)
	if len(messages) != 1 || len(perTxn) != 1 {
		t.Fatalf("%d state messages in %d transactions, want 1 in 1", len(messages), len(perTxn))
	}
	if messages[0][0] != 2 {
		t.Errorf("frame format %d, want 2", messages[0][0])
	}
	events, err := statelog.DecodeMessage(messages[0])
	if err != nil {
		t.Fatal(err)
	}
	if want := queryInt(t, db.Pool, `SELECT count(*) FROM payment_transitions`); len(events) != want || want != 6 {
		t.Fatalf("%d events in the message, %d transitions stored; want 6 of each", len(events), want)
	}
	last := map[string]int64{}
	for _, e := range events {
		if e.Version != last[e.Key]+1 {
			t.Errorf("%s after version %d: events out of version order", e.EventID(), last[e.Key])
		}
		last[e.Key] = e.Version
		var st envelope.State
		if err := json.Unmarshal(e.Payload, &st); err != nil {
			t.Fatalf("%s: payload: %v", e.EventID(), err)
		}
		if st.EventID != e.EventID() || st.PaymentKey != e.Key || st.Version != e.Version {
			t.Errorf("event %s carries the payload of %s", e.EventID(), st.EventID)
		}
	}
}
