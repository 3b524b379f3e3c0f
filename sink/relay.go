// Package sink relays the payment-state events the processor writes into
// Postgres's write-ahead log (logical decoding messages, see package
// statelog) to the normalized topic, exactly once for read_committed
// consumers.
//
// The Relay reads the messages from a logical replication slot, one per
// schema (SlotName). Only one connection can stream a slot: the relay that
// holds it is the active one, other replicas are standbys that retry it.
// Whole Postgres transactions, in commit order, go into one Kafka
// transaction together with a checkpoint record — the WAL position they
// reach — on a small compacted topic; the slot is confirmed to Postgres
// only after the Kafka commit. A relay that takes over fences its
// predecessor's transactional producer, reads the committed checkpoint and
// skips what the slot sends again below it. So a consumer reading with
// isolation.level=read_committed sees every event id
// "{payment key}:{version}" once, each payment's events in order on one
// partition, and nothing from a rolled-back Postgres transaction.
//
// The slot makes Postgres keep WAL until the relay confirms it: a relay
// down for long holds back WAL up to the server's max_slot_wal_keep_size,
// past which Postgres invalidates the slot. The active relay emits a small
// heartbeat message every HeartbeatInterval so the slot moves on a quiet
// database too.
package sink

import (
	"bytes"
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgproto3"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/sr"

	"github.com/paystream/paystream/internal/envelope"
	"github.com/paystream/paystream/internal/retry"
	"github.com/paystream/paystream/internal/statelog"
)

// Config configures a Relay.
type Config struct {
	// Brokers are the Kafka seed brokers. Required.
	Brokers []string
	// Topic is the normalized topic. Defaults to paystream.payments.state.v1.
	Topic string
	// LatestTopic, when set, is the compacted latest-state topic: every
	// Kafka transaction also writes there the newest state event of each
	// payment it carries, so the topic is exactly as consistent as the
	// state topic. Run creates it (compacted, with the state topic's
	// partitions) when missing. Defaults to "": none.
	LatestTopic string
	// CheckpointTopic holds, per relay identity, the WAL position the committed
	// Kafka transactions reached. Run creates it (compacted, one
	// partition) when missing. Defaults to DefaultCheckpointTopic.
	CheckpointTopic string
	// Slot is the logical replication slot, and publication, the relay
	// reads. Defaults to SlotName of the pool's current database and
	// schema, or the slot an earlier relay of this database named after the
	// schema alone, if there is one.
	Slot string
	// TransactionalID is the Kafka transactional id; a relay that takes
	// the slot over fences the producer of the one before with it.
	// Defaults to the relay's Identity.TransactionalID.
	TransactionalID string
	// Deployment names the deployment in the relay's Kafka identity (its
	// transactional id and checkpoint key), beside the database's: set it
	// when two environments share a Kafka cluster and their databases may
	// share a Postgres system identifier (one cloned from the other's
	// backup). Defaults to none.
	Deployment string
	// MaxBatchEvents caps the state events of one Kafka transaction; a
	// Postgres transaction is never split, so one with more events goes
	// alone. Defaults to 5000.
	MaxBatchEvents int
	// MaxBatchDelay is how long the relay gathers committed Postgres
	// transactions before publishing them in one Kafka transaction.
	// Defaults to 20ms.
	MaxBatchDelay time.Duration
	// StatusInterval is how often the relay reports its position to
	// Postgres when it has nothing new to report; keep it well below the
	// server's wal_sender_timeout. Defaults to 10s.
	StatusInterval time.Duration
	// HeartbeatInterval is how often the active relay emits a heartbeat
	// message, so the slot's position moves and WAL is recycled on a quiet
	// database, and refreshes paystream_sink_slot_lag_bytes. Defaults to 10s.
	HeartbeatInterval time.Duration
	// StandbyRetry is how often a standby tries to take the slot. Defaults
	// to 1s.
	StandbyRetry time.Duration
	// LostSlotRetry is how often a relay whose slot is lost (ErrSlotLost)
	// checks whether `paystream republish` recreated it. Defaults to 10s.
	LostSlotRetry time.Duration
	// TransactionTimeout is the Kafka transaction timeout, and bounds
	// flushing and committing one. Defaults to 30s.
	TransactionTimeout time.Duration
	// StateFormat is the encoding of the state values on Topic and
	// LatestTopic: FormatJSON, the processor's JSON as it is, or
	// FormatAvro, which registers schemas/payment-state.v1.avsc with
	// SchemaRegistry under each topic's "<topic>-value" subject (setting
	// its compatibility to BACKWARD) and writes the Confluent wire format.
	// Defaults to FormatJSON.
	StateFormat Format
	// SchemaRegistry is the Schema Registry client of FormatAvro.
	// Required with it.
	SchemaRegistry *sr.Client
	// KafkaOpts are extra franz-go options, given to every Kafka client.
	KafkaOpts []kgo.Opt
	// KafkaClientOpts, when set, returns more options for one Kafka client
	// of the relay, named by its role (ClientRelay, ClientCheckpoint,
	// ClientAdmin). It is called each time such a client is created: the
	// place for per-client hooks such as kprom metrics, which two clients
	// alive at once cannot share.
	KafkaClientOpts func(client string) []kgo.Opt
	// Logger defaults to slog.Default().
	Logger *slog.Logger
	// Registerer receives the relay's metrics. Defaults to a private registry.
	Registerer prometheus.Registerer
}

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

// New validates cfg and returns a Relay on pool's database
// and schema.
func New(pool *pgxpool.Pool, cfg Config) (*Relay, error) {
	if pool == nil {
		return nil, errors.New("sink: pool is required")
	}
	if len(cfg.Brokers) == 0 {
		return nil, errors.New("sink config: Brokers is required")
	}
	if cfg.Topic == "" {
		cfg.Topic = envelope.TopicState
	}
	if cfg.CheckpointTopic == "" {
		cfg.CheckpointTopic = DefaultCheckpointTopic
	}
	if len(cfg.Slot) > maxIdentifier {
		return nil, fmt.Errorf("sink config: Slot %q is longer than %d bytes", cfg.Slot, maxIdentifier)
	}
	if cfg.MaxBatchEvents == 0 {
		cfg.MaxBatchEvents = 5000
	}
	defaults := []struct {
		name string
		d    *time.Duration
		def  time.Duration
	}{
		{"MaxBatchDelay", &cfg.MaxBatchDelay, 20 * time.Millisecond},
		{"StatusInterval", &cfg.StatusInterval, 10 * time.Second},
		{"HeartbeatInterval", &cfg.HeartbeatInterval, 10 * time.Second},
		{"StandbyRetry", &cfg.StandbyRetry, time.Second},
		{"LostSlotRetry", &cfg.LostSlotRetry, 10 * time.Second},
		{"TransactionTimeout", &cfg.TransactionTimeout, 30 * time.Second},
	}
	for _, d := range defaults {
		if *d.d == 0 {
			*d.d = d.def
		}
		if *d.d < 0 {
			return nil, fmt.Errorf("sink config: %s %s must be positive", d.name, *d.d)
		}
	}
	if cfg.MaxBatchEvents < 0 {
		return nil, fmt.Errorf("sink config: MaxBatchEvents %d must be positive", cfg.MaxBatchEvents)
	}
	if _, err := ParseFormat(string(cfg.StateFormat)); err != nil {
		return nil, fmt.Errorf("sink config: StateFormat: %w", err)
	}
	if cfg.StateFormat == FormatAvro && cfg.SchemaRegistry == nil {
		return nil, errors.New("sink config: SchemaRegistry is required with StateFormat avro")
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.Registerer == nil {
		cfg.Registerer = prometheus.NewRegistry()
	}
	m, err := newMetrics(cfg.Registerer)
	if err != nil {
		return nil, err
	}
	return &Relay{cfg: cfg, pool: pool, log: cfg.Logger, metrics: m}, nil
}

// The roles of a Relay's Kafka clients, as Config.KafkaClientOpts names them.
// Clients of different roles can be alive at once; two of one role never are.
const (
	// ClientRelay is the active relay's transactional producer; it lives
	// as long as the relay holds the slot.
	ClientRelay = "relay"
	// ClientCheckpoint reads the committed checkpoint back when the relay
	// takes the slot, and is closed once it has.
	ClientCheckpoint = "checkpoint"
	// ClientAdmin creates the checkpoint topic when it is missing and lists
	// its offsets before the checkpoint is read; short-lived.
	ClientAdmin = "admin"
)

// kafkaOpts returns the options of a new Kafka client of role client:
// KafkaOpts, the seed brokers, KafkaClientOpts(client) and extra.
func (r *Relay) kafkaOpts(client string, extra ...kgo.Opt) []kgo.Opt {
	opts := append(append([]kgo.Opt{}, r.cfg.KafkaOpts...), kgo.SeedBrokers(r.cfg.Brokers...))
	if r.cfg.KafkaClientOpts != nil {
		opts = append(opts, r.cfg.KafkaClientOpts(client)...)
	}
	return append(opts, extra...)
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

	cl, err := kgo.NewClient(r.kafkaOpts(ClientRelay,
		kgo.TransactionalID(r.cfg.TransactionalID),
		kgo.TransactionTimeout(r.cfg.TransactionTimeout),
		kgo.RequiredAcks(kgo.AllISRAcks()),
		kgo.ProducerLinger(0),
		kgo.RecordPartitioner(kgo.StickyKeyPartitioner(nil)),
	)...)
	if err != nil {
		return fmt.Errorf("kafka client: %w", err)
	}
	defer cl.Close()
	// Initializing the producer id bumps the transactional id's epoch:
	// the previous relay's open transaction is aborted and its producer
	// fenced, so nothing it has in flight can commit after we read the
	// checkpoint.
	if _, _, err := cl.ProducerID(ctx); err != nil {
		return fmt.Errorf("fence previous relay (init producer id): %w", err)
	}
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

// keepOnStandbys makes the slot a failover slot on Postgres 17 and later
// (one created by an earlier relay is not), over conn, the replication
// connection about to stream it, and says when the server does not hold
// decoding back for its standbys (synchronized_standby_slots): a promoted
// standby then has the slot, but may lack commits the relay published.
func (r *Relay) keepOnStandbys(ctx context.Context, conn *pgconn.PgConn) error {
	failover, err := failoverSlots(ctx, r.pool)
	if err != nil || !failover {
		return err
	}
	var isFailover bool
	var standbys string
	err = r.pool.QueryRow(ctx, `SELECT failover, current_setting('synchronized_standby_slots')
		  FROM pg_replication_slots WHERE slot_name = $1`, r.cfg.Slot).Scan(&isFailover, &standbys)
	if err != nil {
		return fmt.Errorf("look up slot %s: %w", r.cfg.Slot, err)
	}
	if !isFailover {
		err := conn.Exec(ctx, "ALTER_REPLICATION_SLOT "+r.cfg.Slot+" (FAILOVER true)").Close()
		if isSQLState(err, sqlstateObjectInUse) {
			return errSlotBusy
		}
		if err != nil {
			return fmt.Errorf("make slot %s a failover slot: %w", r.cfg.Slot, err)
		}
		r.log.Info("slot is now a failover slot: standbys with sync_replication_slots keep it", "slot", r.cfg.Slot)
	}
	if standbys == "" {
		r.log.Info("synchronized_standby_slots is empty: a promoted standby keeps the slot but may lack commits already published "+
			"(repeats for consumers); name the standbys' physical slots there (docs/operations.md, \"Postgres failover\")", "slot", r.cfg.Slot)
	}
	return nil
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

// session is one leadership: a streaming replication connection and a
// transactional producer.
type session struct {
	r        *Relay
	conn     *pgconn.PgConn
	cl       *kgo.Client
	systemID string
	timeline int32

	// ckpt is the newest checkpoint committed in Kafka.
	ckpt checkpoint
	// confirmed is the position last reported to the slot; nextStatus is
	// when to report it again.
	confirmed  pglogrepl.LSN
	nextStatus time.Time

	// The Postgres transaction being decoded.
	inTxn   bool
	txn     []*kgo.Record
	txnTime time.Time // its commit time
	// txnCETime is txnTime as the ce_time of its records.
	txnCETime []byte

	// Committed Postgres transactions waiting for a Kafka transaction:
	// their records, the end LSN and commit time of the last of them, and
	// when the first arrived.
	pending     []*kgo.Record
	pendingEnd  pglogrepl.LSN
	pendingTime time.Time
	pendingAt   time.Time
}

// run streams until ctx ends or something fails.
func (s *session) run(ctx context.Context) error {
	cfg := s.r.cfg
	for {
		now := time.Now()
		if len(s.pending) > 0 && !now.Before(s.pendingAt.Add(cfg.MaxBatchDelay)) {
			if err := s.publish(ctx); err != nil {
				return err
			}
			continue
		}
		if !now.Before(s.nextStatus) {
			if err := s.confirm(s.confirmed, time.Time{}); err != nil {
				return err
			}
		}
		deadline := s.nextStatus
		if flushAt := s.pendingAt.Add(cfg.MaxBatchDelay); len(s.pending) > 0 && flushAt.Before(deadline) {
			deadline = flushAt
		}
		rctx, cancel := context.WithDeadline(ctx, deadline)
		msg, err := s.conn.ReceiveMessage(rctx)
		cancel()
		switch {
		case ctx.Err() != nil:
			return nil
		case err != nil && pgconn.Timeout(err):
			continue
		case err != nil:
			return fmt.Errorf("receive from slot: %w", err)
		}
		switch msg := msg.(type) {
		case *pgproto3.CopyData:
			if err := s.handle(ctx, msg.Data); err != nil {
				return err
			}
		case *pgproto3.ErrorResponse:
			return fmt.Errorf("replication stream: %w", pgconn.ErrorResponseToPgError(msg))
		}
	}
}

// handle processes one message of the replication stream.
func (s *session) handle(ctx context.Context, data []byte) error {
	if len(data) == 0 {
		return nil
	}
	switch data[0] {
	case pglogrepl.PrimaryKeepaliveMessageByteID:
		pkm, err := pglogrepl.ParsePrimaryKeepaliveMessage(data[1:])
		if err != nil {
			return fmt.Errorf("parse keepalive: %w", err)
		}
		if pkm.ReplyRequested {
			s.nextStatus = time.Time{}
		}
		// The server has sent everything before ServerWALEnd. With no
		// transaction half decoded and nothing waiting for Kafka, none of
		// it is ours to publish (rolled-back transactions, other schemas'
		// messages, WAL that decodes to nothing), so the slot may move
		// there. Confirming only commit positions would leave it behind
		// for good when the WAL ends in anything else — and a Postgres
		// shutdown waits for each walsender to see everything it sent
		// confirmed, until wal_sender_timeout (a minute by default).
		if !s.inTxn && len(s.pending) == 0 && pkm.ServerWALEnd > s.confirmed {
			s.confirmed = pkm.ServerWALEnd
			if pkm.ReplyRequested {
				return s.confirm(s.confirmed, time.Time{})
			}
		}
		return nil
	case pglogrepl.XLogDataByteID:
		xld, err := pglogrepl.ParseXLogData(data[1:])
		if err != nil {
			return fmt.Errorf("parse xlog data: %w", err)
		}
		m, err := pglogrepl.Parse(xld.WALData)
		if err != nil {
			return fmt.Errorf("parse pgoutput message at %s: %w", xld.WALStart, err)
		}
		return s.decoded(ctx, m)
	}
	return nil
}

// decoded processes one pgoutput message.
func (s *session) decoded(ctx context.Context, m pglogrepl.Message) error {
	switch m := m.(type) {
	case *pglogrepl.BeginMessage:
		s.inTxn, s.txn, s.txnTime = true, s.txn[:0], m.CommitTime
		s.txnCETime = ceTime(m.CommitTime)
	case *pglogrepl.LogicalDecodingMessage:
		if m.Prefix != s.r.prefix {
			return nil // another schema's, a heartbeat, anyone else's
		}
		if !m.Transactional || !s.inTxn {
			s.r.log.Warn("ignoring a non-transactional state message", "lsn", m.LSN)
			return nil
		}
		// The stream's buffer is reused by the next receive: the records
		// keep their own copy. A message holds one event (format 1) or
		// all of its transaction's (format 2): either way the events join
		// the transaction's records, which are published together or not
		// at all, so a crash in the middle of a message's events resumes
		// from the checkpoint before its transaction like any other.
		events, err := statelog.DecodeMessage(bytes.Clone(m.Content))
		if err != nil {
			// A frame this relay cannot read (a newer format?) must not be
			// skipped: stop here, every restart stops here too, until a
			// relay that reads it runs.
			return fmt.Errorf("state message at %s: %w", m.LSN, err)
		}
		for _, ev := range events {
			key := []byte(ev.Key)
			rec := &kgo.Record{Topic: s.r.cfg.Topic, Key: key, Value: ev.Payload}
			rec.Headers = stateHeaders([]byte(ev.EventID()), key, s.txnCETime, s.r.ceSource, len(ev.Headers))
			for _, h := range ev.Headers {
				rec.Headers = append(rec.Headers, kgo.RecordHeader{Key: h.Key, Value: h.Value})
			}
			if err := s.r.enc.encode(rec); err != nil {
				// Like an unreadable frame: never skipped.
				return fmt.Errorf("state message at %s: %w", m.LSN, err)
			}
			s.txn = append(s.txn, rec)
		}
	case *pglogrepl.CommitMessage:
		s.inTxn = false
		end := m.TransactionEndLSN
		switch {
		case end <= s.ckpt.LSN:
			// Published before the last relay could confirm it.
			if len(s.txn) > 0 {
				s.r.metrics.skipped.Inc()
			}
		case len(s.txn) == 0 && len(s.pending) == 0:
			// Nothing of ours and nothing waiting: the slot may move past
			// it at once (heartbeats, other schemas' transactions).
			if end > s.confirmed {
				return s.confirm(end, m.CommitTime)
			}
		default:
			if len(s.pending) == 0 {
				s.pendingAt = time.Now()
			}
			s.pending = append(s.pending, s.txn...)
			s.pendingEnd, s.pendingTime = end, m.CommitTime
		}
		s.txn = s.txn[:0]
		if len(s.pending) >= s.r.cfg.MaxBatchEvents {
			return s.publish(ctx)
		}
	}
	return nil
}

// publish sends the pending transactions' records and the checkpoint of
// the last of them in one Kafka transaction and, once it committed,
// confirms the slot up to there.
func (s *session) publish(ctx context.Context) error {
	ckpt := checkpoint{LSN: s.pendingEnd, SystemID: s.systemID, Timeline: s.timeline, CommitTime: s.pendingTime}
	ckptRec, err := checkpointRecord(s.r.cfg.CheckpointTopic, s.r.id.Key(), ckpt)
	if err != nil {
		return err
	}
	// Not canceled with ctx: a commit cut short has an unknown outcome.
	tctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), s.r.cfg.TransactionTimeout)
	defer cancel()
	start := time.Now()
	if err := s.cl.BeginTransaction(); err != nil {
		return fmt.Errorf("begin kafka transaction: %w", err)
	}
	var (
		mu       sync.Mutex
		firstErr error
	)
	promise := func(_ *kgo.Record, err error) {
		if err != nil {
			mu.Lock()
			firstErr = cmp.Or(firstErr, err)
			mu.Unlock()
		}
	}
	for i, rec := range s.pending {
		s.cl.Produce(tctx, rec, promise)
		if hook := s.r.midPublish; hook != nil {
			if err := hook(i + 1); err != nil {
				// As a crash once the broker has the records: the
				// transaction stays open until the next session fences it.
				_ = s.cl.Flush(tctx)
				return err
			}
		}
	}
	for _, rec := range latestRecords(s.r.cfg.LatestTopic, s.pending, s.r.enc) {
		s.cl.Produce(tctx, rec, promise)
	}
	s.cl.Produce(tctx, ckptRec, promise)
	err = s.cl.Flush(tctx)
	mu.Lock()
	err = cmp.Or(err, firstErr)
	mu.Unlock()
	if err != nil {
		s.abort(tctx)
		return s.fenced(ctx, fmt.Errorf("produce state events: %w", err))
	}
	if err := s.cl.EndTransaction(tctx, kgo.TryCommit); err != nil {
		s.abort(tctx)
		return s.fenced(ctx, fmt.Errorf("commit kafka transaction: %w", err))
	}
	s.r.metrics.txnSeconds.Observe(time.Since(start).Seconds())
	s.r.metrics.published.Add(float64(len(s.pending)))
	s.ckpt = ckpt
	if hook := s.r.afterCommit; hook != nil {
		if err := hook(ckpt.LSN); err != nil {
			return err
		}
	}
	end, at := s.pendingEnd, s.pendingTime
	clear(s.pending)
	s.pending = s.pending[:0]
	return s.confirm(end, at)
}

// fenced returns err, or an *IdentityCollisionError when err says the
// producer was fenced while this session still holds the slot: no relay of
// this deployment can have taken over (taking over starts with the slot),
// so another deployment uses the same transactional id.
func (s *session) fenced(ctx context.Context, err error) error {
	if !errors.Is(err, kerr.ProducerFenced) && !errors.Is(err, kerr.InvalidProducerEpoch) {
		return err
	}
	var active *uint32
	qctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer cancel()
	if qerr := s.r.pool.QueryRow(qctx, `SELECT active_pid FROM pg_replication_slots WHERE slot_name = $1`,
		s.r.cfg.Slot).Scan(&active); qerr != nil || active == nil || *active != s.conn.PID() {
		return err // the slot is someone else's now, or unknown: a takeover
	}
	return &IdentityCollisionError{TransactionalID: s.r.cfg.TransactionalID, Slot: s.r.cfg.Slot, Err: err}
}

// abort ends the open Kafka transaction without committing it. The
// session ends after it either way: the next one fences this producer and
// starts from the checkpoint.
func (s *session) abort(ctx context.Context) {
	s.r.metrics.aborted.Inc()
	if err := s.cl.AbortBufferedRecords(ctx); err != nil {
		s.r.log.Warn("abort buffered records", "error", err)
	}
	if err := s.cl.EndTransaction(ctx, kgo.TryAbort); err != nil {
		s.r.log.Warn("abort kafka transaction", "error", err)
	}
}

// confirm reports lsn to the slot as written and flushed (a position at or
// below the last one reports the last one again): Postgres may then
// recycle the WAL before it. commitTime, when known, is the commit time of
// the transaction ending at lsn, for paystream_sink_slot_lag_seconds.
func (s *session) confirm(lsn pglogrepl.LSN, commitTime time.Time) error {
	s.confirmed = max(s.confirmed, lsn)
	err := pglogrepl.SendStandbyStatusUpdate(context.Background(), s.conn, pglogrepl.StandbyStatusUpdate{
		WALWritePosition: s.confirmed,
	})
	if err != nil {
		return fmt.Errorf("confirm slot position %s: %w", s.confirmed, err)
	}
	if !commitTime.IsZero() {
		s.r.metrics.lagSeconds.Set(max(0, time.Since(commitTime).Seconds()))
	}
	s.nextStatus = time.Now().Add(s.r.cfg.StatusInterval)
	return nil
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
