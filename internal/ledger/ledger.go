// Package ledger is paystream's double-entry ledger model: postings that
// balance to zero per transition and currency, and balances derived from
// postings alone. It is pure: no I/O.
package ledger

// Posting is one leg of a double-entry journal entry. AmountMinor is signed
// integer minor units: debits positive, credits negative.
type Posting struct {
	Account     string `json:"account"`
	AmountMinor int64  `json:"amount_minor"`
	Currency    string `json:"currency"`
}
