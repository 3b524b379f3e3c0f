package asaas

import (
	"fmt"
	"time"

	"github.com/paystream/paystream/internal/money"
	"github.com/paystream/paystream/internal/provider"
)

// fixtureEvents are the event and the payment's status of each fixture
// kind (the paid echo is PAYMENT_RECEIVED).
var fixtureEvents = map[provider.FixtureKind][2]string{
	provider.FixtureCreated:    {"PAYMENT_CREATED", "PENDING"},
	provider.FixtureAuthorized: {"PAYMENT_AUTHORIZED", "AUTHORIZED"},
	provider.FixturePaid:       {"PAYMENT_CONFIRMED", "CONFIRMED"},
	provider.FixtureFailed:     {"PAYMENT_CREDIT_CARD_CAPTURE_REFUSED", "PENDING"},
	provider.FixtureCanceled:   {"PAYMENT_DELETED", "PENDING"},
	provider.FixtureFullRefund: {"PAYMENT_REFUNDED", "REFUNDED"},
	provider.FixtureDisputed:   {"PAYMENT_CHARGEBACK_REQUESTED", "CHARGEBACK_REQUESTED"},
	provider.FixtureDisputeWon: {"PAYMENT_AWAITING_CHARGEBACK_REVERSAL", "AWAITING_CHARGEBACK_REVERSAL"},
}

// Webhook is f as Asaas sends it: the event and the payment's status, with
// the first secret of cfg as the access token. Asaas tells no partial
// refund with its id and no lost chargeback.
func Webhook(cfg provider.Config, f provider.Fixture, _ time.Time) (*provider.Webhook, error) {
	es, ok := fixtureEvents[f.Kind]
	if !ok {
		return nil, fmt.Errorf("asaas: %s: %w", f.Kind, provider.ErrNoFixture)
	}
	event, status := es[0], es[1]
	if f.Kind == provider.FixturePaid && f.Echo {
		event, status = "PAYMENT_RECEIVED", "RECEIVED"
	}
	body := fmt.Appendf(nil, `{"id":%q,"event":%q,"dateCreated":%q,"payment":{"object":"payment","id":%q,"value":%s,"billingType":"CREDIT_CARD","status":%q}}`,
		f.EventID, event, f.At.In(brasilia).Format("2006-01-02 15:04:05"), f.PaymentID, money.Format(f.AmountMinor, f.Cur()), status)
	return provider.HeaderWebhook("asaas", cfg, body, HeaderToken, Sign)
}
