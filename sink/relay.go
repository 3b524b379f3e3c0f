package sink

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/paystream/paystream/internal/retry"
	"github.com/paystream/paystream/internal/statelog"
)

// Relay publishes the state messages the processor writes into the WAL
// (see package statelog) to the normalized topic, exactly once for
// read_committed consumers.
//
// It reads them from a logical replication slot, which only one
// connection can stream at a time: the relay holding it is the active one,
// others are standbys retrying every StandbyRetry. Whole Postgres
// transactions, in commit order, go into one Kafka transaction together
// with a checkpoint record (the end LSN of the last of them); the slot is
// confirmed only after the Kafka commit. A relay that takes over fences
// its predecessor's producer (same transactional id), reads the committed
// checkpoint back and skips the Postgres transactions the slot sends again
// that end at or below it.
type Relay struct {
	cfg     Config
	pool    *pgxpool.Pool
	log     *slog.Logger
	metrics *metrics
	// id is the relay's identity, set up by setup, and ceSource its
	// records' ce_source.
	id       Identity
	ceSource []byte
	// enc encodes the state values in StateFormat, set up by setup; nil
	// for JSON.
	enc *encoding
	// prefix is the state messages' prefix: the pool's current schema's.
	prefix string
	// keys are the checkpoint keys read at takeover: the identity's, and
	// the slot's when an earlier relay of this database keyed its
	// checkpoints by its slot. legacyTxnID, set in that case, is that
	// relay's transactional id, fenced at takeover too.
	keys        []string
	legacyTxnID string

	// afterCommit, when set (by tests), runs after each Kafka commit,
	// before the slot is confirmed; an error ends the session there.
	afterCommit func(pglogrepl.LSN) error
	// midPublish, when set (by tests), runs after each state record a
	// Kafka transaction produces, with how many it has produced; an error
	// ends the session there, neither committed nor aborted.
	midPublish func(produced int) error
}

// errSlotBusy says another relay streams the slot: this one is a standby.
var errSlotBusy = errors.New("replication slot is active in another relay")

// IdentityCollisionError says another relay uses this relay's
// transactional id while this one holds the slot: two deployments share
// one identity, which would mix their checkpoints.
type IdentityCollisionError struct {
	TransactionalID string
	Slot            string
	Err             error
}

func (e *IdentityCollisionError) Error() string {
	return fmt.Sprintf("another relay fenced transactional id %q while this relay holds slot %s: "+
		"two deployments share one identity (a database cloned from another's backup, on one Kafka cluster?); "+
		"give each its own --deployment: %v", e.TransactionalID, e.Slot, e.Err)
}

func (e *IdentityCollisionError) Unwrap() error { return e.Err }

// Run relays until ctx is canceled, and then returns nil. It returns at
// once an error wrapping ErrWALLevel when the server cannot do logical
// decoding, a *SlotCollisionError when the slot's name belongs to
// another database, and an *IdentityCollisionError when another
// deployment's relay uses its identity. While the slot is lost (see
// ErrSlotLost) it relays nothing, reports paystream_sink_slot_lost 1 and
// checks every LostSlotRetry whether `paystream republish` recreated it. Other
// failures (database, broker) it logs and retries, starting over from the
// Kafka checkpoint.
func (r *Relay) Run(ctx context.Context) error {
	backoff := retry.Policy{Initial: 100 * time.Millisecond, Max: 5 * time.Second}.Backoff()
	ready := false // set up; standbys retrying the slot need not redo it
	for ctx.Err() == nil {
		var err error
		if !ready {
			err = r.setup(ctx)
			ready = err == nil
		}
		if ready {
			r.metrics.slotLost.Set(0)
			err = r.lead(ctx)
		}
		var slotCollision *SlotCollisionError
		var idCollision *IdentityCollisionError
		switch {
		case ctx.Err() != nil:
			return nil
		case errors.Is(err, ErrWALLevel), errors.As(err, &slotCollision), errors.As(err, &idCollision):
			return err
		case errors.Is(err, ErrSlotLost), errors.Is(err, ErrRepublishUnfinished):
			r.metrics.slotLost.Set(1)
			r.log.Error("relaying nothing until the slot is recreated", "error", err, "retry", r.cfg.LostSlotRetry)
			sleep(ctx, r.cfg.LostSlotRetry)
			continue
		case errors.Is(err, errSlotBusy):
			r.log.Debug("slot busy, standing by", "slot", r.cfg.Slot)
			backoff.Reset()
			sleep(ctx, r.cfg.StandbyRetry)
			continue
		case err == nil:
			continue
		}
		ready = false
		r.metrics.errors.Inc()
		wait := backoff.Next()
		r.log.Warn("slot relay failed, restarting from the checkpoint", "error", err, "backoff", wait)
		sleep(ctx, wait)
	}
	return nil
}

// setup checks the server, finds the relay's identity, slot and
// transactional id, and creates what is missing: the slot, its
// publication and the checkpoint topic. A lost slot it does not create
// (ErrSlotLost).
func (r *Relay) setup(ctx context.Context) error {
	if err := CheckWALLevel(ctx, r.pool); err != nil {
		return err
	}
	id, err := Identify(ctx, r.pool, r.cfg.Deployment)
	if err != nil {
		return err
	}
	r.id = id
	r.ceSource = []byte(CESource(id))
	r.prefix = statelog.Prefix(id.Schema)
	slot, err := setupSlot(ctx, r.pool, r.log, r.cfg.Slot, id.Database, id.Schema)
	if err != nil {
		return err
	}
	r.cfg.Slot = slot
	r.keys = []string{id.Key()}
	if slot == legacySlotName(id.Schema) {
		// An earlier relay's slot, checkpoints and transactional id.
		r.keys = append(r.keys, slot)
		r.legacyTxnID = "paystream-sink-" + slot
	}
	if r.cfg.TransactionalID == "" {
		r.cfg.TransactionalID = id.TransactionalID()
	}
	cl, err := kgo.NewClient(r.kafkaOpts(ClientAdmin)...)
	if err != nil {
		return fmt.Errorf("kafka client: %w", err)
	}
	defer cl.Close()
	adm := kadm.NewClient(cl)
	if err := ensureCheckpointTopic(ctx, adm, r.cfg.CheckpointTopic); err != nil {
		return err
	}
	if err := ensureLatestTopic(ctx, adm, r.cfg.Topic, r.cfg.LatestTopic); err != nil {
		return err
	}
	r.enc, err = stateFormat(ctx, r.cfg.StateFormat, r.cfg.SchemaRegistry, r.cfg.Topic, r.cfg.LatestTopic)
	return err
}

// lead takes the slot, fences the previous relay's producer, reads the
// checkpoint and relays until ctx ends or something fails. It returns
// errSlotBusy when another relay streams the slot.
func (r *Relay) lead(ctx context.Context) error {
	conn, err := pgconn.ConnectConfig(ctx, replicationConfig(r.pool))
	if err != nil {
		return fmt.Errorf("open replication connection: %w", err)
	}
	defer conn.Close(context.WithoutCancel(ctx))
	sys, err := pglogrepl.IdentifySystem(ctx, conn)
	if err != nil {
		return fmt.Errorf("identify system: %w", err)
	}
	hist, err := readHistory(ctx, conn, sys)
	if err != nil {
		return err
	}
	if err := r.keepOnStandbys(ctx, conn); err != nil {
		return err
	}
	// The slot is exclusive: taking it is taking the leadership.
	err = pglogrepl.StartReplication(ctx, conn, r.cfg.Slot, 0, pglogrepl.StartReplicationOptions{
		Mode: pglogrepl.LogicalReplication,
		PluginArgs: []string{
			"proto_version '1'",
			"publication_names '" + r.cfg.Slot + "'",
			"messages 'true'",
		},
	})
	if isSQLState(err, sqlstateObjectInUse) {
		return errSlotBusy
	}
	if err != nil {
		return fmt.Errorf("start replication on slot %s: %w", r.cfg.Slot, err)
	}

	// Nothing the previous relay has in flight can commit after we read
	// the checkpoint.
	cl, err := relayProducer(ctx, r.kafkaOpts, r.cfg.TransactionalID, r.cfg.TransactionTimeout)
	if err != nil {
		return err
	}
	defer cl.Close()
	if r.legacyTxnID != "" {
		if err := fence(ctx, r.kafkaOpts, r.legacyTxnID); err != nil {
			return err
		}
	}
	ckpt, err := readCheckpoint(ctx, r.log, r.kafkaOpts, r.cfg.CheckpointTopic, r.keys, hist)
	if err != nil {
		return err
	}

	r.metrics.active.Set(1)
	defer r.metrics.active.Set(0)
	r.log.Info("slot relay active", "slot", r.cfg.Slot, "identity", r.id.Key(), "timeline", sys.Timeline,
		"checkpoint_lsn", ckpt.LSN, "checkpoint_timeline", ckpt.Timeline)

	hbCtx, stopHeartbeat := context.WithCancel(ctx)
	var hb sync.WaitGroup
	hb.Go(func() { r.heartbeat(hbCtx) })
	defer func() { stopHeartbeat(); hb.Wait() }()

	s := &session{r: r, conn: conn, cl: cl, ckpt: ckpt, systemID: sys.SystemID, timeline: sys.Timeline}
	// A relay that stopped between its Kafka commit and confirming the
	// slot left the slot behind the checkpoint: confirm it now.
	if err := s.confirm(ckpt.LSN, time.Time{}); err != nil {
		return err
	}
	return s.run(ctx)
}

// relayProducer returns a transactional producer of txnID, as the relay
// publishes (acks from all replicas, no linger, partitions by key), whose
// initialization has bumped txnID's epoch: a transaction an earlier
// producer of txnID left open is aborted, and that producer can commit
// nothing more.
func relayProducer(ctx context.Context, opts func(client string, extra ...kgo.Opt) []kgo.Opt, txnID string, timeout time.Duration) (*kgo.Client, error) {
	cl, err := kgo.NewClient(opts(ClientRelay,
		kgo.TransactionalID(txnID),
		kgo.TransactionTimeout(timeout),
		kgo.RequiredAcks(kgo.AllISRAcks()),
		kgo.ProducerLinger(0),
		kgo.RecordPartitioner(kgo.StickyKeyPartitioner(nil)),
	)...)
	if err != nil {
		return nil, fmt.Errorf("kafka client: %w", err)
	}
	if _, _, err := cl.ProducerID(ctx); err != nil {
		cl.Close()
		return nil, fmt.Errorf("fence the previous producer of %q (init producer id): %w", txnID, err)
	}
	return cl, nil
}

// fence bumps the epoch of transactional id txnID: a transaction its
// producer left open is aborted, and the producer can commit nothing more.
func fence(ctx context.Context, opts func(client string, extra ...kgo.Opt) []kgo.Opt, txnID string) error {
	cl, err := kgo.NewClient(opts(ClientAdmin, kgo.TransactionalID(txnID))...)
	if err != nil {
		return fmt.Errorf("kafka client: %w", err)
	}
	defer cl.Close()
	if _, _, err := cl.ProducerID(ctx); err != nil {
		return fmt.Errorf("fence transactional id %q (init producer id): %w", txnID, err)
	}
	return nil
}

// heartbeat emits a heartbeat message and measures the slot's lag every
// HeartbeatInterval until ctx ends.
func (r *Relay) heartbeat(ctx context.Context) {
	t := time.NewTicker(r.cfg.HeartbeatInterval)
	defer t.Stop()
	for {
		var lag int64
		err := r.pool.QueryRow(ctx, `
			SELECT coalesce(pg_wal_lsn_diff(pg_current_wal_lsn(), confirmed_flush_lsn), 0)::bigint
			  FROM pg_replication_slots WHERE slot_name = $1`, r.cfg.Slot).Scan(&lag)
		if err == nil {
			r.metrics.lagBytes.Set(float64(lag))
			_, err = r.pool.Exec(ctx, statelog.HeartbeatSQL)
		}
		if err != nil && ctx.Err() == nil {
			r.log.Warn("slot heartbeat failed", "error", err)
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// sleep waits for d or until ctx ends.
func sleep(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
}
