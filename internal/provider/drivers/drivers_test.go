package drivers

import (
	"sort"
	"strings"
	"testing"

	"github.com/paystream/paystream/internal/provider"
)

func TestFactories(t *testing.T) {
	t.Parallel()
	want := []string{"asaas", "hmac", "mercadopago", "pagarme", "pagbank", "standardwebhooks", "stripe", "zoop"}
	f := Factories()
	var got []string
	for name, factory := range f {
		got = append(got, name)
		// Every factory rejects a config without secrets.
		if _, err := factory(provider.Config{}); err == nil {
			t.Errorf("%s: New(empty config) = %v, want an error", name, err)
		}
	}
	sort.Strings(got)
	if strings.Join(got, ",") != strings.Join(want, ",") {
		t.Fatalf("Factories() names = %v, want %v", got, want)
	}
	// Callers may modify the map they get.
	delete(f, "stripe")
	if _, ok := Factories()["stripe"]; !ok {
		t.Fatal("Factories shares its map between calls")
	}
}
