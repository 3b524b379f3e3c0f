package provider

import (
	"encoding/json"
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

// AmountMinor reads an amount the gateway sends in integer minor units
// (Stripe's 10050), exactly, from its JSON text. Errors wrap
// ErrUnprocessable and name the reason (negative, over-precise, too large).
func AmountMinor(n json.Number) (int64, error) {
	v, err := money.ParseMinor(n.String())
	if err != nil {
		return 0, Unprocessable("bad amount: " + err.Error())
	}
	return checkMax(v)
}

// AmountMajor reads an amount the gateway sends as a decimal in major units
// of currency (Asaas' 100.50 BRL), exactly, into minor units. Errors wrap
// ErrUnprocessable.
func AmountMajor(n json.Number, currency string) (int64, error) {
	v, err := money.Parse(n.String(), currency)
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
