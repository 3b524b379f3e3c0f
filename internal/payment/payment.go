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
	Status Status `json:"status"`
	// AmountMinor is the payment's amount for status facts (for paid, the
	// captured amount), the refund's amount for a refund fact with a
	// RefundID, or the disputed amount for a dispute fact. Zero when the
	// event carries no amount. It is not read for a refunded fact without
	// RefundID, which means "refunded in full", nor for dispute_won and
	// dispute_lost. See the package comment.
	AmountMinor int64 `json:"amount_minor"`
	// Currency is the ISO 4217 code of AmountMinor. Empty when unknown.
	Currency string `json:"currency"`
	// RefundID identifies one refund. Set on additive refund facts (partial or
	// full refunds that carry their own id): each RefundID is applied once,
	// whatever its timestamp.
	RefundID string `json:"refund_id,omitempty"`
	// OccurredAt is when the gateway says the fact happened.
	OccurredAt time.Time `json:"occurred_at"`
}

// Outcome is what Machine.Apply decided about a Fact.
type Outcome string

// Outcomes.
const (
	// OutcomeApplied means the fact changed the payment: Decision.Transitions
	// holds at least one Transition.
	OutcomeApplied Outcome = "processed"
	// OutcomeIgnored means the fact changes nothing; Decision.Reason says why.
	OutcomeIgnored Outcome = "ignored"
	// OutcomeDeferred means the fact cannot apply yet: it needs a
	// predecessor the payment has not reached, or an amount it lacks
	// (Decision.Reason says which). It is kept and offered again after every
	// transition of the payment (Machine.Resume).
	OutcomeDeferred Outcome = "deferred"
)

// Reasons attached to ignored and deferred decisions. They are stored in the
// inbox and used as metric labels.
const (
	// ReasonDuplicateFact (ignored): the payment already records what the
	// fact asserts and is in the status the fact names, e.g. Asaas
	// PAYMENT_RECEIVED after PAYMENT_CONFIRMED; or the fact is a refund the
	// payment already holds (refund facts are never stale).
	ReasonDuplicateFact = "duplicate_fact"
	// ReasonStale (ignored): the payment already records what the fact
	// asserts and has moved past it, e.g. pending after paid.
	ReasonStale = "stale"
	// ReasonNeedsPredecessor (deferred): the fact needs a state the payment
	// has not reached: a refund or dispute before paid, a dispute outcome
	// before the dispute.
	ReasonNeedsPredecessor = "needs_predecessor"
	// ReasonCurrencyMismatch (ignored): the fact's currency differs from the
	// payment's.
	ReasonCurrencyMismatch = "currency_mismatch"
	// ReasonRefundExceedsPaid (ignored): the refunds with known amounts
	// would add up to more than the captured amount.
	ReasonRefundExceedsPaid = "refund_exceeds_captured"
	// ReasonAmountUnknown (deferred): money would move but the fact carries
	// no amount (or no currency and the payment has none): a paid fact
	// without amount, a partially_refunded fact with a RefundID but no
	// amount, a dispute without amount. The machine never guesses an
	// amount; a fact carrying it (or a refetch) resolves it.
	ReasonAmountUnknown = "amount_unknown"
	// ReasonMissingRefundID (deferred): a partially_refunded fact without
	// RefundID on a payment with no refund yet. Partial refunds are only
	// applied by id; the refund facts that carry ids (or a refetch)
	// resolve it, after which it is ignored.
	ReasonMissingRefundID = "missing_refund_id"
	// ReasonAmountMismatch (ignored): the fact repeats a capture or a refund
	// id the payment records, with a different amount. The first amount
	// stands; the mismatch is worth an alert.
	ReasonAmountMismatch = "amount_mismatch"
	// ReasonInvalidFact (ignored): the fact is malformed: unknown status,
	// negative amount or above MaxAmountMinor, or a currency that is not
	// three upper-case letters. A driver bug; the processor may treat it as
	// poison.
	ReasonInvalidFact = "invalid_fact"
)

// Transition kinds (Transition.Kind). What Transition.AmountMinor means
// depends on the kind.
const (
	// KindStatus is a status change that moves no money (pending,
	// authorized, failed, canceled). AmountMinor is the payment's amount,
	// zero when unknown.
	KindStatus = "status"
	// KindDetails records the payment's amount or currency, carried by a
	// status fact that is otherwise a duplicate or stale, when the state
	// did not know them yet (an earlier thin payload). No status change, no
	// money. AmountMinor is the payment's amount.
	KindDetails = "details"
	// KindCapture is the payment reaching paid. AmountMinor is the captured
	// amount.
	KindCapture = "capture"
	// KindRefund moves refunded money. AmountMinor is the amount refunded by
	// this transition (for a full refund, the remainder).
	KindRefund = "refund"
	// KindRefundIdentified records a refund whose money already moved with
	// an earlier full refund (a refunded fact without amount). It moves no
	// money and has no postings; AmountMinor is the refund's own amount,
	// zero when unknown.
	KindRefundIdentified = "refund_identified"
	// KindDispute opens a dispute: the disputed amount (AmountMinor) moves
	// from the merchant into the dispute reserve.
	KindDispute = "dispute"
	// KindDisputeWon closes a dispute in the merchant's favor: the reserve
	// goes back to the merchant.
	KindDisputeWon = "dispute_won"
	// KindDisputeLost closes a dispute against the merchant: the disputed
	// amount leaves through the gateway.
	KindDisputeLost = "dispute_lost"
)

// FullRefundID is the refund id recorded for a refunded fact that carries no
// RefundID: "refunded in full", applied once.
const FullRefundID = "full"

// MaxAmountMinor is the largest amount a Fact may carry: 2^53-1, the largest
// integer every JSON consumer (including float64 ones) reads exactly. Larger
// amounts are ignored as ReasonInvalidFact.
const MaxAmountMinor int64 = 1<<53 - 1
