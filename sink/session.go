package sink

import (
	"bytes"
	"cmp"
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgproto3"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/paystream/paystream/internal/statelog"
)

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
