package asaas

import (
	"fmt"
	"time"

	"github.com/paystream/paystream/internal/money"
	"github.com/paystream/paystream/internal/provider"
)

var _ provider.FixtureFunc = Webhook

// Webhook is f as Asaas sends it: the event and the payment's status, with
// the first secret of cfg as the access token. Asaas tells no partial
// refund with its id and no lost chargeback.
func Webhook(cfg provider.Config, f provider.Fixture, _ time.Time) (*provider.Webhook, error) {
	secret, err := provider.FirstSecret("asaas", cfg)
	if err != nil {
		return nil, err
	}
	var event, status string
	switch f.Kind {
	case provider.FixtureCreated:
		event, status = "PAYMENT_CREATED", "PENDING"
	case provider.FixtureAuthorized:
		event, status = "PAYMENT_AUTHORIZED", "AUTHORIZED"
	case provider.FixturePaid:
		event, status = "PAYMENT_CONFIRMED", "CONFIRMED"
		if f.Echo {
			event, status = "PAYMENT_RECEIVED", "RECEIVED"
		}
	case provider.FixtureFailed:
		event, status = "PAYMENT_CREDIT_CARD_CAPTURE_REFUSED", "PENDING"
	case provider.FixtureCanceled:
		event, status = "PAYMENT_DELETED", "PENDING"
	case provider.FixtureFullRefund:
		event, status = "PAYMENT_REFUNDED", "REFUNDED"
	case provider.FixtureDisputed:
		event, status = "PAYMENT_CHARGEBACK_REQUESTED", "CHARGEBACK_REQUESTED"
	case provider.FixtureDisputeWon:
		event, status = "PAYMENT_AWAITING_CHARGEBACK_REVERSAL", "AWAITING_CHARGEBACK_REVERSAL"
	default:
		return nil, fmt.Errorf("asaas: %s: %w", f.Kind, provider.ErrNoFixture)
	}
	body := fmt.Appendf(nil, `{"id":%q,"event":%q,"dateCreated":%q,"payment":{"object":"payment","id":%q,"value":%s,"billingType":"CREDIT_CARD","status":%q}}`,
		f.EventID, event, f.At.In(brasilia).Format("2006-01-02 15:04:05"), f.PaymentID, money.Format(f.AmountMinor, f.Cur()), status)
	w := provider.NewWebhook(body)
	w.Header.Set(HeaderToken, Sign(secret))
	return w, nil
}
