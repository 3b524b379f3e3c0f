package money_test

import (
	"errors"
	"fmt"

	"github.com/paystream/paystream/internal/money"
)

func ExampleParse() {
	for _, tc := range []struct{ text, currency string }{
		{"100.50", "BRL"},
		{"1500", "JPY"},
		{"1.234", "KWD"},
		{"10.001", "BRL"},
		{"-5", "USD"},
	} {
		minor, err := money.Parse(tc.text, tc.currency)
		switch {
		case errors.Is(err, money.ErrOverPrecise):
			fmt.Printf("%s %s: rejected, over-precise\n", tc.text, tc.currency)
		case err != nil:
			fmt.Printf("%s %s: rejected: %v\n", tc.text, tc.currency, errors.Unwrap(err))
		default:
			fmt.Printf("%s %s = %d minor units (%s)\n", tc.text, tc.currency, minor, money.Format(minor, tc.currency))
		}
	}
	// Output:
	// 100.50 BRL = 10050 minor units (100.50)
	// 1500 JPY = 1500 minor units (1500)
	// 1.234 KWD = 1234 minor units (1.234)
	// 10.001 BRL: rejected, over-precise
	// -5 USD: rejected: negative amount
}
