package sink

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgproto3"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/sr"

	"github.com/paystream/paystream/internal/envelope"
	"github.com/paystream/paystream/internal/store"
)

// HeaderBackfilled marks a latest-state record written by Backfill.
const HeaderBackfilled = "paystream-backfilled"

// BackfillConfig configures Backfill.
type BackfillConfig struct {
	// Brokers are the Kafka seed brokers. Required.
	Brokers []string
	// KafkaOpts are extra franz-go options for every Kafka client (TLS,
	// SASL).
	KafkaOpts []kgo.Opt
	// Topic is the state topic; LatestTopic the latest-state topic, created
	// (compacted, with the state topic's partitions) when missing.
	// Default to paystream.payments.state.v1 and .latest.v1.
	Topic, LatestTopic string
	// CheckpointTopic is the relay's. Defaults to DefaultCheckpointTopic.
	CheckpointTopic string
	// Deployment is the relay's Config.Deployment. Defaults to none.
	Deployment string
	// StateFormat and SchemaRegistry are the relay's Config.StateFormat
	// and Config.SchemaRegistry: the events are published in its format.
	// Default to FormatJSON.
	StateFormat    Format
	SchemaRegistry *sr.Client
	// TakeOverFor bounds how long Backfill tries to take the slot from the
	// active relay. Defaults to 30s.
	TakeOverFor time.Duration
	// PageSize is how many payments one Kafka transaction carries.
	// Defaults to 5000.
	PageSize int
	// Progress, when set, is told how many of the payments are published,
	// after each Kafka transaction.
	Progress func(published, total int64)
	// Logger defaults to slog.Default().
	Logger *slog.Logger
}

// BackfillReport says what Backfill did.
type BackfillReport struct {
	Slot     string
	Payments int64         // payments published
	Took     time.Duration // from taking the slot to releasing it
	TookOver bool          // an active relay's walsender was ended to take the slot
}

// Backfill rebuilds the latest-state topic from Postgres: for every payment,
// its newest state event, as the relay would have published it. Use it when
// the topic is new on an installation that has state events already, or
// was lost.
//
// It must not race the relay, whose newer events a backfilled older one
// would hide from compaction: Backfill takes the relay's replication slot
// (ending the active relay's walsender if needed; relays wait meanwhile as
// standbys, the slot keeping their events), fences the relay's producer,
// reads the payments in one snapshot and publishes with the relay's
// transactional id, then lets go of the slot. Every transaction the relay
// published before is older than the snapshot; every one it publishes
// after comes later on the topic. The slot is not advanced.
func Backfill(ctx context.Context, pool *pgxpool.Pool, cfg BackfillConfig) (BackfillReport, error) {
	if len(cfg.Brokers) == 0 {
		return BackfillReport{}, errors.New("backfill config: Brokers is required")
	}
	cfg.Topic = cmp.Or(cfg.Topic, envelope.TopicState)
	cfg.LatestTopic = cmp.Or(cfg.LatestTopic, envelope.TopicLatest)
	cfg.CheckpointTopic = cmp.Or(cfg.CheckpointTopic, DefaultCheckpointTopic)
	cfg.TakeOverFor = cmp.Or(cfg.TakeOverFor, 30*time.Second)
	cfg.PageSize = cmp.Or(cfg.PageSize, 5000)
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	var rep BackfillReport
	if err := CheckWALLevel(ctx, pool); err != nil {
		return rep, err
	}
	id, err := Identify(ctx, pool, cfg.Deployment)
	if err != nil {
		return rep, err
	}
	slot, err := setupSlot(ctx, pool, cfg.Logger, "", id.Database, id.Schema)
	if err != nil {
		return rep, err
	}
	rep.Slot = slot
	opts := func(client string, extra ...kgo.Opt) []kgo.Opt {
		return append(append(append([]kgo.Opt{}, cfg.KafkaOpts...), kgo.SeedBrokers(cfg.Brokers...)), extra...)
	}
	adminCl, err := kgo.NewClient(opts(ClientAdmin)...)
	if err != nil {
		return rep, fmt.Errorf("kafka client: %w", err)
	}
	err = ensureLatestTopic(ctx, kadm.NewClient(adminCl), cfg.Topic, cfg.LatestTopic)
	adminCl.Close()
	if err != nil {
		return rep, err
	}

	start := time.Now()
	hold, err := holdSlot(ctx, pool, slot, cfg.TakeOverFor)
	if err != nil {
		return rep, err
	}
	defer hold.release()
	rep.TookOver = hold.tookOver

	producer, err := relayProducer(ctx, opts, id.TransactionalID(), time.Minute)
	if err != nil {
		return rep, err
	}
	defer producer.Close()

	enc, err := stateFormat(ctx, cfg.StateFormat, cfg.SchemaRegistry, cfg.LatestTopic)
	if err != nil {
		return rep, err
	}
	source := []byte(CESource(id))
	err = pgx.BeginTxFunc(ctx, pool, pgx.TxOptions{IsoLevel: pgx.RepeatableRead, AccessMode: pgx.ReadOnly}, func(tx pgx.Tx) error {
		total, err := store.CountPayments(ctx, tx)
		if err != nil {
			return err
		}
		for after := ""; ; {
			page, err := store.NewestTransitions(ctx, tx, after, cfg.PageSize)
			if err != nil {
				return err
			}
			if len(page) == 0 {
				return nil
			}
			records := make([]*kgo.Record, 0, len(page))
			for _, t := range page {
				rec, err := stateRecord(cfg.LatestTopic, source, t, HeaderBackfilled, enc)
				if err != nil {
					return err
				}
				records = append(records, rec)
			}
			if err := hold.err(); err != nil {
				return err
			}
			if err := produceTransaction(ctx, producer, records); err != nil {
				return err
			}
			rep.Payments += int64(len(page))
			if cfg.Progress != nil {
				cfg.Progress(rep.Payments, max(total, rep.Payments))
			}
			after = page[len(page)-1].PaymentKey
		}
	})
	rep.Took = time.Since(start)
	if err != nil {
		return rep, fmt.Errorf("backfill %s: %w", cfg.LatestTopic, err)
	}
	return rep, hold.err()
}

// slotHold is a replication connection streaming a slot, so that no relay
// can: it reads and drops what the server sends, and answers keepalives
// with the position the slot had, so nothing is confirmed.
type slotHold struct {
	conn     *pgconn.PgConn
	cancel   context.CancelFunc
	done     chan error
	tookOver bool
}

// holdSlot takes slot, ending the walsender of the relay that streams it,
// for up to within.
func holdSlot(ctx context.Context, pool *pgxpool.Pool, slot string, within time.Duration) (*slotHold, error) {
	h := &slotHold{done: make(chan error, 1)}
	deadline := time.Now().Add(within)
	for {
		conn, err := pgconn.ConnectConfig(ctx, replicationConfig(pool))
		if err != nil {
			return nil, fmt.Errorf("open replication connection: %w", err)
		}
		err = pglogrepl.StartReplication(ctx, conn, slot, 0, pglogrepl.StartReplicationOptions{
			Mode:       pglogrepl.LogicalReplication,
			PluginArgs: []string{"proto_version '1'", "publication_names '" + slot + "'", "messages 'true'"},
		})
		if err == nil {
			h.conn = conn
			break
		}
		conn.Close(context.WithoutCancel(ctx))
		if !isSQLState(err, sqlstateObjectInUse) || time.Now().After(deadline) {
			return nil, fmt.Errorf("take replication slot %s: %w", slot, err)
		}
		if _, err := pool.Exec(ctx, `SELECT pg_terminate_backend(active_pid) FROM pg_replication_slots
			  WHERE slot_name = $1 AND active_pid IS NOT NULL`, slot); err != nil {
			return nil, fmt.Errorf("end the walsender streaming slot %s: %w", slot, err)
		}
		h.tookOver = true
		sleep(ctx, 20*time.Millisecond)
	}
	var kept pglogrepl.LSN
	var confirmed *string
	if err := pool.QueryRow(ctx, `SELECT confirmed_flush_lsn::text FROM pg_replication_slots WHERE slot_name = $1`, slot).Scan(&confirmed); err != nil {
		h.conn.Close(context.WithoutCancel(ctx))
		return nil, fmt.Errorf("read slot %s: %w", slot, err)
	}
	if confirmed != nil {
		kept, _ = pglogrepl.ParseLSN(*confirmed)
	}
	hctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	h.cancel = cancel
	go func() { h.done <- h.drain(hctx, kept) }()
	return h, nil
}

// drain drops what the stream sends and answers every keepalive with kept,
// until ctx ends.
func (h *slotHold) drain(ctx context.Context, kept pglogrepl.LSN) error {
	status := func() error {
		return pglogrepl.SendStandbyStatusUpdate(ctx, h.conn, pglogrepl.StandbyStatusUpdate{WALWritePosition: kept})
	}
	next := time.Now().Add(10 * time.Second)
	for {
		rctx, cancel := context.WithDeadline(ctx, next)
		msg, err := h.conn.ReceiveMessage(rctx)
		cancel()
		switch {
		case ctx.Err() != nil:
			return nil
		case err != nil && pgconn.Timeout(err):
			if err := status(); err != nil {
				return fmt.Errorf("hold slot: %w", err)
			}
			next = time.Now().Add(10 * time.Second)
			continue
		case err != nil:
			return fmt.Errorf("hold slot: %w", err)
		}
		if cd, ok := msg.(*pgproto3.CopyData); ok && len(cd.Data) > 0 && cd.Data[0] == pglogrepl.PrimaryKeepaliveMessageByteID {
			if pkm, err := pglogrepl.ParsePrimaryKeepaliveMessage(cd.Data[1:]); err == nil && pkm.ReplyRequested {
				if err := status(); err != nil {
					return fmt.Errorf("hold slot: %w", err)
				}
			}
		}
	}
}

// err returns why the hold ended early, if it did.
func (h *slotHold) err() error {
	select {
	case err := <-h.done:
		if err == nil {
			err = errors.New("hold slot: stream ended")
		}
		h.done <- err
		return err
	default:
		return nil
	}
}

// release lets the slot go.
func (h *slotHold) release() {
	h.cancel()
	<-h.done
	h.conn.Close(context.Background())
}
