// Package ledger is paystream's double-entry ledger model. A money movement
// is one Movement: a debit account, a credit account, a positive amount and
// a currency (TigerBeetle's transfer model), so every entry balances by
// construction. Signed postings per account and balances are views derived
// from movements. It is pure: no I/O.
//
// # Sign convention
//
// A Posting's AmountMinor is signed integer minor units: debits are
// positive, credits negative. A Movement of A from D to C is the postings
// {D: +A, C: -A}. A journal entry (the movements of one payment transition)
// therefore sums to zero in every currency.
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

// Movement moves AmountMinor (> 0) of Currency: it debits Debit and credits
// Credit. It is the one row the ledger stores per money movement.
type Movement struct {
	Debit       string `json:"debit"`
	Credit      string `json:"credit"`
	AmountMinor int64  `json:"amount_minor"`
	Currency    string `json:"currency"`
}

// ErrInvalidMovement is returned, wrapped, by ValidateMovements for a
// movement the ledger_movements table would refuse.
var ErrInvalidMovement = errors.New("invalid movement")

// ValidateMovements checks ms the way the ledger_movements table does: both
// accounts named and different, a positive amount, a currency of three
// upper-case letters. Errors wrap ErrInvalidMovement.
func ValidateMovements(ms []Movement) error {
	for i, m := range ms {
		switch {
		case m.Debit == "" || m.Credit == "":
			return fmt.Errorf("movement %d: missing account: %w", i, ErrInvalidMovement)
		case m.Debit == m.Credit:
			return fmt.Errorf("movement %d: debits and credits %s: %w", i, m.Debit, ErrInvalidMovement)
		case m.AmountMinor <= 0:
			return fmt.Errorf("movement %d: amount %d not positive: %w", i, m.AmountMinor, ErrInvalidMovement)
		case !isCurrency(m.Currency):
			return fmt.Errorf("movement %d: currency %q not an ISO 4217 code: %w", i, m.Currency, ErrInvalidMovement)
		}
	}
	return nil
}

// Movements turns a balanced journal entry into movements: per currency,
// debits (positive postings) and credits (negative ones), each in account
// order, are matched greedily (currencies in order), so n postings make at most n-1 movements,
// always the same ones for the same postings. Postings that do not balance
// fail with ErrUnbalanced. (Migration 004 converts stored postings with the
// same rule.)
func Movements(ps []Posting) ([]Movement, error) {
	if err := Balanced(ps); err != nil {
		return nil, err
	}
	sorted := slices.Clone(ps)
	slices.SortFunc(sorted, func(a, b Posting) int { return Key{a.Account, a.Currency}.Compare(Key{b.Account, b.Currency}) })
	var out []Movement
	for _, cur := range currencies(sorted) {
		var debits, credits []Posting
		for _, p := range sorted {
			switch {
			case p.Currency != cur:
			case p.AmountMinor > 0:
				debits = append(debits, p)
			case p.AmountMinor < 0:
				credits = append(credits, Posting{p.Account, -p.AmountMinor, p.Currency})
			}
		}
		for len(debits) > 0 && len(credits) > 0 {
			d, c := &debits[0], &credits[0]
			amt := min(d.AmountMinor, c.AmountMinor)
			out = append(out, Movement{Debit: d.Account, Credit: c.Account, AmountMinor: amt, Currency: cur})
			d.AmountMinor -= amt
			c.AmountMinor -= amt
			if d.AmountMinor == 0 {
				debits = debits[1:]
			}
			if c.AmountMinor == 0 {
				credits = credits[1:]
			}
		}
	}
	return out, nil
}

// Postings returns the signed postings of ms, two per movement (the debit,
// then the credit), in order: the per-account view of the movements.
func Postings(ms []Movement) []Posting {
	ps := make([]Posting, 0, 2*len(ms))
	for _, m := range ms {
		ps = append(ps,
			Posting{Account: m.Debit, AmountMinor: m.AmountMinor, Currency: m.Currency},
			Posting{Account: m.Credit, AmountMinor: -m.AmountMinor, Currency: m.Currency})
	}
	return ps
}

// currencies returns the currencies of ps, sorted.
func currencies(ps []Posting) []string {
	set := make(map[string]bool, 1)
	for _, p := range ps {
		set[p.Currency] = true
	}
	return slices.Sorted(maps.Keys(set))
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

// ErrInvalidPosting is returned, wrapped, by Validate for a malformed posting.
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

// Validate checks ps as one journal entry: every posting names an account, has a non-zero amount and a currency
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
