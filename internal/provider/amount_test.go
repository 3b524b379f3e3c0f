package provider

import (
	"errors"
	"strings"
	"testing"
)

// TestAmountRefusesJSONStrings: an amount sent as a JSON string ("1050")
// is unprocessable, whether read in minor or major units, while the same
// digits as a JSON number are read exactly; an absent or null amount stays
// empty.
func TestAmountRefusesJSONStrings(t *testing.T) {
	t.Parallel()
	var p struct {
		Number  Amount `json:"number"`
		String  Amount `json:"string"`
		Decimal Amount `json:"decimal"`
		Quoted  Amount `json:"quoted"`
		Null    Amount `json:"null"`
		Absent  Amount `json:"absent"`
	}
	body := `{"number":1050,"string":"1050","decimal":100.50,"quoted":"100.50","null":null}`
	if err := DecodeJSON([]byte(body), &p); err != nil {
		t.Fatal(err)
	}
	if v, err := AmountMinor(p.Number); err != nil || v != 1050 {
		t.Errorf("AmountMinor(1050) = %d, %v", v, err)
	}
	if v, err := AmountMajor(p.Decimal, "BRL"); err != nil || v != 10050 {
		t.Errorf("AmountMajor(100.50) = %d, %v", v, err)
	}
	if v, err := AmountMinor(p.String); !errors.Is(err, ErrUnprocessable) || !strings.Contains(err.Error(), "bad amount") {
		t.Errorf(`AmountMinor("1050") = %d, %v; want a bad amount`, v, err)
	}
	if v, err := AmountMajor(p.Quoted, "BRL"); !errors.Is(err, ErrUnprocessable) {
		t.Errorf(`AmountMajor("100.50") = %d, %v; want a bad amount`, v, err)
	}
	if p.Null != "" || p.Absent != "" {
		t.Errorf("null and absent amounts = %q, %q; want both empty", p.Null, p.Absent)
	}
	for _, bad := range []string{`{"a":true}`, `{"a":{"b":1}}`, `{"a":[1]}`} {
		var q struct {
			A Amount `json:"a"`
		}
		if err := DecodeJSON([]byte(bad), &q); err != nil {
			continue // refused at decoding: fine too
		}
		if _, err := AmountMinor(q.A); !errors.Is(err, ErrUnprocessable) {
			t.Errorf("AmountMinor of %s = %v, want ErrUnprocessable", bad, err)
		}
	}
}
