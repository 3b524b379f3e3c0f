package mercadopago

import (
	"encoding/json"
	"errors"
	"reflect"
	"strings"
	"testing"

	"github.com/paystream/paystream/internal/provider"
)

// TestParseRefetchFor: for the answer to the request for its own payment,
// ParseRefetchFor gives exactly what ParseRefetch gives (every usable answer
// of TestParseRefetch, ids as integers or strings, with leading zeros in
// the request); an answer about another payment — a lying API, a
// misrouting proxy — is unprocessable and gives no facts, as are unusable
// answers whatever the id, and a request without an id.
func TestParseRefetchFor(t *testing.T) {
	t.Parallel()
	d := refetchDriver(t)
	usable := 0
	for _, tc := range refetchCases(t) {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			body := []byte(tc.body)
			if tc.want == nil {
				if got, err := d.ParseRefetchFor("83791262741", body); !errors.Is(err, provider.ErrUnprocessable) || got != nil {
					t.Fatalf("ParseRefetchFor = %+v, %v; want ErrUnprocessable", got, err)
				}
				return
			}
			var head struct {
				ID json.RawMessage `json:"id"`
			}
			if err := json.Unmarshal(body, &head); err != nil {
				t.Fatal(err)
			}
			id := numericID(head.ID)
			if id == "" {
				t.Fatalf("no id in %s", tc.body)
			}
			want, err := d.ParseRefetch(body)
			if err != nil {
				t.Fatal(err)
			}
			for _, asked := range []string{id, "00" + id} {
				got, err := d.ParseRefetchFor(asked, body)
				if err != nil || !reflect.DeepEqual(got, want) {
					t.Errorf("ParseRefetchFor(%s) = %v, %v; want ParseRefetch's\n%s", asked, dump(got), err, dump(want))
				}
			}
			for _, other := range []string{id + "1", "1" + id, strings.TrimSuffix(id, id[len(id)-1:]), "0", ""} {
				got, err := d.ParseRefetchFor(other, body)
				if !errors.Is(err, provider.ErrUnprocessable) || got != nil {
					t.Errorf("ParseRefetchFor(%q) of payment %s = %v, %v; want ErrUnprocessable", other, id, dump(got), err)
				}
			}
		})
		if tc.want != nil {
			usable++
		}
	}
	if usable < 5 {
		t.Fatalf("only %d usable answers checked", usable)
	}

	// An id sent as a string is compared the same way.
	body := []byte(mp(`id="5001"`))
	want, err := d.ParseRefetch(body)
	if err != nil {
		t.Fatal(err)
	}
	if got, err := d.ParseRefetchFor("5001", body); err != nil || !reflect.DeepEqual(got, want) {
		t.Errorf("string id: ParseRefetchFor = %v, %v; want %v", dump(got), err, dump(want))
	}
	if got, err := d.ParseRefetchFor("5002", body); !errors.Is(err, provider.ErrUnprocessable) || got != nil {
		t.Errorf("string id of another payment: ParseRefetchFor = %v, %v; want ErrUnprocessable", dump(got), err)
	}
}
