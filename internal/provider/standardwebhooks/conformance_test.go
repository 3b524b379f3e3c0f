package standardwebhooks

import (
	"strconv"
	"testing"
	"time"

	"github.com/paystream/paystream/internal/payment"
	"github.com/paystream/paystream/internal/provider"
	"github.com/paystream/paystream/internal/provider/providertest"
)

func harness() providertest.Harness {
	at := func(s string) time.Time {
		t, err := time.Parse(time.RFC3339, s)
		if err != nil {
			panic(err)
		}
		return t
	}
	return providertest.Harness{
		New:         New,
		OldSecret:   oldSecret,
		NewSecret:   newSecret,
		WrongSecret: "whsec_d3Jvbmcgc2VjcmV0IGZvciB0ZXN0cw==",
		Sign: func(t testing.TB, secret string, body []byte, ts time.Time) *provider.Request {
			t.Helper()
			r, err := SignedRequest(secret, "msg_2fUo1Jm0KpGh0qRW", ts, body)
			if err != nil {
				t.Fatal(err)
			}
			return r
		},
		Tolerance:       DefaultTolerance,
		RequiredHeaders: []string{HeaderID, HeaderTimestamp, HeaderSignature},
		Tampers: map[string]func(*provider.Request){
			"id":        func(r *provider.Request) { r.Header.Set(HeaderID, "msg_other") },
			"timestamp": func(r *provider.Request) { r.Header.Set(HeaderTimestamp, strconv.FormatInt(r.Now.Unix()-1, 10)) },
			"signature": func(r *provider.Request) {
				r.Header.Set(HeaderSignature, "v1,"+r.Header.Get(HeaderSignature)[4:8]+"AAAA")
			},
		},
		Fixtures: []providertest.Fixture{
			{
				Name: "payment.paid",
				Body: []byte(`{"type":"payment.paid","timestamp":"2024-06-12T19:45:00Z","data":{"payment_id":"pay_8Jd2kQ","amount":25990,"currency":"BRL"}}`),
				Want: &provider.Event{EventID: "msg_2fUo1Jm0KpGh0qRW", DedupKey: "msg_2fUo1Jm0KpGh0qRW", PaymentID: "pay_8Jd2kQ", Type: "payment.paid",
					Fact: payment.Fact{Status: payment.StatusPaid, AmountMinor: 25990, Currency: "BRL", OccurredAt: at("2024-06-12T19:45:00Z")}},
			},
			{
				Name: "payment.partially_refunded",
				Body: []byte(`{"type":"payment.partially_refunded","timestamp":"2024-06-14T10:00:00Z","data":{"payment_id":"pay_8Jd2kQ","amount":25990,"currency":"BRL","refund_id":"rf_1","refund_amount":990}}`),
				Want: &provider.Event{EventID: "msg_2fUo1Jm0KpGh0qRW", DedupKey: "msg_2fUo1Jm0KpGh0qRW", PaymentID: "pay_8Jd2kQ", Type: "payment.partially_refunded",
					Fact: payment.Fact{Status: payment.StatusPartiallyRefunded, AmountMinor: 990, Currency: "BRL", RefundID: "rf_1", OccurredAt: at("2024-06-14T10:00:00Z")}},
			},
			{
				Name: "payment.dispute_won",
				Body: []byte(`{"type":"payment.dispute_won","timestamp":"2024-07-30T12:00:00Z","data":{"payment_id":"pay_8Jd2kQ","amount":25990,"currency":"BRL"}}`),
				Want: &provider.Event{EventID: "msg_2fUo1Jm0KpGh0qRW", DedupKey: "msg_2fUo1Jm0KpGh0qRW", PaymentID: "pay_8Jd2kQ", Type: "payment.dispute_won",
					Fact: payment.Fact{Status: payment.StatusDisputeWon, AmountMinor: 25990, Currency: "BRL", OccurredAt: at("2024-07-30T12:00:00Z")}},
			},
			{Name: "float amount", Body: []byte(`{"type":"payment.paid","timestamp":"2024-06-12T19:45:00Z","data":{"payment_id":"pay_1","amount":259.90,"currency":"BRL"}}`)},
		},
	}
}

func TestConformance(t *testing.T) { providertest.Conformance(t, harness()) }
