// Package money turns the decimal text of amounts, as gateways send them in
// JSON, into exact integer minor units of an ISO 4217 currency. It never goes
// through float64: the text is read digit by digit, and anything that cannot
// be represented exactly (too many fractional digits for the currency, a
// negative or non-finite value, more than fits an int64) is rejected with an
// error naming the reason.
package money

import (
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"
)

// MaxTextLen is the longest amount text Parse and ParseMinor look at. Any
// amount an int64 of minor units can hold is far shorter; longer text (a
// 400-digit number) is rejected with ErrTooLong before any arithmetic.
const MaxTextLen = 64

// Rejection reasons. Errors returned by Parse and ParseMinor wrap exactly one
// of them, so callers can match with errors.Is.
var (
	// ErrEmpty is an empty amount text.
	ErrEmpty = errors.New("empty amount")
	// ErrTooLong is an amount text longer than MaxTextLen.
	ErrTooLong = errors.New("amount text too long")
	// ErrMalformed is text that is not a JSON number.
	ErrMalformed = errors.New("malformed amount")
	// ErrNotFinite is NaN or an infinity, which JSON cannot carry but decimal
	// strings sometimes do.
	ErrNotFinite = errors.New("amount not finite")
	// ErrNegative is an amount below zero (including "-0").
	ErrNegative = errors.New("negative amount")
	// ErrOverPrecise is an amount with non-zero digits below the currency's
	// minor unit, e.g. "10.001" BRL.
	ErrOverPrecise = errors.New("amount more precise than the currency's minor unit")
	// ErrOverflow is an amount whose minor units do not fit an int64.
	ErrOverflow = errors.New("amount overflows int64 minor units")
	// ErrUnknownCurrency is a currency that is not an active ISO 4217 code.
	ErrUnknownCurrency = errors.New("unknown currency")
)

// Parse converts text, the decimal amount in major units as it appears in
// JSON ("100.50") or in a decimal string, to integer minor units of
// currency ("BRL" → 10050).
//
// text must follow the JSON number grammar: no sign other than a leading '-'
// (which is rejected as ErrNegative), no leading zeros, digits on both sides
// of a '.', an optional exponent. Exponent notation is accepted only when the
// result is exact ("1.5e2" USD is 15000). Trailing zeros beyond the currency's
// exponent are exact and accepted ("10.500" BRL is 1050); non-zero digits
// there are ErrOverPrecise.
func Parse(text, currency string) (int64, error) {
	exp, ok := Exponent(currency)
	if !ok {
		return 0, fmt.Errorf("parse amount %q: %w %q", clip(text), ErrUnknownCurrency, clip(currency))
	}
	v, err := scale(text, exp)
	if err != nil {
		return 0, fmt.Errorf("parse %s amount %q: %w", currency, clip(text), err)
	}
	return v, nil
}

// ParseMinor converts text that already is an amount in minor units (Stripe's
// "amount": 1050) to an int64, with the same grammar and checks as Parse: a
// fractional part is ErrOverPrecise unless it is all zeros.
func ParseMinor(text string) (int64, error) {
	v, err := scale(text, 0)
	if err != nil {
		return 0, fmt.Errorf("parse minor amount %q: %w", clip(text), err)
	}
	return v, nil
}

// Format renders minor units of currency as a decimal in major units, the
// inverse of Parse: Format(10050, "BRL") is "100.50". Unknown currencies are
// rendered with exponent 0.
func Format(minor int64, currency string) string {
	exp, _ := Exponent(currency)
	neg := minor < 0
	var digits string
	if neg {
		// Via uint64 so math.MinInt64 does not overflow.
		digits = strconv.FormatUint(uint64(-(minor+1))+1, 10)
	} else {
		digits = strconv.FormatInt(minor, 10)
	}
	if exp > 0 {
		if len(digits) <= exp {
			digits = strings.Repeat("0", exp-len(digits)+1) + digits
		}
		digits = digits[:len(digits)-exp] + "." + digits[len(digits)-exp:]
	}
	if neg {
		return "-" + digits
	}
	return digits
}

// scale parses text as a non-negative JSON number and returns it multiplied
// by 10^exp, exactly, or an error wrapping one of the reasons.
func scale(text string, exp int) (int64, error) {
	switch {
	case text == "":
		return 0, ErrEmpty
	case len(text) > MaxTextLen:
		return 0, ErrTooLong
	}
	switch strings.ToLower(strings.TrimLeft(text, "+-")) {
	case "nan", "inf", "infinity":
		return 0, ErrNotFinite
	}
	s := text
	neg := false
	if s[0] == '-' {
		neg = true
		s = s[1:]
	}
	// Integer part: "0" or a non-zero digit followed by digits.
	i := 0
	for i < len(s) && isDigit(s[i]) {
		i++
	}
	intPart := s[:i]
	if intPart == "" || (len(intPart) > 1 && intPart[0] == '0') {
		return 0, ErrMalformed
	}
	s = s[i:]
	var frac string
	if s != "" && s[0] == '.' {
		s = s[1:]
		i = 0
		for i < len(s) && isDigit(s[i]) {
			i++
		}
		if i == 0 {
			return 0, ErrMalformed
		}
		frac, s = s[:i], s[i:]
	}
	e10 := 0
	if s != "" && (s[0] == 'e' || s[0] == 'E') {
		s = s[1:]
		sign := 1
		if s != "" && (s[0] == '+' || s[0] == '-') {
			if s[0] == '-' {
				sign = -1
			}
			s = s[1:]
		}
		i = 0
		for i < len(s) && isDigit(s[i]) {
			i++
		}
		if i == 0 || i != len(s) {
			return 0, ErrMalformed
		}
		// MaxTextLen bounds the digits, but not their value: cap it so the
		// shift arithmetic below cannot overflow an int.
		n, err := strconv.Atoi(s)
		if err != nil || n > 1000 {
			n = 1000
		}
		e10 = sign * n
		s = ""
	}
	if s != "" {
		return 0, ErrMalformed
	}
	digits := strings.TrimLeft(intPart+frac, "0")
	if neg {
		return 0, ErrNegative
	}
	if digits == "" {
		return 0, nil
	}
	// value = digits × 10^shift
	shift := e10 - len(frac) + exp
	if shift < 0 {
		drop := -shift
		if drop >= len(digits) {
			return 0, ErrOverPrecise
		}
		if strings.Trim(digits[len(digits)-drop:], "0") != "" {
			return 0, ErrOverPrecise
		}
		digits = digits[:len(digits)-drop]
		shift = 0
	}
	if len(digits)+shift > 19 {
		return 0, ErrOverflow
	}
	var v uint64
	for j := 0; j < len(digits); j++ {
		v = v*10 + uint64(digits[j]-'0')
	}
	for ; shift > 0; shift-- {
		v *= 10
	}
	if v > math.MaxInt64 {
		return 0, ErrOverflow
	}
	return int64(v), nil
}

func isDigit(c byte) bool { return '0' <= c && c <= '9' }

// clip shortens text for error messages so a hostile 1 MB amount does not end
// up whole in logs.
func clip(s string) string {
	if len(s) > 32 {
		return s[:32] + "…"
	}
	return s
}
