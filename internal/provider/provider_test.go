package provider

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/paystream/paystream/internal/payment"
)

// decodeCases is both the table of TestDecodeJSON and FuzzDecodeJSON's seed
// corpus.
var decodeCases = []struct {
	name string
	body string
	ok   bool
}{
	{"object", `{"a":1,"b":{"c":[1,2,{"d":"e"}]}}`, true},
	{"same key in sibling objects", `{"a":{"x":1},"b":{"x":2}}`, true},
	{"whitespace around", " \n{\"a\":1}\n ", true},
	{"duplicate key", `{"a":1,"a":2}`, false},
	{"duplicate nested key", `{"a":{"x":1,"x":2}}`, false},
	{"duplicate key after escape", `{"a":1,"\u0061":2}`, false},
	{"duplicate key in array element", `{"a":[{"x":1,"x":1}]}`, false},
	{"empty", ``, false},
	{"blank", "  \n", false},
	{"array", `[1]`, false},
	{"string", `"a"`, false},
	{"truncated", `{"a":`, false},
	{"truncated nested", `{"a":{"b":1}`, false},
	{"trailing object", `{"a":1}{"b":2}`, false},
	{"trailing garbage", `{"a":1} x`, false},
	{"invalid UTF-8", "{\"a\":\"\xff\"}", false},
	{"too deep", strings.Repeat(`{"a":`, 40) + `1` + strings.Repeat(`}`, 40), false},
	{"NUL escape is valid JSON", `{"a":"x\u0000y"}`, true},
	{"form body", `a=1&b=2`, false},
}

func TestDecodeJSON(t *testing.T) {
	t.Parallel()
	for _, tc := range decodeCases {
		var v map[string]any
		err := DecodeJSON([]byte(tc.body), &v)
		if tc.ok && err != nil {
			t.Errorf("%s: DecodeJSON: %v", tc.name, err)
		}
		if !tc.ok && !errors.Is(err, ErrUnprocessable) {
			t.Errorf("%s: DecodeJSON = %v, want ErrUnprocessable", tc.name, err)
		}
	}
}

func FuzzDecodeJSON(f *testing.F) {
	for _, tc := range decodeCases {
		f.Add([]byte(tc.body))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		var v any
		if err := DecodeJSON(body, &v); err != nil && !errors.Is(err, ErrUnprocessable) {
			t.Fatalf("error does not wrap ErrUnprocessable: %v", err)
		}
	})
}

func TestKeys(t *testing.T) {
	t.Parallel()
	if got := PaymentKey("stripe", "", "pi_1"); got != "stripe:pi_1" {
		t.Errorf("PaymentKey = %q", got)
	}
	if got := PaymentKey("stripe", "br", "pi_1"); got != "stripe:br:pi_1" {
		t.Errorf("PaymentKey with account = %q", got)
	}
	if got := ScopeKey("", "evt_1"); got != "evt_1" {
		t.Errorf("ScopeKey = %q", got)
	}
	if got := ScopeKey("br", "evt_1"); got != "br:evt_1" {
		t.Errorf("ScopeKey with account = %q", got)
	}
	at := time.Date(2024, 6, 12, 19, 45, 3, 0, time.UTC)
	k := BusinessKey("p1", "PAID", payment.StatusPaid, at)
	if k != BusinessKey("p1", "PAID", payment.StatusPaid, at.In(time.FixedZone("BRT", -3*3600))) {
		t.Error("BusinessKey depends on the time's zone")
	}
	for _, other := range []string{
		BusinessKey("p2", "PAID", payment.StatusPaid, at),
		BusinessKey("p1", "CANCELED", payment.StatusPaid, at),
		BusinessKey("p1", "PAID", payment.StatusRefunded, at),
		BusinessKey("p1", "PAID", payment.StatusPaid, at.Add(time.Millisecond)),
		BusinessKey("p1", "PAID", payment.StatusPaid, at, "re_1"),
		BusinessKey("p1P", "AID", payment.StatusPaid, at),
	} {
		if other == k {
			t.Errorf("BusinessKey collision: %s", k)
		}
	}
}

func TestCheckID(t *testing.T) {
	t.Parallel()
	for id, ok := range map[string]bool{
		"pay_1":                     true,
		"evt_05b7&368604920":        true,
		"":                          false,
		"a\x00b":                    false,
		"a\nb":                      false,
		"\xff":                      false,
		strings.Repeat("a", 256):    false,
		strings.Repeat("a", 255):    true,
		"CHAR_354828dd-786b-4cca-8": true,
	} {
		err := CheckID("id", id)
		if ok != (err == nil) {
			t.Errorf("CheckID(%.20q) = %v", id, err)
		}
		if err != nil && !errors.Is(err, ErrUnprocessable) {
			t.Errorf("CheckID error does not wrap ErrUnprocessable: %v", err)
		}
	}
}

func TestIrrelevant(t *testing.T) {
	t.Parallel()
	err := Irrelevant("refund pending")
	if !errors.Is(err, ErrIrrelevant) || !errors.Is(err, ErrUnprocessable) {
		t.Fatalf("Irrelevant = %v: want both ErrIrrelevant and ErrUnprocessable", err)
	}
	if errors.Is(Unprocessable("x"), ErrIrrelevant) {
		t.Fatal("Unprocessable wraps ErrIrrelevant")
	}
}

func TestAmounts(t *testing.T) {
	t.Parallel()
	if v, err := AmountMinor("10050"); err != nil || v != 10050 {
		t.Errorf("AmountMinor = %d, %v", v, err)
	}
	if v, err := AmountMajor("100.50", "BRL"); err != nil || v != 10050 {
		t.Errorf("AmountMajor = %d, %v", v, err)
	}
	for _, n := range []string{"9007199254740992", "-1", "1.5", ""} {
		if _, err := AmountMinor(Amount(n)); !errors.Is(err, ErrUnprocessable) {
			t.Errorf("AmountMinor(%q) = %v, want ErrUnprocessable", n, err)
		}
	}
	if c, err := Currency("brl"); err != nil || c != "BRL" {
		t.Errorf("Currency = %q, %v", c, err)
	}
	if _, err := Currency("BRX"); !errors.Is(err, ErrUnprocessable) {
		t.Errorf("Currency(BRX) = %v", err)
	}
	if err := CheckTime("t", time.Date(10000, 1, 1, 0, 0, 0, 0, time.UTC)); err == nil {
		t.Error("CheckTime accepted year 10000")
	}
}
