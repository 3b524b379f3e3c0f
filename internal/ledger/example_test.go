package ledger_test

import (
	"fmt"

	"github.com/paystream/paystream/internal/ledger"
)

// A payment of R$10.00 is captured, then R$3.00 of it is refunded: each
// transition's postings balance, and the balances say the gateway owes the
// platform R$7.00 which the platform owes the merchant.
func Example() {
	capture := []ledger.Posting{
		{Account: ledger.AccountGatewayReceivable, AmountMinor: 1000, Currency: "BRL"},
		{Account: ledger.AccountMerchantPayable, AmountMinor: -1000, Currency: "BRL"},
	}
	refund := []ledger.Posting{
		{Account: ledger.AccountGatewayReceivable, AmountMinor: -300, Currency: "BRL"},
		{Account: ledger.AccountMerchantPayable, AmountMinor: 300, Currency: "BRL"},
	}
	for _, entry := range [][]ledger.Posting{capture, refund} {
		fmt.Println("balanced:", ledger.Validate(entry) == nil)
	}
	b := ledger.Balances(capture, refund)
	for _, k := range ledger.Keys(b) {
		fmt.Println(k, b[k])
	}
	// Output:
	// balanced: true
	// balanced: true
	// gateway_receivable/BRL 700
	// merchant_payable/BRL -700
}

func ExampleBalanced() {
	err := ledger.Balanced([]ledger.Posting{
		{Account: ledger.AccountGatewayReceivable, AmountMinor: 1000, Currency: "BRL"},
		{Account: ledger.AccountMerchantPayable, AmountMinor: -990, Currency: "BRL"},
	})
	fmt.Println(err)
	// Output:
	// currency "BRL" sums to 10: postings do not balance
}

// A lost chargeback after the dispute opened: the reserve is released to
// the gateway. Three signed postings become two movements, each balanced by
// construction, and the postings come back from them.
func ExampleMovements() {
	ms, err := ledger.Movements([]ledger.Posting{
		{Account: ledger.AccountGatewayReceivable, AmountMinor: -400, Currency: "BRL"},
		{Account: ledger.AccountMerchantPayable, AmountMinor: 100, Currency: "BRL"},
		{Account: ledger.AccountDisputeReserve, AmountMinor: 300, Currency: "BRL"},
	})
	if err != nil {
		panic(err)
	}
	for _, m := range ms {
		fmt.Printf("debit %s credit %s %d %s\n", m.Debit, m.Credit, m.AmountMinor, m.Currency)
	}
	b := ledger.Balances(ledger.Postings(ms))
	for _, k := range ledger.Keys(b) {
		fmt.Println(k, b[k])
	}
	// Output:
	// debit dispute_reserve credit gateway_receivable 300 BRL
	// debit merchant_payable credit gateway_receivable 100 BRL
	// dispute_reserve/BRL 300
	// gateway_receivable/BRL -400
	// merchant_payable/BRL 100
}
