// Package ledger is paystream's double-entry ledger model: postings that
// balance to zero per transition and currency, and balances derived from
// postings alone. It is pure: no I/O.
//
// # Sign convention
//
// A Posting's AmountMinor is signed integer minor units: debits are
// positive, credits negative. A journal entry (the postings of one payment
// transition) balances when its amounts sum to zero in every currency.
//
// # Chart of accounts
//
// Balances are from the point of view of the platform running paystream: it
// collects card and bank payments through gateways on behalf of merchants.
//
//	account             kind       balance means
//	gateway_receivable  asset      money the gateway owes the platform for
//	                               captured payments, net of refunds and of
//	                               chargebacks it has taken back (debit, > 0)
//	merchant_payable    liability  money the platform owes merchants for their
//	                               payments, net of refunds and disputes
//	                               (credit, < 0; > 0 means the merchant owes)
//	dispute_reserve     liability  money withheld from merchants while a
//	                               dispute is open (credit, < 0)
//
// The journal entries the payment state machine writes (C captured, R
// refunded, D disputed):
//
//	transition     gateway_receivable  merchant_payable  dispute_reserve
//	capture               +C                 -C
//	refund                -R                 +R
//	dispute opened                           +D                -D
//	dispute won                              -D                +D
//	dispute lost          -D                                   +D
//	(lost after won)      -D                 +D
//
// So a payment captured and fully refunded nets to zero everywhere; a lost
// chargeback leaves the gateway owing C-D and the merchant owed C-D.
package ledger

import (
	"cmp"
	"errors"
	"fmt"
	"maps"
	"slices"
)

// The accounts of paystream's chart of accounts; see the package comment.
const (
	// AccountGatewayReceivable is what gateways owe the platform.
	AccountGatewayReceivable = "gateway_receivable"
	// AccountMerchantPayable is what the platform owes merchants.
	AccountMerchantPayable = "merchant_payable"
	// AccountDisputeReserve is money held back from merchants while a
	// dispute is open.
	AccountDisputeReserve = "dispute_reserve"
)

// Posting is one leg of a double-entry journal entry. AmountMinor is signed
// integer minor units: debits positive, credits negative.
type Posting struct {
	Account     string `json:"account"`
	AmountMinor int64  `json:"amount_minor"`
	Currency    string `json:"currency"`
}

// Key identifies one balance: an account in one currency.
type Key struct {
	Account  string
	Currency string
}

// String returns "account/CUR".
func (k Key) String() string { return k.Account + "/" + k.Currency }

// Compare orders keys by account, then currency, for stable output.
func (k Key) Compare(o Key) int {
	if c := cmp.Compare(k.Account, o.Account); c != 0 {
		return c
	}
	return cmp.Compare(k.Currency, o.Currency)
}

// ErrUnbalanced is returned, wrapped, by Balanced and Validate when postings
// do not sum to zero in some currency.
var ErrUnbalanced = errors.New("postings do not balance")

// ErrInvalidPosting is returned, wrapped, by Validate for a posting the
// ledger_postings table would refuse.
var ErrInvalidPosting = errors.New("invalid posting")

// Balanced reports whether ps sum to zero in every currency. The error names
// the first unbalanced currency (in sorted order) and wraps ErrUnbalanced.
// An empty journal is balanced.
func Balanced(ps []Posting) error {
	sums := make(map[string]int64)
	for _, p := range ps {
		sums[p.Currency] += p.AmountMinor
	}
	for _, cur := range slices.Sorted(maps.Keys(sums)) {
		if sums[cur] != 0 {
			return fmt.Errorf("currency %q sums to %d: %w", cur, sums[cur], ErrUnbalanced)
		}
	}
	return nil
}

// Validate checks ps as one journal entry, the way the ledger_postings table
// does: every posting names an account, has a non-zero amount and a currency
// of three upper-case letters; no account appears twice in one currency; and
// the entry is Balanced. Errors wrap ErrInvalidPosting or ErrUnbalanced.
func Validate(ps []Posting) error {
	seen := make(map[Key]bool, len(ps))
	for i, p := range ps {
		k := Key{p.Account, p.Currency}
		switch {
		case p.Account == "":
			return fmt.Errorf("posting %d: missing account: %w", i, ErrInvalidPosting)
		case !isCurrency(p.Currency):
			return fmt.Errorf("posting %d: currency %q not an ISO 4217 code: %w", i, p.Currency, ErrInvalidPosting)
		case p.AmountMinor == 0:
			return fmt.Errorf("posting %d: zero amount: %w", i, ErrInvalidPosting)
		case seen[k]:
			return fmt.Errorf("posting %d: %s posted twice: %w", i, k, ErrInvalidPosting)
		}
		seen[k] = true
	}
	return Balanced(ps)
}

// Balances sums journals into a balance per account and currency. Balances
// that net to zero are left out, so two ledgers with the same balances give
// equal maps (maps.Equal) however their postings were split into entries.
func Balances(journals ...[]Posting) map[Key]int64 {
	b := make(map[Key]int64)
	for _, ps := range journals {
		for _, p := range ps {
			b[Key{p.Account, p.Currency}] += p.AmountMinor
		}
	}
	maps.DeleteFunc(b, func(_ Key, v int64) bool { return v == 0 })
	return b
}

// Keys returns b's keys in Key.Compare order, for stable iteration.
func Keys(b map[Key]int64) []Key {
	return slices.SortedFunc(maps.Keys(b), Key.Compare)
}

func isCurrency(s string) bool {
	if len(s) != 3 {
		return false
	}
	for i := range len(s) {
		if s[i] < 'A' || s[i] > 'Z' {
			return false
		}
	}
	return true
}
