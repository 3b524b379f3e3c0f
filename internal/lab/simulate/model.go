package simulate

import (
	"github.com/paystream/paystream/internal/ledger"
)

// Expected is what a payment must end as once every webhook of its history
// was applied, whatever the order and duplication they arrived in.
type Expected struct {
	Status        string `json:"status"`
	CapturedMinor int64  `json:"captured_minor"`
	RefundedMinor int64  `json:"refunded_minor"`
	// Dispute is "", "open", "won" or "lost".
	Dispute       string `json:"dispute,omitempty"`
	DisputedMinor int64  `json:"disputed_minor,omitempty"`
	// Balances is the payment's ledger per account (in Currency), zero
	// balances left out.
	Balances map[string]int64 `json:"balances,omitempty"`
}

// Expect computes a history's final state and ledger with a model written
// from the documented meaning of each fact, independently of package
// payment: it walks the true history in order (the order the gateway says
// things happened) and books each money movement as an accountant would.
//
//   - a capture: the gateway owes us the money, we owe the merchant;
//   - a refund: both shrink by the refund;
//   - a dispute opening: the disputed amount moves from what we owe the
//     merchant into the dispute reserve;
//   - won: it moves back; lost: it leaves the reserve and the gateway owes
//     us that much less.
//
// The status is the documented precedence: before a capture, the last
// lifecycle status; after it, an open dispute, then a lost one, then the
// refunds (all, some), then a won dispute, then paid.
func Expect(steps []Step) Expected {
	var (
		lifecycle                    string
		captured, refunded, disputed int64
		dispute                      string
		bal                          = map[string]int64{}
	)
	move := func(debit, credit string, amount int64) {
		bal[debit] += amount
		bal[credit] -= amount
	}
	for _, s := range steps {
		if s.Echo {
			continue // the same fact again: nothing happens
		}
		switch s.Kind {
		case KindCreated:
			if lifecycle == "" {
				lifecycle = "pending"
			}
		case KindAuthorized:
			lifecycle = "authorized"
		case KindFailed:
			lifecycle = "failed"
		case KindCanceled:
			lifecycle = "canceled"
		case KindPaid:
			lifecycle, captured = "paid", s.AmountMinor
			move(ledger.AccountGatewayReceivable, ledger.AccountMerchantPayable, captured)
		case KindRefund:
			refunded += s.AmountMinor
			move(ledger.AccountMerchantPayable, ledger.AccountGatewayReceivable, s.AmountMinor)
		case KindFullRefund:
			move(ledger.AccountMerchantPayable, ledger.AccountGatewayReceivable, captured-refunded)
			refunded = captured
		case KindDisputed:
			dispute, disputed = "open", s.AmountMinor
			move(ledger.AccountMerchantPayable, ledger.AccountDisputeReserve, disputed)
		case KindDisputeWon:
			dispute = "won"
			move(ledger.AccountDisputeReserve, ledger.AccountMerchantPayable, disputed)
		case KindDisputeLost:
			dispute = "lost"
			move(ledger.AccountDisputeReserve, ledger.AccountGatewayReceivable, disputed)
		}
	}
	for k, v := range bal {
		if v == 0 {
			delete(bal, k)
		}
	}
	e := Expected{Status: lifecycle, CapturedMinor: captured, RefundedMinor: refunded, Dispute: dispute, DisputedMinor: disputed, Balances: bal}
	if lifecycle == "paid" {
		switch {
		case dispute == "open":
			e.Status = "disputed"
		case dispute == "lost":
			e.Status = "dispute_lost"
		case refunded >= captured:
			e.Status = "refunded"
		case refunded > 0:
			e.Status = "partially_refunded"
		case dispute == "won":
			e.Status = "dispute_won"
		}
	}
	return e
}
