package provider

import (
	"strings"

	"github.com/paystream/paystream/internal/money"
	"github.com/paystream/paystream/internal/payment"
)

// Currency normalizes a gateway's currency code to upper case and checks it
// is an active ISO 4217 code. Errors wrap ErrUnprocessable.
func Currency(code string) (string, error) {
	c := strings.ToUpper(code)
	if _, ok := money.Exponent(c); !ok {
		return "", Unprocessable("unknown currency")
	}
	return c, nil
}

// Amount is an amount field of a gateway's JSON, kept as its JSON text so
// that it is read exactly, never through float64. Declare amount fields as
// Amount and read them with AmountMinor or AmountMajor; "" is an absent (or
// null) field.
//
// Unlike json.Number, which takes a JSON string holding digits as if it
// were a number, Amount keeps the quotes, so AmountMinor and AmountMajor
// refuse "1050": a gateway whose amounts are JSON numbers never sends one,
// and a payload that does is malformed.
type Amount string

// UnmarshalJSON keeps b, the field's JSON text, as is; null leaves a unset.
func (a *Amount) UnmarshalJSON(b []byte) error {
	if string(b) != "null" {
		*a = Amount(b)
	}
	return nil
}

// String returns the amount's JSON text.
func (a Amount) String() string { return string(a) }

// number returns a's text when it is a JSON number.
func (a Amount) number() (string, error) {
	if strings.HasPrefix(string(a), `"`) {
		return "", Unprocessable("bad amount: a JSON string, not a number")
	}
	return string(a), nil
}

// AmountMinor reads an amount the gateway sends as a JSON integer in minor
// units (Stripe's 10050), exactly. Errors wrap ErrUnprocessable and name the
// reason (a string, negative, over-precise, too large).
func AmountMinor(a Amount) (int64, error) {
	text, err := a.number()
	if err != nil {
		return 0, err
	}
	v, err := money.ParseMinor(text)
	if err != nil {
		return 0, Unprocessable("bad amount: " + err.Error())
	}
	return checkMax(v)
}

// FactAmountMinor is AmountMinor for the amount of a fact in currency,
// which must be known: minor units mean nothing without one, so an amount
// without currency is unprocessable.
func FactAmountMinor(a Amount, currency string) (int64, error) {
	if currency == "" {
		return 0, Unprocessable("amount without currency")
	}
	return AmountMinor(a)
}

// AmountMajor reads an amount the gateway sends as a JSON decimal in major
// units of currency (Asaas' 100.50 BRL), exactly, into minor units. Errors
// wrap ErrUnprocessable.
func AmountMajor(a Amount, currency string) (int64, error) {
	text, err := a.number()
	if err != nil {
		return 0, err
	}
	v, err := money.Parse(text, currency)
	if err != nil {
		return 0, Unprocessable("bad amount: " + err.Error())
	}
	return checkMax(v)
}

func checkMax(v int64) (int64, error) {
	if v > payment.MaxAmountMinor {
		return 0, Unprocessable("bad amount: above the largest amount a fact may carry")
	}
	return v, nil
}
