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
