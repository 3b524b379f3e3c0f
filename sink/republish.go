package sink

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/sr"

	"github.com/paystream/paystream/internal/envelope"
	"github.com/paystream/paystream/internal/payment"
	"github.com/paystream/paystream/internal/store"
)

// HeaderRepublished marks a state record published by Republish rather
// than relayed from the WAL: its transition is exact, its "payment" object
// is the payment's state when it was republished.
const HeaderRepublished = "paystream-republished"

// ErrSlotNotLost is what Republish returns when the relay's slot is there:
// the relay publishes everything, nothing needs publishing again.
var ErrSlotNotLost = errors.New("the relay's replication slot is not lost: nothing to republish")

// RepublishConfig configures Republish.
type RepublishConfig struct {
	// Brokers are the Kafka seed brokers. Required.
	Brokers []string
	// KafkaOpts are extra franz-go options for every Kafka client (TLS,
	// SASL).
	KafkaOpts []kgo.Opt
	// Topic is the state topic. Defaults to paystream.payments.state.v1.
	Topic string
	// LatestTopic is the relay's Config.LatestTopic: the republished events
	// update it too. Defaults to "": none.
	LatestTopic string
	// CheckpointTopic is the relay's checkpoint topic. Defaults to
	// DefaultCheckpointTopic.
	CheckpointTopic string
	// Deployment is the relay's Config.Deployment. Defaults to none.
	Deployment string
	// StateFormat and SchemaRegistry are the relay's Config.StateFormat
	// and Config.SchemaRegistry: the events are published in its format.
	// Default to FormatJSON.
	StateFormat    Format
	SchemaRegistry *sr.Client
	// Since, when set, is the earliest transition time to publish again,
	// instead of the checkpoint's commit time minus Margin: for a
	// checkpoint written by a relay before commit times were recorded, or
	// none of this WAL history.
	Since time.Time
	// Margin is how long before the newest checkpoint's commit time the
	// transitions are read again: a transaction that started before the
	// checkpointed one may commit after it, and the relay's host clock is
	// not the server's. Defaults to 5m.
	Margin time.Duration
	// DryRun counts what would be published and changes nothing: no slot,
	// no record, and no relay fenced.
	DryRun bool
	// TransactionEvents caps the records of one Kafka transaction.
	// Defaults to 5000.
	TransactionEvents int
	// Progress, when set, is told how many of the events to publish are
	// published, after each Kafka transaction.
	Progress func(published, total int)
	// Logger defaults to slog.Default().
	Logger *slog.Logger
}

// RepublishReport says what Republish did.
type RepublishReport struct {
	// Identity and Slot are the relay's.
	Identity Identity
	Slot     string
	// CheckpointLSN, CheckpointTimeline and CheckpointCommitTime are the
	// newest checkpoint of the server's WAL history (zero if none), and
	// Since where the transitions were read from.
	CheckpointLSN        pglogrepl.LSN
	CheckpointTimeline   int32
	CheckpointCommitTime time.Time
	Since                time.Time
	// Transitions were recorded since Since (in the new slot's snapshot);
	// OnTopic of them were on the state topic already, and Published were
	// not, and were published (counted, under DryRun).
	Transitions, OnTopic, Published int
	// SlotLSN is where the new slot starts: the checkpoint Republish wrote.
	SlotLSN pglogrepl.LSN
}

// Republish recovers from a lost replication slot (ErrSlotLost): it
// creates the slot again and publishes, in the relay's name, every state
// event recorded in payment_transitions since the newest checkpoint of the
// server's WAL history (minus Margin) that the state topic does not hold.
//
// It reads the transitions in the snapshot the new slot exports, so every
// transition committed before the slot's start is published by Republish
// and every one after by the relay, which resumes from the checkpoint
// Republish writes last, at the slot's start. It fences the relay's
// producer and marks the slot's publication while it runs, so a relay
// waits; run again, it starts over. Events the old primary published and
// the promoted standby never received are not touched: the processor
// applies their records again (their stored offsets went back with the
// failover) and the relay publishes them again with the same event ids —
// the repeats a consumer deduplicating by event id drops.
func Republish(ctx context.Context, pool *pgxpool.Pool, cfg RepublishConfig) (RepublishReport, error) {
	if len(cfg.Brokers) == 0 {
		return RepublishReport{}, errors.New("republish config: Brokers is required")
	}
	cfg.Topic = cmp.Or(cfg.Topic, envelope.TopicState)
	cfg.CheckpointTopic = cmp.Or(cfg.CheckpointTopic, DefaultCheckpointTopic)
	cfg.Margin = cmp.Or(cfg.Margin, 5*time.Minute)
	cfg.TransactionEvents = cmp.Or(cfg.TransactionEvents, 5000)
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if err := CheckWALLevel(ctx, pool); err != nil {
		return RepublishReport{}, err
	}
	id, err := Identify(ctx, pool, cfg.Deployment)
	if err != nil {
		return RepublishReport{}, err
	}
	rep := RepublishReport{Identity: id}
	slot, state, err := resolveSlot(ctx, pool, cfg.Logger, "", id.Database, id.Schema)
	if err != nil {
		return rep, err
	}
	rep.Slot = slot
	if state != slotLost && state != slotRepublishing {
		return rep, fmt.Errorf("slot %s of %s: %w", slot, id, ErrSlotNotLost)
	}
	keys := []string{id.Key()}
	if slot == legacySlotName(id.Schema) {
		keys = append(keys, slot)
	}
	opts := func(client string, extra ...kgo.Opt) []kgo.Opt {
		return append(append(append([]kgo.Opt{}, cfg.KafkaOpts...), kgo.SeedBrokers(cfg.Brokers...)), extra...)
	}

	repl, err := pgconn.ConnectConfig(ctx, replicationConfig(pool))
	if err != nil {
		return rep, fmt.Errorf("open replication connection: %w", err)
	}
	defer repl.Close(context.WithoutCancel(ctx))
	sys, err := pglogrepl.IdentifySystem(ctx, repl)
	if err != nil {
		return rep, fmt.Errorf("identify system: %w", err)
	}
	hist, err := readHistory(ctx, repl, sys)
	if err != nil {
		return rep, err
	}

	var producer *kgo.Client
	if !cfg.DryRun {
		// Fence the relay: nothing it has open commits after the
		// checkpoint is read.
		if producer, err = relayProducer(ctx, opts, id.TransactionalID(), time.Minute); err != nil {
			return rep, err
		}
		defer producer.Close()
	}
	ckpt, err := readCheckpoint(ctx, cfg.Logger, opts, cfg.CheckpointTopic, keys, hist)
	if err != nil {
		return rep, err
	}
	rep.CheckpointLSN, rep.CheckpointTimeline, rep.CheckpointCommitTime = ckpt.LSN, ckpt.Timeline, ckpt.CommitTime
	switch {
	case !cfg.Since.IsZero():
		rep.Since = cfg.Since
	case !ckpt.CommitTime.IsZero():
		rep.Since = ckpt.CommitTime.Add(-cfg.Margin)
	default:
		return rep, fmt.Errorf("no checkpoint of this WAL history (system %s, timeline %d) with a commit time on %s: "+
			"give --since, a time before the first state event that may be missing", hist.SystemID, hist.Timeline, cfg.CheckpointTopic)
	}

	var transitions []store.RecordedTransition
	if cfg.DryRun {
		transitions, err = store.TransitionsSince(ctx, pool, rep.Since)
	} else {
		var snapshot string
		rep.SlotLSN, snapshot, err = recreateSlot(ctx, pool, repl, slot)
		if err == nil {
			transitions, err = transitionsInSnapshot(ctx, pool, snapshot, rep.Since)
		}
	}
	if err != nil {
		return rep, err
	}
	rep.Transitions = len(transitions)

	onTopic, err := eventIDsSince(ctx, opts, cfg.Topic, rep.Since.Add(-time.Minute))
	if err != nil {
		return rep, err
	}
	var enc *encoding // a dry run registers nothing: it counts JSON records
	if !cfg.DryRun {
		if enc, err = stateFormat(ctx, cfg.StateFormat, cfg.SchemaRegistry, cfg.Topic, cfg.LatestTopic); err != nil {
			return rep, err
		}
	}
	var records []*kgo.Record
	source := []byte(CESource(id))
	for _, t := range transitions {
		eventID := envelope.StateEventID(t.PaymentKey, t.Version)
		if onTopic[eventID] {
			rep.OnTopic++
			continue
		}
		rec, err := stateRecord(cfg.Topic, source, t, HeaderRepublished, enc)
		if err != nil {
			return rep, err
		}
		records = append(records, rec)
	}
	rep.Published = len(records)
	if cfg.DryRun {
		return rep, nil
	}

	var now time.Time
	if err := pool.QueryRow(ctx, `SELECT now()`).Scan(&now); err != nil {
		return rep, fmt.Errorf("read the server's time: %w", err)
	}
	ckpt = checkpoint{LSN: rep.SlotLSN, SystemID: sys.SystemID, Timeline: sys.Timeline, CommitTime: now}
	if err := publishRepublished(ctx, producer, cfg, records, id.Key(), ckpt, enc); err != nil {
		return rep, err
	}
	return rep, markPublication(ctx, pool, slot, slotMarker)
}

// recreateSlot marks the slot's publication as under republish, drops
// what is left of the slot, and creates it again on repl, exporting its
// snapshot; it returns where the slot starts and the snapshot's name,
// which stays valid while repl runs no other command.
func recreateSlot(ctx context.Context, pool *pgxpool.Pool, repl *pgconn.PgConn, slot string) (pglogrepl.LSN, string, error) {
	if err := createPublication(ctx, pool, slot); err != nil {
		return 0, "", err
	}
	if err := markPublication(ctx, pool, slot, republishMarker); err != nil {
		return 0, "", err
	}
	if _, err := pool.Exec(ctx, `SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE slot_name = $1`, slot); err != nil {
		return 0, "", fmt.Errorf("drop what is left of slot %s: %w", slot, err)
	}
	failover, err := failoverSlots(ctx, pool)
	if err != nil {
		return 0, "", err
	}
	create := fmt.Sprintf("CREATE_REPLICATION_SLOT %s LOGICAL pgoutput EXPORT_SNAPSHOT", slot)
	if failover {
		create = fmt.Sprintf("CREATE_REPLICATION_SLOT %s LOGICAL pgoutput (SNAPSHOT 'export', FAILOVER true)", slot)
	}
	res, err := pglogrepl.ParseCreateReplicationSlot(repl.Exec(ctx, create))
	if err != nil {
		return 0, "", fmt.Errorf("create replication slot %s: %w", slot, err)
	}
	lsn, err := pglogrepl.ParseLSN(res.ConsistentPoint)
	if err != nil {
		return 0, "", fmt.Errorf("slot %s consistent point %q: %w", slot, res.ConsistentPoint, err)
	}
	return lsn, res.SnapshotName, nil
}

// transitionsInSnapshot reads the transitions recorded since since, as of
// the exported snapshot.
func transitionsInSnapshot(ctx context.Context, pool *pgxpool.Pool, snapshot string, since time.Time) ([]store.RecordedTransition, error) {
	var out []store.RecordedTransition
	err := pgx.BeginTxFunc(ctx, pool, pgx.TxOptions{IsoLevel: pgx.RepeatableRead, AccessMode: pgx.ReadOnly}, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, "SET TRANSACTION SNAPSHOT "+quoteLiteral(snapshot)); err != nil {
			return fmt.Errorf("use the slot's snapshot: %w", err)
		}
		var err error
		out, err = store.TransitionsSince(ctx, tx, since)
		return err
	})
	return out, err
}

func quoteLiteral(s string) string {
	out := []byte{'\''}
	for i := range len(s) {
		if s[i] == '\'' {
			out = append(out, '\'')
		}
		out = append(out, s[i])
	}
	return string(append(out, '\''))
}

// stateRecord is the record on topic of t's state event, as the processor
// builds it but with the payment's state now, its ce_time t's recorded_at,
// and a header mark set to 1 (HeaderRepublished, HeaderBackfilled), its
// value encoded by enc as the relay's.
func stateRecord(topic string, source []byte, t store.RecordedTransition, mark string, enc *encoding) (*kgo.Record, error) {
	var st payment.State
	if err := json.Unmarshal(t.State, &st); err != nil {
		return nil, fmt.Errorf("payment %s state: %w", t.PaymentKey, err)
	}
	ev := envelope.State{
		EventID:        envelope.StateEventID(t.PaymentKey, t.Version),
		PaymentKey:     t.PaymentKey,
		Source:         t.Source,
		PaymentID:      t.PaymentID,
		Version:        t.Version,
		Status:         payment.Status(t.To),
		PreviousStatus: payment.Status(t.From),
		Kind:           t.Kind,
		AmountMinor:    t.AmountMinor,
		Currency:       t.Currency,
		RefundID:       t.RefundID,
		Payment:        st,
		SourceEventID:  t.SourceEventID,
		OccurredAt:     t.RecordedAt.UTC(),
		RecordedAt:     t.RecordedAt.UTC(),
	}
	if t.OccurredAt != nil {
		ev.OccurredAt = t.OccurredAt.UTC()
	}
	payload, err := json.Marshal(ev)
	if err != nil {
		return nil, fmt.Errorf("encode state event %s: %w", ev.EventID, err)
	}
	key := []byte(t.PaymentKey)
	headers := stateHeaders([]byte(ev.EventID), key, ceTime(t.RecordedAt), source, 1)
	headers = append(headers, kgo.RecordHeader{Key: mark, Value: []byte("1")})
	rec := &kgo.Record{Topic: topic, Key: key, Value: payload, Headers: headers}
	if err := enc.encode(rec); err != nil {
		return nil, err
	}
	return rec, nil
}

// publishRepublished publishes records in Kafka transactions of at most
// cfg.TransactionEvents, the last one with the checkpoint ckpt under key.
func publishRepublished(ctx context.Context, cl *kgo.Client, cfg RepublishConfig, records []*kgo.Record, key string, ckpt checkpoint, enc *encoding) error {
	ckptRec, err := checkpointRecord(cfg.CheckpointTopic, key, ckpt)
	if err != nil {
		return err
	}
	for done := 0; ; {
		n := min(cfg.TransactionEvents, len(records)-done)
		batch := records[done : done+n]
		last := done+n == len(records)
		batch = append(batch[:n:n], latestRecords(cfg.LatestTopic, batch, enc)...)
		if last {
			batch = append(batch, ckptRec)
		}
		if err := produceTransaction(ctx, cl, batch); err != nil {
			return err
		}
		done += n
		if cfg.Progress != nil {
			cfg.Progress(done, len(records))
		}
		if last {
			return nil
		}
	}
}

// produceTransaction produces records in one Kafka transaction.
func produceTransaction(ctx context.Context, cl *kgo.Client, records []*kgo.Record) error {
	if err := cl.BeginTransaction(); err != nil {
		return fmt.Errorf("begin kafka transaction: %w", err)
	}
	var (
		mu       sync.Mutex
		firstErr error
	)
	for _, rec := range records {
		cl.Produce(ctx, rec, func(_ *kgo.Record, err error) {
			if err != nil {
				mu.Lock()
				firstErr = cmp.Or(firstErr, err)
				mu.Unlock()
			}
		})
	}
	err := cl.Flush(ctx)
	mu.Lock()
	err = cmp.Or(err, firstErr)
	mu.Unlock()
	commit := kgo.TryCommit
	if err != nil {
		commit = kgo.TryAbort
	}
	if endErr := cl.EndTransaction(ctx, commit); err == nil && endErr != nil {
		err = fmt.Errorf("commit kafka transaction: %w", endErr)
	}
	if err != nil {
		return fmt.Errorf("publish again: %w", err)
	}
	return nil
}

// eventIDsSince returns the event ids of the state records a
// read_committed consumer sees on topic from the first record stamped at
// or after since to each partition's end.
func eventIDsSince(ctx context.Context, opts func(client string, extra ...kgo.Opt) []kgo.Opt, topic string, since time.Time) (map[string]bool, error) {
	admCl, err := kgo.NewClient(opts(ClientAdmin)...)
	if err != nil {
		return nil, fmt.Errorf("kafka client: %w", err)
	}
	defer admCl.Close()
	adm := kadm.NewClient(admCl)
	starts, err := adm.ListOffsetsAfterMilli(ctx, since.UnixMilli(), topic)
	if err == nil {
		err = starts.Error()
	}
	if err != nil {
		return nil, fmt.Errorf("list state topic offsets at %s: %w", since.Format(time.RFC3339), err)
	}
	ends, err := adm.ListEndOffsets(ctx, topic)
	if err == nil {
		err = ends.Error()
	}
	if err != nil {
		return nil, fmt.Errorf("list state topic end offsets: %w", err)
	}
	todo := map[int32]int64{}
	from := map[int32]kgo.Offset{}
	ends.Each(func(o kadm.ListedOffset) {
		if s, ok := starts.Lookup(topic, o.Partition); ok && s.Offset < o.Offset {
			todo[o.Partition] = o.Offset
			from[o.Partition] = kgo.NewOffset().At(s.Offset)
		}
	})
	ids := map[string]bool{}
	if len(todo) == 0 {
		return ids, nil
	}
	cl, err := kgo.NewClient(opts(ClientCheckpoint,
		kgo.ConsumePartitions(map[string]map[int32]kgo.Offset{topic: from}),
		kgo.FetchIsolationLevel(kgo.ReadCommitted()),
		kgo.KeepControlRecords(),
	)...)
	if err != nil {
		return nil, fmt.Errorf("kafka client: %w", err)
	}
	defer cl.Close()
	rctx, cancel := context.WithTimeout(ctx, 10*time.Minute)
	defer cancel()
	for len(todo) > 0 {
		fs := cl.PollFetches(rctx)
		if err := rctx.Err(); err != nil {
			return nil, fmt.Errorf("read state topic up to %v: %w", todo, err)
		}
		var fetchErr error
		fs.EachError(func(_ string, p int32, err error) { fetchErr = fmt.Errorf("read state topic partition %d: %w", p, err) })
		if fetchErr != nil {
			return nil, fetchErr
		}
		fs.EachRecord(func(rec *kgo.Record) {
			if end, ok := todo[rec.Partition]; ok && rec.Offset+1 >= end {
				delete(todo, rec.Partition)
			}
			if rec.Attrs.IsControl() {
				return
			}
			for _, h := range rec.Headers {
				if h.Key == envelope.HeaderEventID {
					ids[string(h.Value)] = true
				}
			}
		})
	}
	return ids, nil
}
