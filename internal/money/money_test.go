package money

import (
	"errors"
	"fmt"
	"strings"
	"testing"
)

// parseCases is both the table of TestParse and FuzzParse's seed corpus.
var parseCases = []struct {
	text     string
	currency string
	want     int64
	err      error // nil: accepted with want
}{
	{"100.50", "BRL", 10050, nil},
	{"100.5", "BRL", 10050, nil},
	{"100", "BRL", 10000, nil},
	{"0", "BRL", 0, nil},
	{"0.01", "USD", 1, nil},
	{"0.00", "USD", 0, nil},
	{"10.500", "BRL", 1050, nil},
	{"1.5e2", "USD", 15000, nil},
	{"1E2", "USD", 10000, nil},
	{"1e-2", "USD", 1, nil},
	{"150e-2", "JPY", 0, ErrOverPrecise},
	{"1500e-2", "JPY", 15, nil},
	{"0e999999999999", "USD", 0, nil},
	{"1234", "JPY", 1234, nil},
	{"1234.0", "JPY", 1234, nil},
	{"1234.5", "JPY", 0, ErrOverPrecise},
	{"1.234", "KWD", 1234, nil},
	{"1.2345", "KWD", 0, ErrOverPrecise},
	{"1.0001", "CLF", 10001, nil},
	{"10.001", "BRL", 0, ErrOverPrecise},
	{"0.001", "BRL", 0, ErrOverPrecise},
	{"1e-3", "BRL", 0, ErrOverPrecise},
	{"92233720368547758.07", "USD", 9223372036854775807, nil},
	{"92233720368547758.08", "USD", 0, ErrOverflow},
	{"9223372036854775807", "JPY", 9223372036854775807, nil},
	{"9223372036854775808", "JPY", 0, ErrOverflow},
	{"99999999999999999999", "JPY", 0, ErrOverflow},
	{"1e19", "JPY", 0, ErrOverflow},
	{"1e999999999", "USD", 0, ErrOverflow},
	{strings.Repeat("9", 400), "BRL", 0, ErrTooLong},
	{"0." + strings.Repeat("0", 400), "BRL", 0, ErrTooLong},
	{"-1", "BRL", 0, ErrNegative},
	{"-0", "BRL", 0, ErrNegative},
	{"-0.00", "BRL", 0, ErrNegative},
	{"", "BRL", 0, ErrEmpty},
	{"NaN", "BRL", 0, ErrNotFinite},
	{"Infinity", "BRL", 0, ErrNotFinite},
	{"-Inf", "BRL", 0, ErrNotFinite},
	{"+1", "BRL", 0, ErrMalformed},
	{"01", "BRL", 0, ErrMalformed},
	{".5", "BRL", 0, ErrMalformed},
	{"5.", "BRL", 0, ErrMalformed},
	{"1,50", "BRL", 0, ErrMalformed},
	{"1e", "BRL", 0, ErrMalformed},
	{"1e+", "BRL", 0, ErrMalformed},
	{" 1", "BRL", 0, ErrMalformed},
	{"1 ", "BRL", 0, ErrMalformed},
	{"0x10", "BRL", 0, ErrMalformed},
	{"1_000", "BRL", 0, ErrMalformed},
	{"\"1\"", "BRL", 0, ErrMalformed},
	{"1", "brl", 0, ErrUnknownCurrency},
	{"1", "XXX", 0, ErrUnknownCurrency},
	{"1", "", 0, ErrUnknownCurrency},
}

// checkParsed fails the test unless call returned an error wrapping
// wantErr, or, when wantErr is nil, want and no error.
func checkParsed(t *testing.T, call string, got int64, err error, want int64, wantErr error) {
	t.Helper()
	if wantErr != nil {
		if !errors.Is(err, wantErr) {
			t.Errorf("%s = %d, %v; want %v", call, got, err, wantErr)
		}
		return
	}
	if err != nil || got != want {
		t.Errorf("%s = %d, %v; want %d", call, got, err, want)
	}
}

func TestParse(t *testing.T) {
	t.Parallel()
	for _, tc := range parseCases {
		got, err := Parse(tc.text, tc.currency)
		checkParsed(t, fmt.Sprintf("Parse(%.40q, %q)", tc.text, tc.currency), got, err, tc.want, tc.err)
	}
}

func TestParseMinor(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		text string
		want int64
		err  error
	}{
		{"10050", 10050, nil},
		{"0", 0, nil},
		{"1e3", 1000, nil},
		{"100.0", 100, nil},
		{"100.5", 0, ErrOverPrecise},
		{"-100", 0, ErrNegative},
		{"9223372036854775808", 0, ErrOverflow},
		{strings.Repeat("1", 400), 0, ErrTooLong},
		{"", 0, ErrEmpty},
	} {
		got, err := ParseMinor(tc.text)
		checkParsed(t, fmt.Sprintf("ParseMinor(%.40q)", tc.text), got, err, tc.want, tc.err)
	}
}

func TestFormat(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		minor    int64
		currency string
		want     string
	}{
		{10050, "BRL", "100.50"},
		{5, "BRL", "0.05"},
		{0, "USD", "0.00"},
		{1234, "JPY", "1234"},
		{1, "KWD", "0.001"},
		{-150, "EUR", "-1.50"},
		{-9223372036854775808, "USD", "-92233720368547758.08"},
	} {
		if got := Format(tc.minor, tc.currency); got != tc.want {
			t.Errorf("Format(%d, %q) = %q, want %q", tc.minor, tc.currency, got, tc.want)
		}
	}
}

func TestExponentTable(t *testing.T) {
	t.Parallel()
	for code, e := range exponents {
		if len(code) != 3 || strings.ToUpper(code) != code {
			t.Errorf("code %q is not three upper-case letters", code)
		}
		if e < 0 || e > 4 {
			t.Errorf("%s exponent %d out of range", code, e)
		}
	}
	for code, want := range map[string]int{"BRL": 2, "USD": 2, "EUR": 2, "JPY": 0, "CLP": 0, "KWD": 3, "BHD": 3, "CLF": 4, "KRW": 0} {
		if got, ok := Exponent(code); !ok || got != want {
			t.Errorf("Exponent(%s) = %d, %v; want %d", code, got, ok, want)
		}
	}
}

func FuzzParse(f *testing.F) {
	for _, tc := range parseCases {
		f.Add(tc.text, tc.currency)
	}
	f.Fuzz(func(t *testing.T, text, currency string) {
		v, err := Parse(text, currency)
		if err != nil {
			if v != 0 {
				t.Fatalf("rejected %q but returned %d", text, v)
			}
			return
		}
		if v < 0 {
			t.Fatalf("Parse(%q) = %d, negative", text, v)
		}
		if strings.HasPrefix(text, "-") {
			t.Fatalf("Parse(%q) accepted a negative", text)
		}
		// Round trip: the canonical rendering parses back to the same value.
		back, err := Parse(Format(v, currency), currency)
		if err != nil || back != v {
			t.Fatalf("Parse(Format(%d)) = %d, %v", v, back, err)
		}
	})
}
