package zoop

import (
	"cmp"
	"fmt"
	"net/url"
	"time"

	"github.com/paystream/paystream/internal/provider"
)

// fixtureTypes are the Zoop event types of each fixture kind (the paid
// echo is transaction.capture.succeeded).
var fixtureTypes = map[provider.FixtureKind]string{
	provider.FixtureCreated: "transaction.created", provider.FixtureAuthorized: "transaction.pre_authorized",
	provider.FixturePaid: "transaction.succeeded", provider.FixtureFailed: "transaction.failed",
	provider.FixtureCanceled: "transaction.canceled", provider.FixtureRefund: "transaction.void.succeeded",
	provider.FixtureFullRefund: "transaction.canceled", provider.FixtureDisputed: "transaction.disputed",
	provider.FixtureDisputeLost: "transaction.charged_back",
}

// Webhook is f as Zoop sends it: a thin event (the transaction's id only,
// as nothing in it is trusted), authenticated by the first secret of cfg in
// basic auth or, with auth: query, in the query parameter.
func Webhook(cfg provider.Config, f provider.Fixture, _ time.Time) (*provider.Webhook, error) {
	typ, ok := fixtureTypes[f.Kind]
	if !ok {
		return nil, fmt.Errorf("zoop: %s: %w", f.Kind, provider.ErrNoFixture)
	}
	if f.Kind == provider.FixturePaid && f.Echo {
		typ = "transaction.capture.succeeded"
	}
	body := fmt.Appendf(nil, `{"id":%q,"type":%q,"resource":"event","payload":{"object":{"id":%q,"resource":"transaction"}},"created_at":%q}`,
		f.EventID, typ, f.PaymentID, f.At.UTC().Format("2006-01-02T15:04:05-0700"))
	secret, err := provider.FirstSecret("zoop", cfg)
	if err != nil {
		return nil, err
	}
	w := provider.NewWebhook(body)
	if cfg.Options[OptionAuth] == AuthQuery {
		w.RawQuery = url.Values{cmp.Or(cfg.Options[OptionQueryParam], DefaultQueryParam): {secret}}.Encode()
	} else {
		w.Header.Set(HeaderAuthorization, Sign(secret))
	}
	return w, nil
}
