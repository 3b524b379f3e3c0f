package payment

import (
	"time"

	"github.com/paystream/paystream/internal/ledger"
)

// State is everything the machine needs to know about one payment. The store
// persists it whole (as JSON) next to a few indexed columns, so fields may be
// added freely; the zero State is a payment never seen before.
type State struct {
	Status        Status    `json:"status"`
	Version       int64     `json:"version"`
	AmountMinor   int64     `json:"amount_minor"`
	Currency      string    `json:"currency"`
	CapturedMinor int64     `json:"captured_minor"`
	RefundedMinor int64     `json:"refunded_minor"`
	Refunds       []string  `json:"refunds,omitempty"`
	LastEventAt   time.Time `json:"last_event_at"`
}

// Transition is one real change of a payment. Side effects (ledger postings,
// the outbox event) belong to transitions, never to events.
type Transition struct {
	From    Status `json:"from"`
	To      Status `json:"to"`
	Version int64  `json:"version"`
	// Kind names what moved, e.g. "capture", "refund"; it is part of the
	// postings' uniqueness key together with Version.
	Kind        string           `json:"kind"`
	AmountMinor int64            `json:"amount_minor"`
	Currency    string           `json:"currency"`
	RefundID    string           `json:"refund_id,omitempty"`
	Postings    []ledger.Posting `json:"postings,omitempty"`
}

// Decision is Machine.Apply's verdict on one Fact.
type Decision struct {
	Outcome Outcome
	// Reason explains ignored and deferred outcomes.
	Reason string
	// State is the payment after the decision; equal to the input unless
	// Outcome is OutcomeApplied.
	State State
	// Transitions are the changes the fact caused, in order, each with a
	// version one above the previous. Empty unless Outcome is OutcomeApplied.
	Transitions []Transition
}

// Machine applies facts to payment states. Its zero value is ready to use.
type Machine struct{}
