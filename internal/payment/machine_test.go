package payment_test

import (
	"reflect"
	"slices"
	"testing"
	"time"

	"github.com/paystream/paystream/internal/ledger"
	"github.com/paystream/paystream/internal/payment"
)

const (
	pending    = payment.StatusPending
	authorized = payment.StatusAuthorized
	paid       = payment.StatusPaid
	failed     = payment.StatusFailed
	canceled   = payment.StatusCanceled
	refunded   = payment.StatusRefunded
	partially  = payment.StatusPartiallyRefunded
	disputed   = payment.StatusDisputed
	won        = payment.StatusDisputeWon
	lost       = payment.StatusDisputeLost

	applied  = payment.OutcomeApplied
	ignored  = payment.OutcomeIgnored
	deferred = payment.OutcomeDeferred
)

// applyCase is one rule: a payment reached by applying given (each must
// apply), the fact offered, and what Apply must decide. For applied facts the
// status, transition kind and amount, postings and, if set, refunds are
// checked too.
type applyCase struct {
	name     string
	given    []payment.Fact
	fact     payment.Fact
	outcome  payment.Outcome
	reason   string
	status   payment.Status
	kind     string
	amount   int64
	postings []ledger.Posting
	check    func(t *testing.T, s payment.State)
}

func refunds(ids []string, amounts map[string]int64, full bool, refundedMinor int64) func(*testing.T, payment.State) {
	return func(t *testing.T, s payment.State) {
		t.Helper()
		if !slices.Equal(s.Refunds, ids) || !reflect.DeepEqual(s.RefundAmounts, amounts) || s.FullRefund != full || s.RefundedMinor != refundedMinor {
			t.Errorf("refunds = %v %v full=%v refunded=%d, want %v %v full=%v refunded=%d",
				s.Refunds, s.RefundAmounts, s.FullRefund, s.RefundedMinor, ids, amounts, full, refundedMinor)
		}
	}
}

var applyCases = []applyCase{
	// A payment never seen starts where its first applicable fact says.
	{name: "unseen paid", fact: st(paid, 1000), outcome: applied, status: paid,
		kind: payment.KindCapture, amount: 1000, postings: posts(1000, -1000, 0)},
	{name: "unseen pending", fact: st(pending, 1000), outcome: applied, status: pending, kind: payment.KindStatus, amount: 1000},
	{name: "unseen authorized", fact: st(authorized, 1000), outcome: applied, status: authorized, kind: payment.KindStatus, amount: 1000},
	{name: "unseen failed", fact: st(failed, 0), outcome: applied, status: failed, kind: payment.KindStatus},
	{name: "unseen canceled", fact: st(canceled, 1000), outcome: applied, status: canceled, kind: payment.KindStatus, amount: 1000},
	{name: "unseen refunded", fact: fullRefund(), outcome: deferred, reason: payment.ReasonNeedsPredecessor},
	{name: "unseen partial refund", fact: refund("r1", 300), outcome: deferred, reason: payment.ReasonNeedsPredecessor},
	{name: "unseen disputed", fact: st(disputed, 1000), outcome: deferred, reason: payment.ReasonNeedsPredecessor},
	{name: "unseen dispute won", fact: st(won, 1000), outcome: deferred, reason: payment.ReasonNeedsPredecessor},
	{name: "unseen dispute lost", fact: st(lost, 1000), outcome: deferred, reason: payment.ReasonNeedsPredecessor},

	// Forward steps.
	{name: "pending to authorized", given: []payment.Fact{st(pending, 1000)}, fact: st(authorized, 1000),
		outcome: applied, status: authorized, kind: payment.KindStatus, amount: 1000},
	{name: "authorized to paid", given: []payment.Fact{st(pending, 1000), st(authorized, 1000)}, fact: st(paid, 1000),
		outcome: applied, status: paid, kind: payment.KindCapture, amount: 1000, postings: posts(1000, -1000, 0)},
	{name: "pending skips to paid", given: []payment.Fact{st(pending, 1000)}, fact: st(paid, 1000),
		outcome: applied, status: paid, kind: payment.KindCapture, amount: 1000, postings: posts(1000, -1000, 0)},
	{name: "partial capture", given: []payment.Fact{st(authorized, 1000)}, fact: st(paid, 800),
		outcome: applied, status: paid, kind: payment.KindCapture, amount: 800, postings: posts(800, -800, 0),
		check: func(t *testing.T, s payment.State) {
			if s.AmountMinor != 800 || s.CapturedMinor != 800 {
				t.Errorf("amount %d captured %d, want 800 800", s.AmountMinor, s.CapturedMinor)
			}
		}},
	{name: "pending to failed", given: []payment.Fact{st(pending, 1000)}, fact: st(failed, 1000), outcome: applied, status: failed, kind: payment.KindStatus, amount: 1000},
	{name: "authorized to canceled", given: []payment.Fact{st(authorized, 1000)}, fact: st(canceled, 1000), outcome: applied, status: canceled, kind: payment.KindStatus, amount: 1000},
	{name: "failed to canceled", given: []payment.Fact{st(failed, 1000)}, fact: st(canceled, 1000), outcome: applied, status: canceled, kind: payment.KindStatus, amount: 1000},
	{name: "thin fact keeps amount", given: []payment.Fact{st(pending, 1000)}, fact: payment.Fact{Status: authorized},
		outcome: applied, status: authorized, kind: payment.KindStatus, amount: 1000},
	{name: "currency from a later fact", given: []payment.Fact{{Status: pending}}, fact: st(paid, 1000),
		outcome: applied, status: paid, kind: payment.KindCapture, amount: 1000, postings: posts(1000, -1000, 0)},
	{name: "paid without currency uses the payment's", given: []payment.Fact{st(pending, 1000)}, fact: payment.Fact{Status: paid, AmountMinor: 1000},
		outcome: applied, status: paid, kind: payment.KindCapture, amount: 1000, postings: posts(1000, -1000, 0)},

	// Failed and canceled are terminal unless the payment gets paid.
	{name: "paid after failed", given: []payment.Fact{st(failed, 1000)}, fact: st(paid, 1000),
		outcome: applied, status: paid, kind: payment.KindCapture, amount: 1000, postings: posts(1000, -1000, 0)},
	{name: "paid after canceled", given: []payment.Fact{st(pending, 1000), st(canceled, 1000)}, fact: st(paid, 1000),
		outcome: applied, status: paid, kind: payment.KindCapture, amount: 1000, postings: posts(1000, -1000, 0)},
	{name: "failed after paid", given: []payment.Fact{st(paid, 1000)}, fact: st(failed, 1000), outcome: ignored, reason: payment.ReasonStale},
	{name: "canceled after paid", given: []payment.Fact{st(paid, 1000)}, fact: st(canceled, 1000), outcome: ignored, reason: payment.ReasonStale},
	{name: "pending after failed", given: []payment.Fact{st(failed, 1000)}, fact: st(pending, 1000), outcome: ignored, reason: payment.ReasonStale},
	{name: "authorized after failed", given: []payment.Fact{st(failed, 1000)}, fact: st(authorized, 1000), outcome: ignored, reason: payment.ReasonStale},
	{name: "failed after canceled", given: []payment.Fact{st(canceled, 1000)}, fact: st(failed, 1000), outcome: ignored, reason: payment.ReasonStale},

	// Duplicates and stale facts.
	{name: "paid twice (Asaas confirmed, received)", given: []payment.Fact{st(paid, 1000)}, fact: st(paid, 1000), outcome: ignored, reason: payment.ReasonDuplicateFact},
	{name: "paid again without amount", given: []payment.Fact{st(paid, 1000)}, fact: payment.Fact{Status: paid}, outcome: ignored, reason: payment.ReasonDuplicateFact},
	{name: "paid again, other amount", given: []payment.Fact{st(paid, 1000)}, fact: st(paid, 970), outcome: ignored, reason: payment.ReasonAmountMismatch},
	{name: "pending twice", given: []payment.Fact{st(pending, 1000)}, fact: st(pending, 1000), outcome: ignored, reason: payment.ReasonDuplicateFact},
	{name: "pending after paid", given: []payment.Fact{st(paid, 1000)}, fact: st(pending, 1000), outcome: ignored, reason: payment.ReasonStale},
	{name: "authorized after paid", given: []payment.Fact{st(paid, 1000)}, fact: st(authorized, 1000), outcome: ignored, reason: payment.ReasonStale},
	{name: "pending after authorized", given: []payment.Fact{st(authorized, 1000)}, fact: st(pending, 1000), outcome: ignored, reason: payment.ReasonStale},
	{name: "paid after partial refund", given: []payment.Fact{st(paid, 1000), refund("r1", 300)}, fact: st(paid, 1000), outcome: ignored, reason: payment.ReasonStale},
	{name: "paid after refunded", given: []payment.Fact{st(paid, 1000), fullRefund()}, fact: st(paid, 1000), outcome: ignored, reason: payment.ReasonStale},
	{name: "paid while disputed", given: []payment.Fact{st(paid, 1000), st(disputed, 1000)}, fact: st(paid, 1000), outcome: ignored, reason: payment.ReasonStale},

	// A thin fact first, then the details it lacked.
	{name: "amount after thin fact", given: []payment.Fact{{Status: pending}}, fact: st(pending, 1000),
		outcome: applied, status: pending, kind: payment.KindDetails, amount: 1000},
	{name: "amount from a stale fact", given: []payment.Fact{{Status: canceled}}, fact: st(pending, 1000),
		outcome: applied, status: canceled, kind: payment.KindDetails, amount: 1000},
	{name: "currency from a stale fact", given: []payment.Fact{{Status: failed, AmountMinor: 1000}}, fact: st(authorized, 1000),
		outcome: applied, status: failed, kind: payment.KindDetails, amount: 1000},
	{name: "stale fact with nothing new", given: []payment.Fact{st(failed, 1000)}, fact: payment.Fact{Status: pending, AmountMinor: 1000},
		outcome: ignored, reason: payment.ReasonStale},
	{name: "stale fact, other amount", given: []payment.Fact{st(failed, 1000)}, fact: st(pending, 1200),
		outcome: ignored, reason: payment.ReasonStale},

	// Amounts and currencies.
	{name: "paid without amount", fact: payment.Fact{Status: paid, Currency: "BRL"}, outcome: deferred, reason: payment.ReasonAmountUnknown},
	{name: "paid without amount after pending", given: []payment.Fact{st(pending, 1000)}, fact: payment.Fact{Status: paid, Currency: "BRL"},
		outcome: deferred, reason: payment.ReasonAmountUnknown},
	{name: "paid without currency", fact: payment.Fact{Status: paid, AmountMinor: 1000}, outcome: deferred, reason: payment.ReasonAmountUnknown},
	{name: "currency mismatch on status", given: []payment.Fact{st(pending, 1000)}, fact: payment.Fact{Status: paid, AmountMinor: 1000, Currency: "USD"},
		outcome: ignored, reason: payment.ReasonCurrencyMismatch},
	{name: "currency mismatch on refund", given: []payment.Fact{st(paid, 1000)}, fact: payment.Fact{Status: partially, RefundID: "r1", AmountMinor: 100, Currency: "USD"},
		outcome: ignored, reason: payment.ReasonCurrencyMismatch},
	{name: "refund without currency", given: []payment.Fact{st(paid, 1000)}, fact: payment.Fact{Status: partially, RefundID: "r1", AmountMinor: 100},
		outcome: applied, status: partially, kind: payment.KindRefund, amount: 100, postings: posts(-100, 100, 0)},

	// Malformed facts.
	{name: "unknown status", fact: payment.Fact{Status: "chargeback", AmountMinor: 1, Currency: "BRL"}, outcome: ignored, reason: payment.ReasonInvalidFact},
	{name: "empty status", fact: payment.Fact{}, outcome: ignored, reason: payment.ReasonInvalidFact},
	{name: "negative amount", fact: st(paid, -1000), outcome: ignored, reason: payment.ReasonInvalidFact},
	{name: "amount too large", fact: st(paid, payment.MaxAmountMinor+1), outcome: ignored, reason: payment.ReasonInvalidFact},
	{name: "largest amount", fact: st(paid, payment.MaxAmountMinor), outcome: applied, status: paid, kind: payment.KindCapture,
		amount: payment.MaxAmountMinor, postings: posts(payment.MaxAmountMinor, -payment.MaxAmountMinor, 0)},
	{name: "lower-case currency", fact: payment.Fact{Status: paid, AmountMinor: 1, Currency: "brl"}, outcome: ignored, reason: payment.ReasonInvalidFact},
	{name: "long currency", fact: payment.Fact{Status: paid, AmountMinor: 1, Currency: "BRLX"}, outcome: ignored, reason: payment.ReasonInvalidFact},

	// Refunds with ids: additive, once each, never more than captured.
	{name: "partial refund", given: []payment.Fact{st(paid, 1000)}, fact: refund("r1", 300),
		outcome: applied, status: partially, kind: payment.KindRefund, amount: 300, postings: posts(-300, 300, 0),
		check: refunds([]string{"r1"}, map[string]int64{"r1": 300}, false, 300)},
	{name: "second partial refund completes", given: []payment.Fact{st(paid, 1000), refund("r1", 300)}, fact: refund("r2", 700),
		outcome: applied, status: refunded, kind: payment.KindRefund, amount: 700, postings: posts(-700, 700, 0),
		check: refunds([]string{"r1", "r2"}, map[string]int64{"r1": 300, "r2": 700}, false, 1000)},
	{name: "refunded fact with id and amount", given: []payment.Fact{st(paid, 1000), refund("r1", 300)},
		fact:    payment.Fact{Status: refunded, RefundID: "r2", AmountMinor: 200, Currency: "BRL"},
		outcome: applied, status: partially, kind: payment.KindRefund, amount: 200, postings: posts(-200, 200, 0)},
	{name: "refund id twice", given: []payment.Fact{st(paid, 1000), refund("r1", 300)}, fact: refund("r1", 300), outcome: ignored, reason: payment.ReasonDuplicateFact},
	{name: "refund id again after full refund is not stale", given: []payment.Fact{st(paid, 1000), refund("r1", 300), refund("r2", 700)},
		fact: refund("r1", 300), outcome: ignored, reason: payment.ReasonDuplicateFact},
	{name: "refund id again, other amount", given: []payment.Fact{st(paid, 1000), refund("r1", 300)}, fact: refund("r1", 400), outcome: ignored, reason: payment.ReasonAmountMismatch},
	{name: "over-refund", given: []payment.Fact{st(paid, 1000), refund("r1", 600)}, fact: refund("r2", 600), outcome: ignored, reason: payment.ReasonRefundExceedsPaid},
	{name: "refund above capture", given: []payment.Fact{st(paid, 1000)}, fact: refund("r1", 1001), outcome: ignored, reason: payment.ReasonRefundExceedsPaid},
	{name: "refund before paid", given: []payment.Fact{st(pending, 1000)}, fact: refund("r1", 300), outcome: deferred, reason: payment.ReasonNeedsPredecessor},
	{name: "refund after failed", given: []payment.Fact{st(failed, 1000)}, fact: refund("r1", 300), outcome: deferred, reason: payment.ReasonNeedsPredecessor},
	{name: "partial refund without amount", given: []payment.Fact{st(paid, 1000)}, fact: refund("r1", 0), outcome: deferred, reason: payment.ReasonAmountUnknown},
	{name: "partial refund without amount, id known", given: []payment.Fact{st(paid, 1000), refund("r1", 300)}, fact: refund("r1", 0),
		outcome: ignored, reason: payment.ReasonDuplicateFact},
	{name: "partially refunded without id", given: []payment.Fact{st(paid, 1000)}, fact: payment.Fact{Status: partially, AmountMinor: 1000, Currency: "BRL"},
		outcome: deferred, reason: payment.ReasonMissingRefundID},
	{name: "partially refunded without id after a refund", given: []payment.Fact{st(paid, 1000), refund("r1", 300)},
		fact: payment.Fact{Status: partially, AmountMinor: 1000, Currency: "BRL"}, outcome: ignored, reason: payment.ReasonDuplicateFact},

	// Refunded without id: a full refund of the remainder, applied once.
	{name: "full refund", given: []payment.Fact{st(paid, 1000)}, fact: fullRefund(),
		outcome: applied, status: refunded, kind: payment.KindRefund, amount: 1000, postings: posts(-1000, 1000, 0),
		check: refunds([]string{payment.FullRefundID}, nil, true, 1000)},
	{name: "full refund ignores its amount", given: []payment.Fact{st(paid, 1000), refund("r1", 300)},
		fact:    payment.Fact{Status: refunded, AmountMinor: 1000, Currency: "BRL"},
		outcome: applied, status: refunded, kind: payment.KindRefund, amount: 700, postings: posts(-700, 700, 0),
		check: refunds([]string{payment.FullRefundID, "r1"}, map[string]int64{"r1": 300}, true, 1000)},
	{name: "full refund twice", given: []payment.Fact{st(paid, 1000), fullRefund()}, fact: fullRefund(), outcome: ignored, reason: payment.ReasonDuplicateFact},
	{name: "full refund after refunds completed", given: []payment.Fact{st(paid, 1000), refund("r1", 300), refund("r2", 700)},
		fact: fullRefund(), outcome: ignored, reason: payment.ReasonDuplicateFact},
	{name: "refund with amount after full refund", given: []payment.Fact{st(paid, 1000), fullRefund()}, fact: refund("r1", 300),
		outcome: applied, status: refunded, kind: payment.KindRefundIdentified, amount: 300,
		check: refunds([]string{payment.FullRefundID, "r1"}, map[string]int64{"r1": 300}, true, 1000)},
	{name: "refunds with amounts explain the full refund", given: []payment.Fact{st(paid, 1000), fullRefund(), refund("r1", 300)}, fact: refund("r2", 700),
		outcome: applied, status: refunded, kind: payment.KindRefundIdentified, amount: 700,
		check: refunds([]string{"r1", "r2"}, map[string]int64{"r1": 300, "r2": 700}, false, 1000)},
	{name: "over-refund after full refund", given: []payment.Fact{st(paid, 1000), fullRefund(), refund("r1", 300)}, fact: refund("r2", 800),
		outcome: ignored, reason: payment.ReasonRefundExceedsPaid},
	{name: "full refund with id", given: []payment.Fact{st(paid, 1000), refund("r1", 300)},
		fact:    payment.Fact{Status: refunded, RefundID: "re_9", Currency: "BRL"},
		outcome: applied, status: refunded, kind: payment.KindRefund, amount: 700, postings: posts(-700, 700, 0),
		check: refunds([]string{"r1", "re_9"}, map[string]int64{"r1": 300}, true, 1000)},
	{name: "full refund's id gets its amount", given: []payment.Fact{st(paid, 1000), payment.Fact{Status: refunded, RefundID: "re_9", Currency: "BRL"}},
		fact: refund("re_9", 700), outcome: applied, status: refunded, kind: payment.KindRefundIdentified, amount: 700,
		check: refunds([]string{"re_9"}, map[string]int64{"re_9": 700}, true, 1000)},
	{name: "full refund for an id with amount", given: []payment.Fact{st(paid, 1000), refund("re_9", 700)},
		fact:    payment.Fact{Status: refunded, RefundID: "re_9", Currency: "BRL"},
		outcome: applied, status: refunded, kind: payment.KindRefund, amount: 300, postings: posts(-300, 300, 0),
		check: refunds([]string{"re_9"}, map[string]int64{"re_9": 700}, true, 1000)},
	{name: "second full refund id is recorded", given: []payment.Fact{st(paid, 1000), fullRefund()},
		fact:    payment.Fact{Status: refunded, RefundID: "re_9", Currency: "BRL"},
		outcome: applied, status: refunded, kind: payment.KindRefundIdentified, amount: 0,
		check: refunds([]string{payment.FullRefundID, "re_9"}, nil, true, 1000)},

	// Disputes.
	{name: "dispute", given: []payment.Fact{st(paid, 1000)}, fact: st(disputed, 1000),
		outcome: applied, status: disputed, kind: payment.KindDispute, amount: 1000, postings: posts(0, 1000, -1000)},
	{name: "partial dispute", given: []payment.Fact{st(paid, 1000)}, fact: st(disputed, 400),
		outcome: applied, status: disputed, kind: payment.KindDispute, amount: 400, postings: posts(0, 400, -400)},
	{name: "dispute capped at the capture", given: []payment.Fact{st(authorized, 1000), st(paid, 800)}, fact: st(disputed, 1000),
		outcome: applied, status: disputed, kind: payment.KindDispute, amount: 800, postings: posts(0, 800, -800)},
	{name: "dispute without amount", given: []payment.Fact{st(paid, 1000)}, fact: st(disputed, 0), outcome: deferred, reason: payment.ReasonAmountUnknown},
	{name: "dispute before paid", given: []payment.Fact{st(authorized, 1000)}, fact: st(disputed, 1000), outcome: deferred, reason: payment.ReasonNeedsPredecessor},
	{name: "dispute won before dispute", given: []payment.Fact{st(paid, 1000)}, fact: st(won, 1000), outcome: deferred, reason: payment.ReasonNeedsPredecessor},
	{name: "dispute lost before dispute", given: []payment.Fact{st(paid, 1000)}, fact: st(lost, 1000), outcome: deferred, reason: payment.ReasonNeedsPredecessor},
	{name: "dispute won", given: []payment.Fact{st(paid, 1000), st(disputed, 1000)}, fact: st(won, 1000),
		outcome: applied, status: won, kind: payment.KindDisputeWon, amount: 1000, postings: posts(0, -1000, 1000)},
	{name: "dispute lost", given: []payment.Fact{st(paid, 1000), st(disputed, 1000)}, fact: st(lost, 0),
		outcome: applied, status: lost, kind: payment.KindDisputeLost, amount: 1000, postings: posts(-1000, 0, 1000)},
	{name: "dispute lost after won", given: []payment.Fact{st(paid, 1000), st(disputed, 400), st(won, 400)}, fact: st(lost, 400),
		outcome: applied, status: lost, kind: payment.KindDisputeLost, amount: 400, postings: posts(-400, 400, 0)},
	{name: "dispute won after lost", given: []payment.Fact{st(paid, 1000), st(disputed, 1000), st(lost, 1000)}, fact: st(won, 1000), outcome: ignored, reason: payment.ReasonStale},
	{name: "dispute twice", given: []payment.Fact{st(paid, 1000), st(disputed, 1000)}, fact: st(disputed, 1000), outcome: ignored, reason: payment.ReasonDuplicateFact},
	{name: "dispute after won", given: []payment.Fact{st(paid, 1000), st(disputed, 1000), st(won, 1000)}, fact: st(disputed, 1000), outcome: ignored, reason: payment.ReasonStale},
	{name: "dispute won twice", given: []payment.Fact{st(paid, 1000), st(disputed, 1000), st(won, 1000)}, fact: st(won, 1000), outcome: ignored, reason: payment.ReasonDuplicateFact},
	{name: "dispute lost twice", given: []payment.Fact{st(paid, 1000), st(disputed, 1000), st(lost, 1000)}, fact: st(lost, 1000), outcome: ignored, reason: payment.ReasonDuplicateFact},
	{name: "refund during dispute", given: []payment.Fact{st(paid, 1000), st(disputed, 500)}, fact: refund("r1", 300),
		outcome: applied, status: disputed, kind: payment.KindRefund, amount: 300, postings: posts(-300, 300, 0)},
	{name: "dispute after partial refund", given: []payment.Fact{st(paid, 1000), refund("r1", 300)}, fact: st(disputed, 700),
		outcome: applied, status: disputed, kind: payment.KindDispute, amount: 700, postings: posts(0, 700, -700)},
	{name: "partial refund after won dispute", given: []payment.Fact{st(paid, 1000), st(disputed, 1000), st(won, 1000)}, fact: refund("r1", 300),
		outcome: applied, status: partially, kind: payment.KindRefund, amount: 300, postings: posts(-300, 300, 0)},
	{name: "full refund after won dispute", given: []payment.Fact{st(paid, 1000), st(disputed, 1000), st(won, 1000)}, fact: fullRefund(),
		outcome: applied, status: refunded, kind: payment.KindRefund, amount: 1000, postings: posts(-1000, 1000, 0)},
	{name: "refund after lost dispute", given: []payment.Fact{st(paid, 1000), st(disputed, 1000), st(lost, 1000)}, fact: refund("r1", 300),
		outcome: applied, status: lost, kind: payment.KindRefund, amount: 300, postings: posts(-300, 300, 0)},
}

func TestMachineApply(t *testing.T) {
	t.Parallel()
	var m payment.Machine
	for _, tc := range applyCases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			s := mustApply(t, tc.given)
			f := tc.fact
			f.OccurredAt = t0.Add(time.Hour)
			before := deepCopy(s)
			d := m.Apply(s, f)
			if err := checkDecision(before, s, d); err != nil {
				t.Fatal(err)
			}
			if d.Outcome != tc.outcome || d.Reason != tc.reason {
				t.Fatalf("Apply() = %s %q, want %s %q", d.Outcome, d.Reason, tc.outcome, tc.reason)
			}
			if d.Outcome != payment.OutcomeApplied {
				return
			}
			tr := d.Transitions[0]
			if d.State.Status != tc.status || tr.Kind != tc.kind || tr.AmountMinor != tc.amount {
				t.Fatalf("applied to %s, %s %d; want %s, %s %d", d.State.Status, tr.Kind, tr.AmountMinor, tc.status, tc.kind, tc.amount)
			}
			if !slices.Equal(tr.Postings(), tc.postings) {
				t.Fatalf("postings = %v, want %v", tr.Postings(), tc.postings)
			}
			if tr.Currency != "BRL" || d.State.Currency != "BRL" {
				t.Fatalf("currency = %q, state %q; want BRL", tr.Currency, d.State.Currency)
			}
			if want := int64(len(tc.given) + 1); d.State.Version != want {
				t.Fatalf("version = %d, want %d", d.State.Version, want)
			}
			if !d.State.LastEventAt.Equal(f.OccurredAt) {
				t.Fatalf("last event at = %v, want %v", d.State.LastEventAt, f.OccurredAt)
			}
			if tc.check != nil {
				tc.check(t, d.State)
			}
		})
	}
}

// TestApplyLastEventAt checks LastEventAt only moves forward: a late fact
// that still applies (a refund) does not take it back.
func TestApplyLastEventAt(t *testing.T) {
	t.Parallel()
	var m payment.Machine
	p := st(paid, 1000)
	p.OccurredAt = t0.Add(time.Hour)
	r := refund("r1", 100)
	r.OccurredAt = t0
	d := m.Apply(payment.State{}, p)
	d = m.Apply(d.State, r)
	if d.Outcome != applied || !d.State.LastEventAt.Equal(p.OccurredAt) {
		t.Fatalf("%s, last event at %v; want applied, %v", d.Outcome, d.State.LastEventAt, p.OccurredAt)
	}
}

// TestStateJSON checks a State survives the store's JSON round trip, which
// the machine relies on between transactions.
func TestStateJSON(t *testing.T) {
	t.Parallel()
	s := mustApply(t, []payment.Fact{st(paid, 1000), fullRefund(), refund("r1", 300), st(disputed, 500)})
	got := roundTrip(t, s)
	if !reflect.DeepEqual(got, s) {
		t.Fatalf("round trip = %+v, want %+v", got, s)
	}
	var m payment.Machine
	if d1, d2 := m.Apply(s, refund("r2", 700)), m.Apply(got, refund("r2", 700)); !reflect.DeepEqual(d1, d2) {
		t.Fatalf("decisions differ after round trip: %+v vs %+v", d1, d2)
	}
}
