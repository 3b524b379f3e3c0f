package source_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/paystream/paystream/internal/payment"
	"github.com/paystream/paystream/internal/provider"
	"github.com/paystream/paystream/internal/provider/gatewaytest"
	"github.com/paystream/paystream/internal/provider/providertest"
	"github.com/paystream/paystream/internal/source"
)

const (
	refetchSWSecret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
	refetchToken    = "sk_live_R3fetchT0ken"
)

// sourcesYAML is a sources file of the sources given by sourceYAML.
func sourcesYAML(sources ...string) string { return "sources:\n" + strings.Join(sources, "") }

// sourceYAML is one source of a sources file: its name, driver and one
// secret, then each setting ("refetch: true") on a line of its own.
func sourceYAML(name, driver, secret string, settings ...string) string {
	var b strings.Builder
	fmt.Fprintf(&b, "  - name: %s\n    driver: %s\n    secrets: [%q]\n", name, driver, secret)
	for _, s := range settings {
		b.WriteString("    " + s + "\n")
	}
	return b.String()
}

func TestRefetchStandardWebhooks(t *testing.T) {
	t.Parallel()
	gw := gatewaytest.NewWithToken(t, refetchToken)
	at := time.Date(2024, 6, 12, 19, 45, 0, 0, time.UTC)
	gw.SetPayment("pay_1", gatewaytest.Payment{PaymentID: "pay_1", Status: "paid", Amount: 1050, Currency: "BRL", UpdatedAt: at})
	tokenFile := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(tokenFile, []byte(refetchToken+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	srcs := mustParse(t, sourcesYAML(
		sourceYAML("acme", "standardwebhooks", refetchSWSecret, "refetch: true", "api_base_url: "+gw.URL(), "api_token: file:"+tokenFile),
		sourceYAML("plain", "standardwebhooks", refetchSWSecret)))
	src := srcs["acme"]
	c := src.Refetch
	if c == nil {
		t.Fatal("refetch: true gave no RefetchConfig")
	}
	if c.BaseURL != gw.URL() || c.Token != refetchToken || c.Rate != source.DefaultRefetchRate || c.Burst != 10 || c.Timeout != source.DefaultRefetchTimeout {
		t.Fatalf("RefetchConfig = %s (token ok: %v)", c, c.Token == refetchToken)
	}
	if c.Refetcher != src.Driver.(provider.Refetcher) {
		t.Fatal("Refetcher is not the source's driver")
	}
	if srcs["plain"].Refetch != nil {
		t.Fatal("a source without refetch got a RefetchConfig")
	}

	// The driver marks events NeedsRefetch for the refetching source only.
	for name, want := range map[string]bool{"acme": true, "plain": false} {
		ev, err := srcs[name].Driver.Parse(signedRequest(t, refetchSWSecret))
		if err != nil {
			t.Fatal(err)
		}
		if ev.NeedsRefetch != want {
			t.Fatalf("%s: NeedsRefetch = %v, want %v", name, ev.NeedsRefetch, want)
		}
	}

	// The config builds a request the gateway answers, and the answer parses.
	ctx, cancel := context.WithTimeout(context.Background(), c.Timeout)
	defer cancel()
	req, err := c.Request(ctx, "pay_1")
	if err != nil {
		t.Fatal(err)
	}
	facts := providertest.RefetchFacts(t, http.DefaultClient, req, c.Refetcher)
	if len(facts) != 1 || facts[0].Status != payment.StatusPaid || facts[0].AmountMinor != 1050 {
		t.Fatalf("facts %+v", facts)
	}
}

func TestRefetchSettings(t *testing.T) {
	t.Parallel()
	srcs := mustParse(t, sourcesYAML(
		sourceYAML("acme", "standardwebhooks", refetchSWSecret, "refetch: true", "api_base_url: https://api.acme.example/v2/",
			"api_token: "+refetchToken, "refetch_rate: 2.5", "refetch_timeout: 750ms"),
		sourceYAML("burst", "standardwebhooks", refetchSWSecret, "refetch: true", "api_base_url: https://api.acme.example",
			"api_token: "+refetchToken, "refetch_rate: 0.5", "refetch_burst: 4")))
	c := srcs["acme"].Refetch
	if c.Rate != 2.5 || c.Burst != 3 || c.Timeout != 750*time.Millisecond {
		t.Fatalf("acme: %s", c)
	}
	req, err := c.Request(context.Background(), "pay_1")
	if err != nil || req.URL.String() != "https://api.acme.example/v2/payments/pay_1" {
		t.Fatalf("Request = %v, %v", req.URL, err)
	}
	if c := srcs["burst"].Refetch; c.Rate != 0.5 || c.Burst != 4 {
		t.Fatalf("burst: %s", c)
	}
}

func TestRefetchMercadoPago(t *testing.T) {
	t.Parallel()
	srcs := mustParse(t, sourcesYAML(
		sourceYAML("mp", "mercadopago", "mp-webhook-secret", "api_token: "+refetchToken),
		sourceYAML("mp-explicit", "mercadopago", "mp-webhook-secret", "refetch: true", "api_token: "+refetchToken, "api_base_url: http://127.0.0.1:9"),
		sourceYAML("mp-bare", "mercadopago", "mp-webhook-secret")))
	c := srcs["mp"].Refetch
	if c == nil || c.BaseURL != "" || c.Token != refetchToken {
		t.Fatalf("mp: RefetchConfig %v", c)
	}
	req, err := c.Request(context.Background(), "83791262741")
	if err != nil || req.URL.String() != "https://api.mercadopago.com/v1/payments/83791262741" {
		t.Fatalf("Request = %v, %v", req, err)
	}
	if got := req.Header.Get("Authorization"); got != "Bearer "+refetchToken {
		t.Fatalf("Authorization = %q", got)
	}
	if c := srcs["mp-explicit"].Refetch; c == nil || c.BaseURL != "http://127.0.0.1:9" {
		t.Fatalf("mp-explicit: %v", c)
	}
	// Without any API setting, Mercado Pago loads (tools that only sign
	// webhooks need no API token) but cannot refetch.
	if srcs["mp-bare"].Refetch != nil {
		t.Fatalf("mp-bare: %v", srcs["mp-bare"].Refetch)
	}
}

func TestRefetchErrors(t *testing.T) {
	t.Parallel()
	sw := func(settings ...string) string {
		return sourcesYAML(sourceYAML("acme", "standardwebhooks", refetchSWSecret, settings...))
	}
	other := func(driver, secret string, settings ...string) string {
		return sourcesYAML(sourceYAML("gw", driver, secret, settings...))
	}
	on := []string{"refetch: true", "api_base_url: https://api.acme.example", "api_token: " + refetchToken}
	swOn := func(setting string) string { return sw(append(slices.Clip(on), setting)...) }
	for name, tc := range map[string]struct {
		yaml string
		want []string
	}{
		"driver cannot refetch": {other("pagbank", "5F2A3D4E-0B1C-4D2E-9F8A-7B6C5D4E3F2A", "refetch: true", "api_token: x"),
			[]string{`source "gw"`, "refetch", "pagbank", "Refetcher"}},
		"hmac cannot refetch": {other("hmac", "s", "options: {header: X-Sig}", "refetch: true"),
			[]string{`source "gw"`, "refetch", "hmac"}},
		"mercadopago refetch false": {other("mercadopago", "s", "refetch: false"),
			[]string{`source "gw"`, "refetch", "always"}},
		"api_token without refetch": {sw("api_token: " + refetchToken),
			[]string{`source "acme"`, "api_token", "refetch is off"}},
		"refetch_rate without refetch": {other("stripe", "whsec_x", "refetch_rate: 5"),
			[]string{`source "gw"`, "refetch_rate", "refetch is off"}},
		"refetch false with settings": {sw("refetch: false", "api_base_url: https://x.example"),
			[]string{`source "acme"`, "api_base_url", "refetch is off"}},
		"no api_token": {sw("refetch: true", "api_base_url: https://api.acme.example"),
			[]string{`source "acme"`, "api_token", "required"}},
		"mercadopago settings without token": {other("mercadopago", "s", "refetch_rate: 5"),
			[]string{`source "gw"`, "api_token", "required"}},
		"api_token env unset": {sw("refetch: true", "api_base_url: https://api.acme.example", "api_token: env:PAYSTREAM_TEST_UNSET_REFETCH_TOKEN"),
			[]string{`source "acme"`, "api_token", "PAYSTREAM_TEST_UNSET_REFETCH_TOKEN"}},
		"api_token with a space": {sw("refetch: true", "api_base_url: https://api.acme.example", "api_token: \"sk_live R3fetch\""),
			[]string{`source "acme"`, "api_token"}},
		"no api_base_url for a generic gateway": {sw("refetch: true", "api_token: "+refetchToken),
			[]string{`source "acme"`, "api_base_url", "required"}},
		"api_base_url not http": {sw("refetch: true", "api_base_url: ftp://api.acme.example", "api_token: "+refetchToken),
			[]string{`source "acme"`, "api_base_url"}},
		"api_base_url with credentials": {sw("refetch: true", "api_base_url: https://user:hunter2@api.acme.example", "api_token: "+refetchToken),
			[]string{`source "acme"`, "api_base_url", "credentials"}},
		"mercadopago bad api_base_url": {other("mercadopago", "s", "api_base_url: api.mercadopago.com", "api_token: "+refetchToken),
			[]string{`source "gw"`, "api_base_url"}},
		"refetch_rate zero":         {swOn("refetch_rate: 0"), []string{`source "acme"`, "refetch_rate"}},
		"refetch_rate negative":     {swOn("refetch_rate: -1"), []string{`source "acme"`, "refetch_rate"}},
		"refetch_rate infinite":     {swOn("refetch_rate: .inf"), []string{`source "acme"`, "refetch_rate"}},
		"refetch_rate NaN":          {swOn("refetch_rate: .nan"), []string{`source "acme"`, "refetch_rate"}},
		"refetch_rate huge":         {swOn("refetch_rate: 1e300"), []string{`source "acme"`, "refetch_rate"}},
		"refetch_rate not a number": {swOn("refetch_rate: fast"), []string{`source "acme"`, "refetch_rate"}},
		"refetch_burst zero":        {swOn("refetch_burst: 0"), []string{`source "acme"`, "refetch_burst"}},
		"refetch_timeout zero":      {swOn("refetch_timeout: 0s"), []string{`source "acme"`, "refetch_timeout"}},
		"refetch_timeout garbage":   {swOn("refetch_timeout: soon"), []string{`source "acme"`, "refetch_timeout"}},
		"refetch not a bool":        {sw("refetch: maybe"), []string{`source "acme"`, "refetch"}},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			_, err := parse(tc.yaml)
			if err == nil {
				t.Fatal("Parse accepted it")
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not mention %q", err, w)
				}
			}
			for _, secret := range []string{refetchToken, "R3fetch", "hunter2"} {
				if strings.Contains(err.Error(), secret) {
					t.Errorf("error %q reveals a secret", err)
				}
			}
		})
	}
}

// TestRefetchTokenNeverPrinted checks the ways a config usually reaches a
// log: fmt verbs, log/slog and JSON.
func TestRefetchTokenNeverPrinted(t *testing.T) {
	t.Parallel()
	srcs := mustParse(t, sourcesYAML(sourceYAML("mp", "mercadopago", "mp-webhook-secret", "api_token: "+refetchToken)))
	c := srcs["mp"].Refetch
	var out bytes.Buffer
	fmt.Fprintf(&out, "%v %+v %#v %s %v %+v", c, c, c, c, *c, *c)
	slog.New(slog.NewJSONHandler(&out, nil)).Info("source", "refetch", c, "value", *c)
	slog.New(slog.NewTextHandler(&out, nil)).Info("source", "refetch", c)
	b, err := json.Marshal(srcs["mp"])
	if err != nil {
		t.Fatal(err)
	}
	out.Write(b)
	if strings.Contains(out.String(), refetchToken) {
		t.Fatalf("token printed: %s", out.String())
	}
	if !strings.Contains(out.String(), "[redacted]") {
		t.Fatalf("nothing says the token is redacted: %s", out.String())
	}
}
