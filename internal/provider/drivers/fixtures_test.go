package drivers

import (
	"errors"
	"net/url"
	"testing"
	"time"

	"github.com/paystream/paystream/internal/payment"
	"github.com/paystream/paystream/internal/provider"
)

// fixtureConfigs are one signing configuration per driver, as a sources
// file gives them.
var fixtureConfigs = map[string]provider.Config{
	"standardwebhooks": {Secrets: []string{"whpk_11qYAYKxCrfVS/7TyWQHOg7hcvPapiMlrwIaaPcHURo=", "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"}},
	"stripe":           {Secrets: []string{"whsec_stripe_test_4eC39HqLyjWDarjtT1zdp7dc"}},
	"hmac":             {Secrets: []string{"hmac-secret-7f3a"}, Options: map[string]string{"header": "X-Hub-Signature-256", "algorithm": "sha256", "prefix": "sha256=", "id_header": "X-GitHub-Delivery"}},
	"pagarme":          {Secrets: []string{"sk_test_pagarme_0123456789"}},
	"asaas":            {Secrets: []string{"asaas-token-5d2c"}},
	"pagbank":          {Secrets: []string{"5F2A3D4E-0B1C-4D2E-9F8A-7B6C5D4E3F2A"}},
	"mercadopago":      {Secrets: []string{"mp-webhook-secret-8e1f"}},
	"zoop":             {Secrets: []string{"zoop-query-token-0123456789"}, Options: map[string]string{"marketplace_id": "3249465a7753536b62545a6a684b0000", "auth": "query"}},
}

// fixtureStatuses is the status each kind of fact normalizes to.
var fixtureStatuses = map[provider.FixtureKind]payment.Status{
	provider.FixtureCreated: payment.StatusPending, provider.FixtureAuthorized: payment.StatusAuthorized,
	provider.FixturePaid: payment.StatusPaid, provider.FixtureFailed: payment.StatusFailed,
	provider.FixtureCanceled: payment.StatusCanceled, provider.FixtureRefund: payment.StatusPartiallyRefunded,
	provider.FixtureFullRefund: payment.StatusRefunded, provider.FixtureDisputed: payment.StatusDisputed,
	provider.FixtureDisputeWon: payment.StatusDisputeWon, provider.FixtureDisputeLost: payment.StatusDisputeLost,
}

// TestFixturesVerifyAndParse: every driver's Webhook, for every kind of
// fact, either says its gateway sends no such webhook (ErrNoFixture) or
// builds one its own driver verifies and parses into that fact about that
// payment (or, for thin events, a refetch of it); a wrong secret's is
// refused.
func TestFixturesVerifyAndParse(t *testing.T) {
	t.Parallel()
	fixtures := Fixtures()
	if len(fixtures) != len(Factories()) {
		t.Fatalf("%d fixtures for %d drivers", len(fixtures), len(Factories()))
	}
	at := time.Date(2024, 6, 12, 19, 45, 0, 0, time.UTC)
	for name, webhook := range fixtures {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			cfg, ok := fixtureConfigs[name]
			if !ok {
				t.Fatalf("no configuration for driver %s", name)
			}
			d, err := Factories()[name](cfg)
			if err != nil {
				t.Fatal(err)
			}
			told := 0
			for kind, want := range fixtureStatuses {
				for _, echo := range []bool{false, true} {
					f := provider.Fixture{Kind: kind, Echo: echo, EventID: "4711", PaymentID: "pi_9Xk2" + map[bool]string{true: "e"}[echo],
						AmountMinor: 25990, StepMinor: 25990, RefundID: "re_1", RefundedMinor: 990, At: at}
					if name == "mercadopago" {
						f.PaymentID = "123456789"
					}
					if name == "zoop" {
						f.PaymentID = "4e1b2c3d4e5f60718293a4b5c6d7e8f9"
					}
					if kind == provider.FixtureRefund {
						f.StepMinor = 990
					}
					w, err := webhook(cfg, f, at)
					if errors.Is(err, provider.ErrNoFixture) {
						continue
					}
					if err != nil {
						t.Fatalf("%s: %v", kind, err)
					}
					told++
					q, _ := url.ParseQuery(w.RawQuery)
					r := &provider.Request{Header: w.Header, Query: q, Body: w.Body, Now: at.Add(time.Minute)}
					if err := d.Verify(r); err != nil {
						t.Fatalf("%s: Verify: %v", kind, err)
					}
					ev, err := d.Parse(r)
					if err != nil {
						t.Fatalf("%s: Parse: %v\n%s", kind, err, w.Body)
					}
					if ev.PaymentID != f.PaymentID {
						t.Errorf("%s: payment %q, want %q", kind, ev.PaymentID, f.PaymentID)
					}
					if !ev.NeedsRefetch && ev.Fact.Status != want {
						t.Errorf("%s (echo %v): status %q, want %q\n%s", kind, echo, ev.Fact.Status, want, w.Body)
					}
					other := cfg
					other.Secrets = []string{"whsec_d3JvbmctYnV0LXZhbGlkLWJhc2U2NA=="}
					if w2, err := webhook(other, f, at); err != nil || d.Verify(&provider.Request{Header: w2.Header, Query: mustQuery(t, w2.RawQuery), Body: w2.Body, Now: at}) == nil {
						t.Errorf("%s: signed with another secret: build error %v, and it verified", kind, err)
					}
				}
			}
			if told < 5 {
				t.Errorf("only %d kinds of fact told", told)
			}
		})
	}
}

func mustQuery(t *testing.T, raw string) url.Values {
	t.Helper()
	q, err := url.ParseQuery(raw)
	if err != nil {
		t.Fatal(err)
	}
	return q
}
