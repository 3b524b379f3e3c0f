package payment_test

import (
	"encoding/binary"
	"maps"
	"math/rand/v2"
	"reflect"
	"slices"
	"testing"
	"time"

	"github.com/paystream/paystream/internal/ledger"
	"github.com/paystream/paystream/internal/payment"
	"github.com/paystream/paystream/internal/payment/paymenttest"
)

// The fuzz encoding of a fact sequence: per fact, a status byte, a flags
// byte (currency, refund id, sign), a minute byte and the amount as a
// uvarint. Indexes wrap, so every input decodes.
var (
	fuzzStatuses   = append(slices.Clone(soupStatuses), "")
	fuzzCurrencies = []string{"", "BRL", "USD", "brl"}
	fuzzRefundIDs  = []string{"", "r1", "r2", "re_9", payment.FullRefundID, "re_x"}
)

func decodeFacts(b []byte) []payment.Fact {
	var facts []payment.Fact
	for len(b) >= 4 && len(facts) < 64 {
		amount, n := binary.Uvarint(b[3:])
		if n <= 0 {
			break
		}
		f := payment.Fact{
			Status:      fuzzStatuses[int(b[0])%len(fuzzStatuses)],
			Currency:    fuzzCurrencies[int(b[1]&3)],
			RefundID:    fuzzRefundIDs[int(b[1]>>2&7)%len(fuzzRefundIDs)],
			AmountMinor: int64(amount),
			OccurredAt:  t0.Add(time.Duration(b[2]) * time.Minute),
		}
		if b[1]&0x80 != 0 {
			f.AmountMinor = -f.AmountMinor
		}
		facts = append(facts, f)
		b = b[3+n:]
	}
	return facts
}

// encodeFacts is decodeFacts' inverse for the facts it can express; ok is
// false otherwise.
func encodeFacts(facts []payment.Fact) (b []byte, ok bool) {
	for i, f := range facts {
		st, cur, id := slices.Index(fuzzStatuses, f.Status), slices.Index(fuzzCurrencies, f.Currency), slices.Index(fuzzRefundIDs, f.RefundID)
		if st < 0 || cur < 0 || id < 0 {
			return nil, false
		}
		flags := byte(cur) | byte(id)<<2
		amount := f.AmountMinor
		if amount < 0 {
			flags |= 0x80
			amount = -amount
		}
		b = append(b, byte(st), flags, byte(i))
		b = binary.AppendUvarint(b, uint64(amount))
	}
	return b, true
}

// FuzzReplay replays any fact sequence and checks the invariants every
// replay keeps (checkReplay), determinism, and that the final state survives
// the store's JSON round trip. The table of TestMachineApply is the seed
// corpus.
func FuzzReplay(f *testing.F) {
	for _, tc := range applyCases {
		if b, ok := encodeFacts(append(slices.Clone(tc.given), tc.fact)); ok {
			f.Add(b)
		}
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		facts := decodeFacts(data)
		var m payment.Machine
		got := m.Replay(payment.State{}, facts)
		if err := checkReplay(facts, got); err != nil {
			t.Fatalf("%v\nfacts:%s", err, fmtFacts(facts))
		}
		if again := m.Replay(payment.State{}, facts); !reflect.DeepEqual(again, got) {
			t.Fatalf("replay not deterministic\nfacts:%s", fmtFacts(facts))
		}
		if rt := roundTrip(t, got.State); !rt.Equivalent(got.State) || rt.Version != got.State.Version {
			t.Fatalf("state changed in JSON: %+v -> %+v", got.State, rt)
		}
	})
}

func TestFuzzEncoding(t *testing.T) {
	t.Parallel()
	facts := []payment.Fact{st(paid, 1000), refund("r1", 300), {Status: "chargeback", AmountMinor: -5, Currency: "brl", RefundID: "re_9"}}
	b, ok := encodeFacts(facts)
	if !ok {
		t.Fatal("encodeFacts refused")
	}
	got := decodeFacts(b)
	for i := range facts {
		facts[i].OccurredAt = t0.Add(time.Duration(i) * time.Minute)
	}
	if !reflect.DeepEqual(got, facts) {
		t.Fatalf("decode(encode(%v)) = %v", facts, got)
	}
	seeds := 0
	for _, tc := range applyCases {
		if _, ok := encodeFacts(append(slices.Clone(tc.given), tc.fact)); ok {
			seeds++
		}
	}
	if seeds < len(applyCases)*9/10 {
		t.Fatalf("only %d of %d table cases are fuzz seeds", seeds, len(applyCases))
	}
}

// FuzzConvergence lets the fuzzer pick the seeds of TestConvergence's
// history generator and delivery order: the delivered facts must converge
// to the in-order state and ledger.
func FuzzConvergence(f *testing.F) {
	for i := range uint64(8) {
		f.Add(i, i*7919)
	}
	f.Fuzz(func(t *testing.T, historySeed, orderSeed uint64) {
		facts := paymenttest.History(rand.New(rand.NewPCG(historySeed, 0)), t0, paymenttest.Options{Junk: true})
		delivered := deliver(rand.New(rand.NewPCG(orderSeed, 0)), facts)
		var m payment.Machine
		want, got := m.Replay(payment.State{}, facts), m.Replay(payment.State{}, delivered)
		if err := checkReplay(delivered, got); err != nil {
			t.Fatalf("%v\nin order:%s\ndelivered:%s", err, fmtFacts(facts), fmtFacts(delivered))
		}
		if !got.State.Equivalent(want.State) {
			t.Fatalf("diverged:\n got  %+v\n want %+v\nin order:%s\ndelivered:%s", got.State, want.State, fmtFacts(facts), fmtFacts(delivered))
		}
		if g, w := ledger.Balances(journals(got.Transitions)...), ledger.Balances(journals(want.Transitions)...); !maps.Equal(g, w) {
			t.Fatalf("ledger %v, want %v", g, w)
		}
	})
}
