package payment_test

import (
	"fmt"

	"github.com/paystream/paystream/internal/ledger"
	"github.com/paystream/paystream/internal/payment"
)

// An Asaas payment seen for the first time as paid (PAYMENT_CONFIRMED), then
// PAYMENT_RECEIVED for the same fact, a late PAYMENT_CREATED, and a partial
// refund.
func ExampleMachine_Apply() {
	var m payment.Machine
	var s payment.State // a payment never seen before
	for _, f := range []payment.Fact{
		{Status: payment.StatusPaid, AmountMinor: 1000, Currency: "BRL"},
		{Status: payment.StatusPaid, AmountMinor: 1000, Currency: "BRL"},
		{Status: payment.StatusPending, AmountMinor: 1000, Currency: "BRL"},
		{Status: payment.StatusPartiallyRefunded, RefundID: "re_1", AmountMinor: 300, Currency: "BRL"},
	} {
		d := m.Apply(s, f)
		s = d.State
		fmt.Println(f.Status+":", verdict(d))
		for _, t := range d.Transitions {
			fmt.Printf("  v%d %q -> %q %s %d %s\n", t.Version, t.From, t.To, t.Kind, t.AmountMinor, t.Currency)
			for _, p := range t.Postings() {
				fmt.Printf("    %-18s %+d\n", p.Account, p.AmountMinor)
			}
		}
	}
	// Output:
	// paid: processed
	//   v1 "" -> "paid" capture 1000 BRL
	//     gateway_receivable +1000
	//     merchant_payable   -1000
	// paid: ignored duplicate_fact
	// pending: ignored stale
	// partially_refunded: processed
	//   v2 "paid" -> "partially_refunded" refund 300 BRL
	//     gateway_receivable -300
	//     merchant_payable   +300
}

// A refund delivered before the capture waits, and is applied right after
// the capture, as the processor does it.
func ExampleMachine_Replay() {
	var m payment.Machine
	got := m.Replay(payment.State{}, []payment.Fact{
		{Status: payment.StatusPartiallyRefunded, RefundID: "re_1", AmountMinor: 300, Currency: "BRL"},
		{Status: payment.StatusDisputeWon},
		{Status: payment.StatusPaid, AmountMinor: 1000, Currency: "BRL"},
	})
	for i, d := range got.Decisions {
		fmt.Println("fact", i, verdict(d))
	}
	for _, t := range got.Transitions {
		fmt.Println("v", t.Version, t.Kind, t.To)
	}
	fmt.Println(got.State.Status, got.State.CapturedMinor, got.State.RefundedMinor)
	// Output:
	// fact 0 processed
	// fact 1 deferred needs_predecessor
	// fact 2 processed
	// v 1 capture paid
	// v 2 refund partially_refunded
	// partially_refunded 1000 300
}

// The processor's step: apply the new fact, then give the payment's deferred
// facts (from the inbox, oldest first) their chance, persisting each
// decision in order.
func ExampleMachine_Offer() {
	var m payment.Machine
	var s payment.State
	waiting := []payment.Fact{
		{Status: payment.StatusDisputeLost},
		{Status: payment.StatusDisputed, AmountMinor: 1000, Currency: "BRL"},
	}
	d, settled := m.Offer(s, payment.Fact{Status: payment.StatusPaid, AmountMinor: 1000, Currency: "BRL"}, waiting)
	fmt.Println("offered:", d.Outcome)
	for _, r := range settled.Resumed {
		fmt.Println("waiting", r.Index, r.Decision.Outcome, r.Decision.State.Status)
	}
	fmt.Println(len(settled.Transitions), "transitions, now", settled.State.Status)
	// Output:
	// offered: processed
	// waiting 1 processed disputed
	// waiting 0 processed dispute_lost
	// 3 transitions, now dispute_lost
}

// The same facts in another order, with a duplicate, make different
// intermediate transitions but an equivalent state and the same ledger.
func ExampleState_Equivalent() {
	var m payment.Machine
	inOrder := []payment.Fact{
		{Status: payment.StatusPending, AmountMinor: 1000, Currency: "BRL"},
		{Status: payment.StatusAuthorized, AmountMinor: 1000, Currency: "BRL"},
		{Status: payment.StatusPaid, AmountMinor: 1000, Currency: "BRL"},
		{Status: payment.StatusPartiallyRefunded, RefundID: "re_1", AmountMinor: 300, Currency: "BRL"},
	}
	shuffled := []payment.Fact{inOrder[3], inOrder[2], inOrder[0], inOrder[3], inOrder[1]}

	a := m.Replay(payment.State{}, inOrder)
	b := m.Replay(payment.State{}, shuffled)
	fmt.Println(a.State.Status, a.State.Version)
	fmt.Println(b.State.Status, b.State.Version)
	fmt.Println("equivalent:", a.State.Equivalent(b.State))
	fmt.Println(ledger.Balances(postingsOf(a.Transitions)...), ledger.Balances(postingsOf(b.Transitions)...))
	// Output:
	// partially_refunded 4
	// partially_refunded 2
	// equivalent: true
	// map[gateway_receivable/BRL:700 merchant_payable/BRL:-700] map[gateway_receivable/BRL:700 merchant_payable/BRL:-700]
}

// verdict prints a decision's outcome and reason, if any.
func verdict(d payment.Decision) string {
	if d.Reason == "" {
		return string(d.Outcome)
	}
	return string(d.Outcome) + " " + d.Reason
}

func postingsOf(ts []payment.Transition) [][]ledger.Posting {
	var js [][]ledger.Posting
	for _, t := range ts {
		js = append(js, t.Postings())
	}
	return js
}

// A payment's ledger, derived from its state alone: of R$10.00 captured,
// R$2.00 was refunded and the other R$8.00 is held in the dispute reserve,
// so nothing is owed to the merchant (zero balances are left out).
func ExampleState_Balances() {
	var m payment.Machine
	got := m.Replay(payment.State{}, []payment.Fact{
		{Status: payment.StatusPaid, AmountMinor: 1000, Currency: "BRL"},
		{Status: payment.StatusPartiallyRefunded, RefundID: "re_1", AmountMinor: 200, Currency: "BRL"},
		{Status: payment.StatusDisputed, AmountMinor: 800, Currency: "BRL"},
	})
	b := got.State.Balances()
	for _, k := range ledger.Keys(b) {
		fmt.Println(k, b[k])
	}
	// Output:
	// dispute_reserve/BRL -800
	// gateway_receivable/BRL 800
}
