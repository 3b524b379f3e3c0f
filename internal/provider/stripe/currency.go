package stripe

import (
	"github.com/paystream/paystream/internal/money"
	"github.com/paystream/paystream/internal/provider"
)

// exponents lists the currencies whose Stripe API amounts use a different
// number of decimals than ISO 4217; every other currency matches ISO.
//
//   - MGA: ISO 4217 gives it 2 decimals; Stripe treats it as zero-decimal.
//   - ISK: ISO 4217 gives it 0 decimals; Stripe's API keeps it two-decimal
//     for backwards compatibility (amounts must be multiples of 100).
//
// UGX, HUF and TWD, which Stripe lists as special cases, use ISO's exponent
// in API amounts (UGX 0, HUF 2, TWD 2); their special rules concern payouts
// and charge granularity, not the unit of the amount field.
var exponents = map[string]int{
	"MGA": 0,
	"ISK": 2,
}

// toISO converts an amount in Stripe's minor units of currency to ISO 4217
// minor units, exactly.
func toISO(v int64, currency string) (int64, error) {
	iso, ok := money.Exponent(currency)
	if !ok {
		return 0, provider.Unprocessable("unknown currency")
	}
	se, ok := exponents[currency]
	if !ok {
		return v, nil
	}
	for ; se < iso; se++ {
		if v > (1<<53-1)/10 {
			return 0, provider.Unprocessable("bad amount: too large")
		}
		v *= 10
	}
	for ; se > iso; se-- {
		if v%10 != 0 {
			return 0, provider.Unprocessable("bad amount: more precise than the currency's minor unit")
		}
		v /= 10
	}
	return v, nil
}
