package reconcile

import (
	"encoding/json"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/paystream/paystream/internal/ledger"
	"github.com/paystream/paystream/internal/payment"
	"github.com/paystream/paystream/internal/store"
)

// stored is what the processor stores for a payment after facts: its row,
// the balances of its transitions' movements and their span.
func stored(t *testing.T, facts ...payment.Fact) (store.PaymentRow, map[ledger.Key]int64, store.TransitionSpan) {
	t.Helper()
	r := payment.Machine{}.Replay(payment.State{}, facts)
	var journals [][]ledger.Posting
	for _, tr := range r.Transitions {
		journals = append(journals, ledger.Postings(tr.Movements))
	}
	st, err := json.Marshal(r.State)
	if err != nil {
		t.Fatal(err)
	}
	row := store.PaymentRow{PaymentHead: store.PaymentHead{PaymentKey: "acme:p", Status: string(r.State.Status),
		Version: r.State.Version, AmountMinor: r.State.AmountMinor, Currency: r.State.Currency}, State: st}
	return row, ledger.Balances(journals...), store.TransitionSpan{Count: int64(len(r.Transitions)), MaxVersion: r.State.Version}
}

func fact(status payment.Status, amount int64, refundID string) payment.Fact {
	return payment.Fact{Status: status, AmountMinor: amount, Currency: "BRL", RefundID: refundID, OccurredAt: time.Unix(1, 0)}
}

// TestCheckPayment: what the machine stores is consistent for every kind
// of payment, and each kind of damage to the stored rows is named.
func TestCheckPayment(t *testing.T) {
	histories := map[string][]payment.Fact{
		"pending":            {fact(payment.StatusPending, 900, "")},
		"paid":               {fact(payment.StatusPaid, 900, "")},
		"partially refunded": {fact(payment.StatusPaid, 900, ""), fact(payment.StatusPartiallyRefunded, 300, "r1")},
		"refunded":           {fact(payment.StatusPaid, 900, ""), fact(payment.StatusRefunded, 0, "")},
		"dispute lost":       {fact(payment.StatusPaid, 900, ""), fact(payment.StatusDisputed, 900, ""), fact(payment.StatusDisputeLost, 0, "")},
	}
	for name, facts := range histories {
		row, bal, span := stored(t, facts...)
		if d, ok := CheckPayment(row, bal, span); !ok {
			t.Errorf("%s: healthy payment reported: %+v", name, d)
		}
	}

	row, bal, span := stored(t, histories["refunded"]...)
	capture := ledger.Balances(ledger.Postings([]ledger.Movement{{Debit: ledger.AccountGatewayReceivable, Credit: ledger.AccountMerchantPayable, AmountMinor: 900, Currency: "BRL"}}))
	if len(bal) != 0 {
		t.Fatalf("a refunded payment's ledger nets to %v, want zero everywhere", bal)
	}
	cases := []struct {
		name   string
		row    store.PaymentRow
		bal    map[ledger.Key]int64
		span   store.TransitionSpan
		reason string
	}{
		{"refund movement lost", row, capture, span, "ledger movements do not add up"},
		{"transition lost", row, bal, store.TransitionSpan{Count: 1, MaxVersion: 2}, "1 transitions up to version 2"},
		{"status column changed", func() store.PaymentRow { r := row; r.Status = "paid"; return r }(), bal, span, "columns say paid"},
		{"state unreadable", func() store.PaymentRow { r := row; r.State = []byte("{"); return r }(), bal, span, "state does not decode"},
	}
	for _, c := range cases {
		d, ok := CheckPayment(c.row, c.bal, c.span)
		if ok || !slices.ContainsFunc(d.Problems, func(p string) bool { return strings.Contains(p, c.reason) }) {
			t.Errorf("%s: ok %v, problems %q; want one containing %q", c.name, ok, d.Problems, c.reason)
		}
	}
	d, _ := CheckPayment(row, capture, span)
	if len(d.Expected) != 0 || d.Actual["gateway_receivable/BRL"] != 900 || d.Actual["merchant_payable/BRL"] != -900 {
		t.Errorf("refund lost: expected %v, actual %v; want none expected and the capture left", d.Expected, d.Actual)
	}
}
