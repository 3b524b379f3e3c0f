package standardwebhooks

import (
	"encoding/json"
	"errors"
	"reflect"
	"testing"

	"github.com/paystream/paystream/internal/provider"
)

// TestParseRefetchFor: for the answer to the request for its own payment,
// ParseRefetchFor gives exactly what ParseRefetch gives (every usable answer
// of TestParseRefetch); an answer whose payment_id is another payment's —
// a lying API, a misrouting proxy, ids differing only in case or by a
// prefix — is unprocessable and gives no facts, as are unusable answers
// whatever the id, and a request without an id.
func TestParseRefetchFor(t *testing.T) {
	t.Parallel()
	d := refetchDriver(t, true)
	var _ provider.RefetchChecker = d
	usable := 0
	for _, tc := range refetchCases {
		body := []byte(tc.body)
		if tc.want == nil {
			if got, err := d.ParseRefetchFor("pay_1", body); !errors.Is(err, provider.ErrUnprocessable) || got != nil {
				t.Errorf("%s: ParseRefetchFor = %+v, %v; want ErrUnprocessable", tc.name, got, err)
			}
			continue
		}
		usable++
		var head struct {
			PaymentID string `json:"payment_id"`
		}
		if err := json.Unmarshal(body, &head); err != nil || head.PaymentID == "" {
			t.Fatalf("%s: no payment_id: %v", tc.name, err)
		}
		want, err := d.ParseRefetch(body)
		if err != nil {
			t.Fatal(err)
		}
		got, err := d.ParseRefetchFor(head.PaymentID, body)
		if err != nil || !reflect.DeepEqual(got, want) {
			t.Errorf("%s: ParseRefetchFor(%s) = %+v, %v; want ParseRefetch's %+v", tc.name, head.PaymentID, got, err, want)
		}
		for _, other := range []string{"pay_2", head.PaymentID + "0", "PAY_1", " " + head.PaymentID, ""} {
			if other == head.PaymentID {
				continue
			}
			got, err := d.ParseRefetchFor(other, body)
			if !errors.Is(err, provider.ErrUnprocessable) || got != nil {
				t.Errorf("%s: ParseRefetchFor(%q) of payment %s = %+v, %v; want ErrUnprocessable", tc.name, other, head.PaymentID, got, err)
			}
		}
	}
	if usable < 5 {
		t.Fatalf("only %d usable answers checked", usable)
	}
}
