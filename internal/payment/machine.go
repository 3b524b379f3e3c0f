package payment

import (
	"time"

	"github.com/paystream/paystream/internal/ledger"
)

// State is everything the machine needs to know about one payment. The store
// persists it whole (as JSON) next to a few indexed columns, so fields may be
// added freely; the zero State is a payment never seen before.
//
// Every field but Version and LastEventAt is a function of the set of facts
// applied, whatever their order: see Equivalent.
type State struct {
	// Status is derived from the other fields: see the package comment's
	// "Status" section.
	Status Status `json:"status"`
	// Version counts the payment's transitions: the last Transition's
	// Version, zero for a payment never seen.
	Version int64 `json:"version"`
	// AmountMinor is the payment's amount: once paid, the captured amount;
	// before, the amount said by the most advanced status fact applied that
	// carried one (or by any status fact, if those did not). Zero when no
	// fact said it.
	AmountMinor int64 `json:"amount_minor"`
	// Currency is the ISO 4217 code of every amount of the payment, set by
	// the first status fact that names one and never changed.
	Currency string `json:"currency"`
	// CapturedMinor is the amount captured, set when the payment reaches
	// paid; zero before.
	CapturedMinor int64 `json:"captured_minor"`
	// RefundedMinor is the amount refunded so far, never above
	// CapturedMinor: CapturedMinor when FullRefund, else the sum of
	// RefundAmounts.
	RefundedMinor int64 `json:"refunded_minor"`
	// Refunds are the ids of the refunds applied, sorted; FullRefundID for a
	// full refund without id.
	Refunds []string `json:"refunds,omitempty"`
	// RefundAmounts is each refund's amount, for the Refunds whose amount is
	// known. A refund without an amount is a full refund: it covers what
	// the others do not.
	RefundAmounts map[string]int64 `json:"refund_amounts,omitempty"`
	// FullRefund is set while a full refund (a refunded fact without
	// amount) accounts for more than the refunds with known amounts. It is
	// cleared, together with the ids without amount, once the known
	// amounts add up to CapturedMinor.
	FullRefund bool `json:"full_refund,omitempty"`
	// DisputeStatus is the payment's dispute: "" (none), StatusDisputed
	// (open), StatusDisputeWon or StatusDisputeLost.
	DisputeStatus Status `json:"dispute_status,omitempty"`
	// DisputedMinor is the disputed amount, set when the dispute opens.
	DisputedMinor int64 `json:"disputed_minor,omitempty"`
	// LastEventAt is the latest OccurredAt among the facts applied.
	LastEventAt time.Time `json:"last_event_at"`
}

// Transition is one real change of a payment. Side effects (ledger movements,
// the outbox event) belong to transitions, never to events.
type Transition struct {
	// From is the payment's status before, "" for its first transition.
	From Status `json:"from"`
	// To is the payment's status after; it may equal From (a refund while
	// disputed, KindDetails, KindRefundIdentified).
	To Status `json:"to"`
	// Version is the payment's version after the transition: one above the
	// previous transition's, starting at 1.
	Version int64 `json:"version"`
	// Kind names what moved, e.g. "capture", "refund"; it is part of the
	// postings' uniqueness key together with Version. One of the Kind
	// constants, which also say what AmountMinor means.
	Kind string `json:"kind"`
	// AmountMinor is the amount the transition is about; see its Kind.
	AmountMinor int64 `json:"amount_minor"`
	// Currency is the payment's currency; empty only while unknown.
	Currency string `json:"currency"`
	// RefundID is the refund's id for refund kinds (FullRefundID for a full
	// refund without id).
	RefundID string `json:"refund_id,omitempty"`
	// Movements are the money the transition moves (ledger.Movements of
	// the balance differences); empty when no money moves.
	Movements []ledger.Movement `json:"movements,omitempty"`
}

// Postings returns the transition's journal entry as signed postings per
// account (the debit and credit legs of its movements), sorted by account,
// at most one per account and currency.
func (t Transition) Postings() []ledger.Posting {
	b := ledger.Balances(ledger.Postings(t.Movements))
	ps := make([]ledger.Posting, 0, len(b))
	for _, k := range ledger.Keys(b) {
		ps = append(ps, ledger.Posting{Account: k.Account, AmountMinor: b[k], Currency: k.Currency})
	}
	if len(ps) == 0 {
		return nil
	}
	return ps
}

// Decision is Machine.Apply's verdict on one Fact.
type Decision struct {
	// Outcome is applied, ignored or deferred.
	Outcome Outcome
	// Reason explains ignored and deferred outcomes.
	Reason string
	// State is the payment after the decision; equal to the input unless
	// Outcome is OutcomeApplied.
	State State
	// Transitions are the changes the fact caused, in order, each with a
	// version one above the previous. Empty unless Outcome is OutcomeApplied,
	// and never empty when it is.
	Transitions []Transition
}

// Machine applies facts to payment states. Its zero value is ready to use.
type Machine struct{}

// Apply decides what fact f means for a payment in state s: applied (with the
// transitions and their postings), ignored or deferred, with a reason. It is
// pure and deterministic and never modifies s. The rules are in the package
// comment.
//
// A deferred fact must be offered again after every transition the payment
// makes; Offer and Replay do that.
func (Machine) Apply(s State, f Fact) Decision {
	if !f.valid() {
		return decide(s, OutcomeIgnored, ReasonInvalidFact)
	}
	if f.Currency != "" && s.Currency != "" && f.Currency != s.Currency {
		return decide(s, OutcomeIgnored, ReasonCurrencyMismatch)
	}
	var c change
	switch f.Status {
	case StatusPending, StatusAuthorized, StatusFailed, StatusCanceled, StatusPaid:
		c = applyLifecycle(s, f)
	case StatusRefunded, StatusPartiallyRefunded:
		c = applyRefund(s, f)
	case StatusDisputed, StatusDisputeWon, StatusDisputeLost:
		c = applyDispute(s, f)
	}
	if c.outcome != OutcomeApplied {
		return decide(s, c.outcome, c.reason)
	}
	return commit(s, c, f)
}

// change is what one rule decided; next is only set when applied.
type change struct {
	outcome  Outcome
	reason   string
	next     State
	kind     string
	amount   int64
	refundID string
}

func verdict(outcome Outcome, reason string) change {
	return change{outcome: outcome, reason: reason}
}

func decide(s State, outcome Outcome, reason string) Decision {
	return Decision{Outcome: outcome, Reason: reason, State: s}
}

// known is the verdict on a fact whose content the payment already records:
// a duplicate while the payment is in the status the fact names, stale once
// it has moved on.
func known(s State, f Fact) change {
	if s.Status == f.Status {
		return verdict(OutcomeIgnored, ReasonDuplicateFact)
	}
	return verdict(OutcomeIgnored, ReasonStale)
}

// applyLifecycle handles pending, authorized, failed, canceled and paid: the
// payment's lifecycle only moves up the rank order.
func applyLifecycle(s State, f Fact) change {
	cur := s.lifecycle()
	n := s.clone()
	if n.Currency == "" {
		n.Currency = f.Currency
	}
	if rank[f.Status] <= rank[cur] {
		if f.Status == StatusPaid && cur == StatusPaid && f.AmountMinor != 0 && f.AmountMinor != s.CapturedMinor {
			return verdict(OutcomeIgnored, ReasonAmountMismatch)
		}
		if f.Status == StatusPaid || (n.Currency == s.Currency && (s.AmountMinor != 0 || f.AmountMinor == 0)) {
			return known(s, f)
		}
		// The status is known, but not the amount or currency this fact
		// carries: keep them, or the state would depend on whether the
		// thin fact came first.
		if n.AmountMinor == 0 {
			n.AmountMinor = f.AmountMinor
		}
		return change{outcome: OutcomeApplied, kind: KindDetails, amount: n.AmountMinor, next: n}
	}
	c := change{outcome: OutcomeApplied, kind: KindStatus}
	if f.Status == StatusPaid {
		if f.AmountMinor == 0 || n.Currency == "" {
			return verdict(OutcomeDeferred, ReasonAmountUnknown)
		}
		n.CapturedMinor = f.AmountMinor
		c.kind = KindCapture
	}
	if f.AmountMinor != 0 {
		n.AmountMinor = f.AmountMinor
	}
	c.amount = n.AmountMinor
	n.Status = n.derive(f.Status)
	c.next = n
	return c
}

// applyRefund handles refunded and partially_refunded. Refunds are additive:
// each id is applied once, whatever its timestamp, so a refund fact is never
// stale: one the payment already holds is a duplicate.
func applyRefund(s State, f Fact) change {
	if !s.paid() {
		return verdict(OutcomeDeferred, ReasonNeedsPredecessor)
	}
	id, amount := f.RefundID, f.AmountMinor
	if id == "" {
		if f.Status == StatusPartiallyRefunded {
			// "Partially refunded", without saying which refund: only
			// the refunds with ids move money.
			if s.RefundedMinor > 0 {
				return verdict(OutcomeIgnored, ReasonDuplicateFact)
			}
			return verdict(OutcomeDeferred, ReasonMissingRefundID)
		}
		id, amount = FullRefundID, 0
	}
	recorded := s.hasRefund(id)
	prev, hasAmount := s.RefundAmounts[id]
	n := s.clone()
	c := change{outcome: OutcomeApplied, refundID: id}
	switch {
	case amount == 0 && f.Status == StatusPartiallyRefunded:
		// A partial refund whose amount is unknown.
		if recorded {
			return verdict(OutcomeIgnored, ReasonDuplicateFact)
		}
		return verdict(OutcomeDeferred, ReasonAmountUnknown)
	case amount == 0:
		// A full refund: the payment is refunded in full, whatever the
		// refunds with amounts add up to.
		if s.knownRefundsMinor() == s.CapturedMinor || (recorded && s.FullRefund) {
			return verdict(OutcomeIgnored, ReasonDuplicateFact)
		}
		n.addRefundID(id)
		n.FullRefund = true
	case hasAmount && prev == amount:
		return verdict(OutcomeIgnored, ReasonDuplicateFact)
	case hasAmount:
		return verdict(OutcomeIgnored, ReasonAmountMismatch)
	default:
		// A refund with its amount; first time this id has one.
		if amount > s.CapturedMinor-s.knownRefundsMinor() {
			return verdict(OutcomeIgnored, ReasonRefundExceedsPaid)
		}
		n.addRefundID(id)
		if n.RefundAmounts == nil {
			n.RefundAmounts = make(map[string]int64, 1)
		}
		n.RefundAmounts[id] = amount
	}
	n.settleRefunds()
	if moved := n.RefundedMinor - s.RefundedMinor; moved > 0 {
		c.kind, c.amount = KindRefund, moved
	} else {
		c.kind, c.amount = KindRefundIdentified, n.RefundAmounts[id]
	}
	n.Status = n.derive(StatusPaid)
	c.next = n
	return c
}

// applyDispute handles disputed, dispute_won and dispute_lost: the dispute
// only moves up: none < disputed < dispute_won < dispute_lost.
func applyDispute(s State, f Fact) change {
	if !s.paid() {
		return verdict(OutcomeDeferred, ReasonNeedsPredecessor)
	}
	n := s.clone()
	c := change{outcome: OutcomeApplied, kind: f.Status.disputeKind()}
	switch {
	case f.Status == StatusDisputed && s.DisputeStatus == "":
		if f.AmountMinor == 0 {
			return verdict(OutcomeDeferred, ReasonAmountUnknown)
		}
		n.DisputedMinor = min(f.AmountMinor, s.CapturedMinor)
	case f.Status != StatusDisputed && s.DisputeStatus == "":
		return verdict(OutcomeDeferred, ReasonNeedsPredecessor)
	case disputeRank[f.Status] <= disputeRank[s.DisputeStatus]:
		return known(s, f)
	}
	n.DisputeStatus = f.Status
	c.amount = n.DisputedMinor
	n.Status = n.derive(StatusPaid)
	c.next = n
	return c
}

// commit turns an applied change into the decision: one transition, its
// postings, the version and LastEventAt.
func commit(s State, c change, f Fact) Decision {
	n := c.next
	n.Version = s.Version + 1
	if f.OccurredAt.After(n.LastEventAt) {
		n.LastEventAt = f.OccurredAt
	}
	t := Transition{
		From:        s.Status,
		To:          n.Status,
		Version:     n.Version,
		Kind:        c.kind,
		AmountMinor: c.amount,
		Currency:    n.Currency,
		RefundID:    c.refundID,
	}
	// Balances before and after always differ by a balanced entry (both
	// come from State.Balances, which sums to zero per currency).
	mv, err := ledger.Movements(postings(s.Balances(), n.Balances()))
	if err != nil {
		panic("payment: unbalanced transition: " + err.Error())
	}
	t.Movements = mv
	return Decision{Outcome: OutcomeApplied, State: n, Transitions: []Transition{t}}
}

// postings is the journal entry that takes the ledger from balances before
// to balances after: one posting per account whose balance changed.
func postings(before, after map[ledger.Key]int64) []ledger.Posting {
	keys := make(map[ledger.Key]int64, len(before)+len(after))
	for k, v := range after {
		keys[k] += v
	}
	for k, v := range before {
		keys[k] -= v
	}
	var ps []ledger.Posting
	for _, k := range ledger.Keys(keys) {
		if d := keys[k]; d != 0 {
			ps = append(ps, ledger.Posting{Account: k.Account, AmountMinor: d, Currency: k.Currency})
		}
	}
	return ps
}
