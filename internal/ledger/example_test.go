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
