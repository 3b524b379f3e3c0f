package payment

import (
	"maps"
	"slices"

	"github.com/paystream/paystream/internal/ledger"
)

// rank orders the lifecycle statuses: a lifecycle fact applies only when it
// ranks above the payment's lifecycle status. Paid ranks above failed and
// canceled because money that arrived is never ignored.
var rank = map[Status]int{
	"":               0,
	StatusPending:    1,
	StatusAuthorized: 2,
	StatusFailed:     3,
	StatusCanceled:   4,
	StatusPaid:       5,
}

// disputeRank orders a payment's dispute. Lost ranks above won: a dispute
// lost after it was won (arbitration) is lost.
var disputeRank = map[Status]int{
	"":                0,
	StatusDisputed:    1,
	StatusDisputeWon:  2,
	StatusDisputeLost: 3,
}

func (st Status) disputeKind() string {
	switch st {
	case StatusDisputeWon:
		return KindDisputeWon
	case StatusDisputeLost:
		return KindDisputeLost
	default:
		return KindDispute
	}
}

// valid reports whether f is well formed: a known status, an amount within
// [0, MaxAmountMinor] and a currency that is empty or three upper-case
// letters.
func (f Fact) valid() bool {
	switch f.Status {
	case StatusPending, StatusAuthorized, StatusPaid, StatusFailed, StatusCanceled,
		StatusRefunded, StatusPartiallyRefunded,
		StatusDisputed, StatusDisputeWon, StatusDisputeLost:
	default:
		return false
	}
	if f.AmountMinor < 0 || f.AmountMinor > MaxAmountMinor {
		return false
	}
	if f.Currency == "" {
		return true
	}
	if len(f.Currency) != 3 {
		return false
	}
	for i := range 3 {
		if c := f.Currency[i]; c < 'A' || c > 'Z' {
			return false
		}
	}
	return true
}

// lifecycle is the payment's lifecycle status: its Status before paid, paid
// for every status after it, "" for a payment never seen.
func (s State) lifecycle() Status {
	switch s.Status {
	case "", StatusPending, StatusAuthorized, StatusFailed, StatusCanceled:
		return s.Status
	default:
		return StatusPaid
	}
}

func (s State) paid() bool { return s.lifecycle() == StatusPaid }

// derive computes the Status of s given its lifecycle status, by the
// precedence in the package comment.
func (s State) derive(lifecycle Status) Status {
	switch {
	case lifecycle != StatusPaid:
		return lifecycle
	case s.DisputeStatus == StatusDisputed:
		return StatusDisputed
	case s.DisputeStatus == StatusDisputeLost:
		return StatusDisputeLost
	case s.RefundedMinor >= s.CapturedMinor:
		return StatusRefunded
	case s.RefundedMinor > 0:
		return StatusPartiallyRefunded
	case s.DisputeStatus == StatusDisputeWon:
		return StatusDisputeWon
	default:
		return StatusPaid
	}
}

// clone returns a copy of s sharing no memory with it.
func (s State) clone() State {
	s.Refunds = slices.Clone(s.Refunds)
	s.RefundAmounts = maps.Clone(s.RefundAmounts)
	return s
}

func (s State) hasRefund(id string) bool {
	return slices.Contains(s.Refunds, id)
}

// knownRefundsMinor sums the refunds whose amount is known.
func (s State) knownRefundsMinor() int64 {
	var sum int64
	for _, v := range s.RefundAmounts {
		sum += v
	}
	return sum
}

// addRefundID inserts id into the sorted Refunds; s must be a clone.
func (s *State) addRefundID(id string) {
	if i, ok := slices.BinarySearch(s.Refunds, id); !ok {
		s.Refunds = slices.Insert(s.Refunds, i, id)
	}
}

// settleRefunds recomputes RefundedMinor. Once the refunds with known
// amounts account for the whole capture, a full refund has nothing left to
// explain: FullRefund and the ids without amount are dropped, so the state
// does not depend on whether the full refund came first or last.
func (s *State) settleRefunds() {
	known := s.knownRefundsMinor()
	if known >= s.CapturedMinor {
		s.FullRefund = false
		s.Refunds = slices.DeleteFunc(s.Refunds, func(id string) bool {
			_, ok := s.RefundAmounts[id]
			return !ok
		})
	}
	if s.FullRefund {
		s.RefundedMinor = s.CapturedMinor
	} else {
		s.RefundedMinor = known
	}
}

// Balances is the payment's ledger as a function of its state: what the
// postings of all its transitions add up to, per account and currency, with
// zero balances left out (as ledger.Balances does). Each transition's
// postings are the difference between Balances after and before it, which
// is why equivalent states have equal ledgers. See package ledger for the
// chart of accounts.
func (s State) Balances() map[ledger.Key]int64 {
	b := make(map[ledger.Key]int64, 3)
	if s.CapturedMinor == 0 {
		return b
	}
	c, r, d := s.CapturedMinor, s.RefundedMinor, s.DisputedMinor
	var open, lost int64
	switch s.DisputeStatus {
	case StatusDisputed:
		open = d
	case StatusDisputeLost:
		lost = d
	}
	b[ledger.Key{Account: ledger.AccountGatewayReceivable, Currency: s.Currency}] = c - r - lost
	b[ledger.Key{Account: ledger.AccountMerchantPayable, Currency: s.Currency}] = -(c - r) + open + lost
	b[ledger.Key{Account: ledger.AccountDisputeReserve, Currency: s.Currency}] = -open
	maps.DeleteFunc(b, func(_ ledger.Key, v int64) bool { return v == 0 })
	return b
}

// Equivalent reports whether s and o describe the same payment outcome:
// every field except Version and LastEventAt, which depend on the order facts
// arrived in (in-order pending, authorized, paid makes three transitions;
// paid first makes one). This is the convergence property: any permutation
// and duplication of a payment's facts, replayed as the processor does, ends
// in a State Equivalent to in-order delivery.
func (s State) Equivalent(o State) bool {
	return s.Status == o.Status &&
		s.AmountMinor == o.AmountMinor &&
		s.Currency == o.Currency &&
		s.CapturedMinor == o.CapturedMinor &&
		s.RefundedMinor == o.RefundedMinor &&
		slices.Equal(s.Refunds, o.Refunds) &&
		maps.Equal(s.RefundAmounts, o.RefundAmounts) &&
		s.FullRefund == o.FullRefund &&
		s.DisputeStatus == o.DisputeStatus &&
		s.DisputedMinor == o.DisputedMinor
}
