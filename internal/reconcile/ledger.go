package reconcile

import (
	"encoding/json"
	"fmt"
	"maps"

	"github.com/paystream/paystream/internal/ledger"
	"github.com/paystream/paystream/internal/payment"
	"github.com/paystream/paystream/internal/store"
)

// PaymentDrift is one payment whose stored rows disagree with its state.
type PaymentDrift struct {
	PaymentKey string `json:"payment_key"`
	Status     string `json:"status"`
	// Problems says what disagrees, one short sentence each.
	Problems []string `json:"problems"`
	// Expected are the balances the state implies and Actual the sums of
	// the ledger movements, per "account/CURRENCY" (debits positive),
	// zero balances left out.
	Expected map[string]int64 `json:"expected_balances"`
	Actual   map[string]int64 `json:"ledger_balances"`
}

// CheckPayment compares a payment's stored rows with what its state
// implies. It is pure: the caller reads row, the sums of the payment's
// ledger movements (actual, as ledger.Balances leaves them) and the span of
// its transitions. ok is false when anything disagrees:
//
//   - the ledger balances differ from row's state's Balances (a movement
//     missing, extra or altered);
//   - the transitions are not exactly versions 1..row.Version;
//   - the queried columns (status, version, amount, currency) differ from
//     the state they are copied from, or the state does not decode.
func CheckPayment(row store.PaymentRow, actual map[ledger.Key]int64, span store.TransitionSpan) (d PaymentDrift, ok bool) {
	d = PaymentDrift{PaymentKey: row.PaymentKey, Status: row.Status, Problems: []string{}}
	var st payment.State
	if err := json.Unmarshal(row.State, &st); err != nil {
		d.Problems = append(d.Problems, fmt.Sprintf("state does not decode: %v", err))
		d.Actual = balanceMap(actual)
		return d, false
	}
	expected := st.Balances()
	if !maps.Equal(expected, actual) {
		d.Problems = append(d.Problems, "ledger movements do not add up to the balances of the payment's state")
	}
	if span.Count != row.Version || span.MaxVersion != row.Version {
		d.Problems = append(d.Problems, fmt.Sprintf("%d transitions up to version %d for a payment at version %d", span.Count, span.MaxVersion, row.Version))
	}
	if string(st.Status) != row.Status || st.Version != row.Version || st.AmountMinor != row.AmountMinor || st.Currency != row.Currency {
		d.Problems = append(d.Problems, fmt.Sprintf("columns say %s v%d %d %s, state says %s v%d %d %s",
			row.Status, row.Version, row.AmountMinor, row.Currency, st.Status, st.Version, st.AmountMinor, st.Currency))
	}
	d.Expected, d.Actual = balanceMap(expected), balanceMap(actual)
	return d, len(d.Problems) == 0
}

// balanceMap keys b by "account/CURRENCY", for JSON.
func balanceMap(b map[ledger.Key]int64) map[string]int64 {
	out := make(map[string]int64, len(b))
	for k, v := range b {
		out[k.String()] = v
	}
	return out
}
