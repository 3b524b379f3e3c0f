package ledger_test

import (
	"errors"
	"maps"
	"testing"

	"github.com/paystream/paystream/internal/ledger"
)

func TestBalanced(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		ps   []ledger.Posting
		want error
	}{
		{"empty", nil, nil},
		{"capture", []ledger.Posting{
			{ledger.AccountGatewayReceivable, 1000, "BRL"},
			{ledger.AccountMerchantPayable, -1000, "BRL"},
		}, nil},
		{"two currencies each balanced", []ledger.Posting{
			{"a", 5, "BRL"}, {"b", -5, "BRL"}, {"a", 7, "USD"}, {"b", -7, "USD"},
		}, nil},
		{"balanced only across currencies", []ledger.Posting{
			{"a", 5, "BRL"}, {"b", -5, "USD"},
		}, ledger.ErrUnbalanced},
		{"one leg", []ledger.Posting{{"a", 5, "BRL"}}, ledger.ErrUnbalanced},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			if err := ledger.Balanced(tt.ps); !errors.Is(err, tt.want) || (tt.want == nil) != (err == nil) {
				t.Fatalf("Balanced() = %v, want %v", err, tt.want)
			}
		})
	}
}

func TestValidate(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		ps   []ledger.Posting
		want error
	}{
		{"ok", []ledger.Posting{{"a", 1, "BRL"}, {"b", -1, "BRL"}}, nil},
		{"missing account", []ledger.Posting{{"", 1, "BRL"}, {"b", -1, "BRL"}}, ledger.ErrInvalidPosting},
		{"lower-case currency", []ledger.Posting{{"a", 1, "brl"}, {"b", -1, "brl"}}, ledger.ErrInvalidPosting},
		{"empty currency", []ledger.Posting{{"a", 1, ""}, {"b", -1, ""}}, ledger.ErrInvalidPosting},
		{"zero amount", []ledger.Posting{{"a", 0, "BRL"}}, ledger.ErrInvalidPosting},
		{"account twice", []ledger.Posting{{"a", 1, "BRL"}, {"a", 1, "BRL"}, {"b", -2, "BRL"}}, ledger.ErrInvalidPosting},
		{"same account two currencies", []ledger.Posting{{"a", 1, "BRL"}, {"b", -1, "BRL"}, {"a", 1, "USD"}, {"b", -1, "USD"}}, nil},
		{"unbalanced", []ledger.Posting{{"a", 2, "BRL"}, {"b", -1, "BRL"}}, ledger.ErrUnbalanced},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			if err := ledger.Validate(tt.ps); !errors.Is(err, tt.want) || (tt.want == nil) != (err == nil) {
				t.Fatalf("Validate() = %v, want %v", err, tt.want)
			}
		})
	}
}

func TestBalances(t *testing.T) {
	t.Parallel()
	capture := []ledger.Posting{{"gr", 1000, "BRL"}, {"mp", -1000, "BRL"}}
	refund := []ledger.Posting{{"gr", -300, "BRL"}, {"mp", 300, "BRL"}}
	usd := []ledger.Posting{{"gr", 5, "USD"}, {"mp", -5, "USD"}}

	got := ledger.Balances(capture, refund, usd)
	want := map[ledger.Key]int64{
		{"gr", "BRL"}: 700, {"mp", "BRL"}: -700,
		{"gr", "USD"}: 5, {"mp", "USD"}: -5,
	}
	if !maps.Equal(got, want) {
		t.Fatalf("Balances() = %v, want %v", got, want)
	}

	// Postings that cancel out leave no entry, so split and unsplit ledgers
	// compare equal.
	reversal := []ledger.Posting{{"gr", -1000, "BRL"}, {"mp", 1000, "BRL"}}
	if got := ledger.Balances(capture, reversal); len(got) != 0 {
		t.Fatalf("Balances(capture, reversal) = %v, want empty", got)
	}
	if got := ledger.Balances(); got == nil || len(got) != 0 {
		t.Fatalf("Balances() = %#v, want empty non-nil map", got)
	}
}

func TestKeys(t *testing.T) {
	t.Parallel()
	b := map[ledger.Key]int64{{"b", "BRL"}: 1, {"a", "USD"}: 1, {"a", "BRL"}: 1}
	got := ledger.Keys(b)
	want := []ledger.Key{{"a", "BRL"}, {"a", "USD"}, {"b", "BRL"}}
	if len(got) != len(want) {
		t.Fatalf("Keys() = %v, want %v", got, want)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("Keys() = %v, want %v", got, want)
		}
	}
}

func TestMovements(t *testing.T) {
	t.Parallel()
	p := func(acct string, amt int64, cur string) ledger.Posting {
		return ledger.Posting{Account: acct, AmountMinor: amt, Currency: cur}
	}
	cases := []struct {
		name string
		in   []ledger.Posting
		want int
		err  error
	}{
		{"empty", nil, 0, nil},
		{"capture", []ledger.Posting{p("merchant_payable", -1000, "BRL"), p("gateway_receivable", 1000, "BRL")}, 1, nil},
		{"three legs", []ledger.Posting{p("a", 5, "BRL"), p("b", 3, "BRL"), p("c", -8, "BRL")}, 2, nil},
		{"two currencies", []ledger.Posting{p("a", 5, "BRL"), p("b", -5, "BRL"), p("a", 7, "USD"), p("b", -7, "USD")}, 2, nil},
		{"unbalanced", []ledger.Posting{p("a", 5, "BRL"), p("b", -4, "BRL")}, 0, ledger.ErrUnbalanced},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			ms, err := ledger.Movements(tc.in)
			if !errors.Is(err, tc.err) {
				t.Fatalf("err %v, want %v", err, tc.err)
			}
			if err != nil {
				return
			}
			if len(ms) != tc.want {
				t.Fatalf("%d movements %v, want %d", len(ms), ms, tc.want)
			}
			if err := ledger.ValidateMovements(ms); err != nil {
				t.Fatal(err)
			}
			if got, want := ledger.Balances(ledger.Postings(ms)), ledger.Balances(tc.in); !maps.Equal(got, want) {
				t.Fatalf("balances %v, want %v", got, want)
			}
		})
	}
}
