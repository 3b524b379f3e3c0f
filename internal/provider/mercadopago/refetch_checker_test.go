package mercadopago

import (
	"errors"
	"reflect"
	"testing"

	"github.com/paystream/paystream/internal/provider"
	"github.com/paystream/paystream/internal/provider/providertest"
)

// TestParseRefetchForNumericIDs: beyond the suite's ParseRefetchFor checks,
// ids are integers: asked with leading zeros, or sent as a string, the
// answer about the same payment is the same, and one about another is
// unprocessable.
func TestParseRefetchForNumericIDs(t *testing.T) {
	t.Parallel()
	d := refetchDriver(t)
	for _, body := range [][]byte{[]byte(mp(``)), []byte(mp(`id="5001"`))} {
		want, err := d.ParseRefetch(body)
		if err != nil {
			t.Fatal(err)
		}
		for _, asked := range []string{"5001", "005001"} {
			if got, err := d.ParseRefetchFor(asked, body); err != nil || !reflect.DeepEqual(got, want) {
				t.Errorf("%s: ParseRefetchFor(%s) = %v, %v; want\n%s", body, asked, providertest.DumpFacts(got), err, providertest.DumpFacts(want))
			}
		}
		if got, err := d.ParseRefetchFor("5002", body); !errors.Is(err, provider.ErrUnprocessable) || got != nil {
			t.Errorf("%s: ParseRefetchFor(5002) = %v, %v; want ErrUnprocessable", body, providertest.DumpFacts(got), err)
		}
	}
}
