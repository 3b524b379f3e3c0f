// Package payment is paystream's payment state machine: pure, deterministic and
// free of I/O. Given a payment's current State and one normalized Fact from a
// gateway, Machine.Apply decides whether the fact is a real change (a
// Transition, with the ledger postings it implies) or is ignored or deferred,
// so that any permutation and duplication of a payment's facts converges to the
// same state and the same ledger balances.
package payment

import "time"

// Status is a payment's normalized status.
type Status string

// The normalized statuses. Every provider driver maps its gateway's event
// types onto these.
const (
	StatusPending           Status = "pending"
	StatusAuthorized        Status = "authorized"
	StatusPaid              Status = "paid"
	StatusFailed            Status = "failed"
	StatusCanceled          Status = "canceled"
	StatusRefunded          Status = "refunded"
	StatusPartiallyRefunded Status = "partially_refunded"
	StatusDisputed          Status = "disputed"
	StatusDisputeWon        Status = "dispute_won"
	StatusDisputeLost       Status = "dispute_lost"
)

// Fact is what one authentic provider event asserts about a payment, already
// normalized by its driver. Amounts are integer minor units of Currency.
type Fact struct {
	// Status is the status the event asserts the payment has reached.
	Status Status
	// AmountMinor is the payment's amount for status facts, or the refunded
	// amount for a refund fact. Zero when the event carries no amount.
	AmountMinor int64
	// Currency is the ISO 4217 code of AmountMinor. Empty when unknown.
	Currency string
	// RefundID identifies one refund. Set on additive refund facts (partial or
	// full refunds that carry their own id): each RefundID is applied once,
	// whatever its timestamp.
	RefundID string
	// OccurredAt is when the gateway says the fact happened.
	OccurredAt time.Time
}

// Outcome is what Machine.Apply decided about a Fact.
type Outcome string

// Outcomes.
const (
	// OutcomeApplied means the fact changed the payment: Decision.Transition is set.
	OutcomeApplied Outcome = "processed"
	// OutcomeIgnored means the fact changes nothing; Decision.Reason says why.
	OutcomeIgnored Outcome = "ignored"
	// OutcomeDeferred means the fact needs a predecessor the payment has not
	// reached yet; it is kept and re-offered after the next transition.
	OutcomeDeferred Outcome = "deferred"
)

// Reasons attached to ignored and deferred decisions.
const (
	ReasonDuplicateFact     = "duplicate_fact"
	ReasonStale             = "stale"
	ReasonNeedsPredecessor  = "needs_predecessor"
	ReasonCurrencyMismatch  = "currency_mismatch"
	ReasonRefundExceedsPaid = "refund_exceeds_captured"
)
