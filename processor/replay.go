package processor

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/paystream/paystream/internal/payment"
	"github.com/paystream/paystream/internal/store"
	"github.com/paystream/paystream/internal/tracing"
)

// ErrNotHeld is returned by Replay for a payment that has nothing to replay.
var ErrNotHeld = errors.New("payment is not held and has no quarantined events")

// ErrOutcomeChanged is returned when a delivery's outcome was about to be
// rewritten but the row no longer has the status it was read with: another
// writer (a partition's worker or sweeper, another replay) decided it
// meanwhile. The transaction is rolled back; nothing was written.
var ErrOutcomeChanged = store.ErrOutcomeChanged

// replayLockTimeout bounds Replay's wait for the partitions' offset rows
// (batch transactions in flight; a frozen owner's until its session ends).
const replayLockTimeout = 10 * time.Second

// replayStatementTimeout bounds each statement of Replay's transaction, as
// commitTimeout does a batch's.
const replayStatementTimeout = commitTimeout

// ReplayReport says what a replay did.
type ReplayReport struct {
	PaymentKey string
	// Replayed counts the events re-driven, by outcome.
	Replayed map[string]int
	// Skipped are the delivery ids marked ignored on the operator's word.
	Skipped []int64
}

// ReplayOptions tune Replay.
type ReplayOptions struct {
	// Skip lists quarantined delivery ids to give up on (marked ignored with
	// reason skipped_by_operator) instead of re-driving, for events that
	// can never apply (an undecodable record).
	Skip []int64
	// Now is the clock. Defaults to time.Now.
	Now func() time.Time
	// IdleInTransactionTimeout is how long Postgres keeps Replay's
	// transaction open while Replay sends nothing (the operator's shell
	// suspended, its network cut): then it ends the session, releasing the
	// offset rows of every partition, which Replay locks. Negative leaves
	// the server's setting. Defaults to 5s, the processor's default.
	IdleInTransactionTimeout time.Duration
}

// withDefaults returns o with each field left at its zero value set to the
// default its comment states.
func (o ReplayOptions) withDefaults() ReplayOptions {
	if o.Now == nil {
		o.Now = time.Now
	}
	o.IdleInTransactionTimeout = cmp.Or(o.IdleInTransactionTimeout, 5*time.Second)
	return o
}

// Replay re-drives a held payment after the cause of its quarantine was
// fixed: in one transaction it releases the hold and applies the payment's
// quarantined events and the events deferred while it was held, in arrival
// order, through the same machine and writes as the processor — so each
// applies exactly once. If an event still fails, nothing changes and the
// error names it.
//
// Replay runs outside the consumer group, so it holds no partition epoch:
// it locks every partition's offset row for its transaction (so no worker
// or sweeper writes meanwhile; they wait for it, at most a short
// transaction) and writes each delivery outcome only if the row still has
// the status it was read with. If one changed meanwhile, Replay rolls
// back and returns ErrOutcomeChanged; running it again sees the new state.
// It waits at most replayLockTimeout for batches in flight, and its
// transaction has a batch's server-side bounds (statement_timeout,
// idle_in_transaction_session_timeout), so a replay that freezes holding
// every partition's row is ended by Postgres, not left stalling them all.
func Replay(ctx context.Context, pool *pgxpool.Pool, paymentKey string, opts ReplayOptions) (ReplayReport, error) {
	opts = opts.withDefaults()
	bounds := store.Bounds{IdleInTransaction: max(opts.IdleInTransactionTimeout, 0), Statement: replayStatementTimeout}
	report := ReplayReport{PaymentKey: paymentKey, Replayed: map[string]int{}}
	skip := map[int64]bool{}
	for _, id := range opts.Skip {
		skip[id] = true
	}
	a := &applier{now: opts.Now}
	// Replay has no partition of its own: it excludes every worker and
	// sweeper for its transaction, so it reads the payment, its hold and
	// its waiting events as the last writer committed them, and no batch
	// decides an event of the payment meanwhile (see store.Reads).
	tx, err := store.BeginBatch(ctx, pool, store.BatchLock{AllPartitions: true, LockTimeout: replayLockTimeout, Bounds: bounds},
		store.Reads{Payments: []string{paymentKey}, Held: paymentKey})
	if err != nil {
		return ReplayReport{}, err
	}
	defer tx.Rollback(ctx) //nolint:errcheck // after Commit, or on the way out of a failure
	rows := tx.Loaded.Held
	if !tx.Loaded.IsHeld && len(rows) == 0 {
		return ReplayReport{}, ErrNotHeld
	}
	payments := map[string]*paymentRow{paymentKey: {key: paymentKey}}
	loadedPayments(tx.Loaded.Payments, payments)
	p := payments[paymentKey]
	if err := tx.ReleaseHold(ctx, paymentKey); err != nil {
		return ReplayReport{}, err
	}
	p.held = false

	headers := tracing.StateHeaders(ctx)
	var ds []delivery
	for _, r := range rows {
		if skip[r.ID] {
			o := store.Outcome{ID: r.ID, PaymentKey: paymentKey, Status: store.StatusIgnored, Reason: "skipped_by_operator", Expected: r.Status}
			if err := tx.SetOutcome(ctx, o); err != nil {
				return ReplayReport{}, fmt.Errorf("skip delivery %d: %w", r.ID, err)
			}
			report.Skipped = append(report.Skipped, r.ID)
			continue
		}
		if r.DuplicateOf != nil {
			// A redelivery of an event whose first delivery is stored.
			o := store.Outcome{ID: r.ID, PaymentKey: paymentKey, Status: store.StatusIgnored, Reason: reasonDuplicateEvent, Expected: r.Status}
			if err := tx.SetOutcome(ctx, o); err != nil {
				return ReplayReport{}, fmt.Errorf("settle duplicate delivery %d: %w", r.ID, err)
			}
			report.Replayed[string(payment.OutcomeIgnored)]++
			continue
		}
		env, err := r.Envelope()
		if err != nil {
			return ReplayReport{}, fmt.Errorf("delivery %d still cannot be decoded (skip it with --skip %d): %w", r.ID, r.ID, err)
		}
		if env.PaymentKey != paymentKey {
			return ReplayReport{}, fmt.Errorf("delivery %d belongs to %s", r.ID, env.PaymentKey)
		}
		if p.source == "" {
			p.source, p.paymentID = env.Source, env.Event.PaymentID
		}
		ds = append(ds, delivery{env: env, inboxID: r.ID, status: r.Status, headers: headers})
	}
	if len(ds) > 0 {
		// The re-driven deliveries are decided here, not re-offered as
		// waiting.
		redriven := map[int64]bool{}
		for _, d := range ds {
			redriven[d.inboxID] = true
		}
		p.waiting = slices.DeleteFunc(p.waiting, func(w waiting) bool { return redriven[w.inboxID] })
		w, results, err := a.decide(ds, payments)
		if err == nil {
			err = tx.Write(ctx, w)
		}
		if errors.Is(err, ErrOutcomeChanged) {
			return ReplayReport{}, err
		}
		if err != nil {
			return ReplayReport{}, fmt.Errorf("replay still fails: %w", err)
		}
		for _, r := range results {
			report.Replayed[r.outcome]++
		}
	}
	if err := tx.Commit(ctx); err != nil {
		return ReplayReport{}, err
	}
	return report, nil
}

// HeldPayment is a payment waiting for a replay.
type HeldPayment = store.HeldPayment

// ListHeld lists held payments, oldest hold first.
func ListHeld(ctx context.Context, pool *pgxpool.Pool) ([]HeldPayment, error) {
	return store.ListHeld(ctx, pool)
}
