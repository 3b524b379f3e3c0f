package stripe

import (
	"fmt"
	"strings"
	"time"

	"github.com/paystream/paystream/internal/provider"
)

// disputeStatuses are the dispute object's status of each dispute kind.
var disputeStatuses = map[provider.FixtureKind]string{
	provider.FixtureDisputed: "needs_response", provider.FixtureDisputeWon: "won", provider.FixtureDisputeLost: "lost",
}

// Webhook is f as Stripe sends it: an event whose data.object is the
// payment intent, the charge (the paid echo, a refund in full), the refund
// or the dispute, signed at now with the first secret of cfg. f.PaymentID
// is the payment intent's id (pi_…); the charge and dispute ids derive
// from it.
func Webhook(cfg provider.Config, f provider.Fixture, now time.Time) (*provider.Webhook, error) {
	pid, amt, cur := f.PaymentID, f.Step(), strings.ToLower(f.Cur())
	charge := "ch_" + strings.TrimPrefix(pid, "pi_")
	var typ, obj string
	switch f.Kind {
	case provider.FixtureCreated:
		typ, obj = "payment_intent.created", fmt.Sprintf(`{"id":%q,"object":"payment_intent","amount":%d,"currency":%q,"status":"requires_payment_method"}`, pid, amt, cur)
	case provider.FixtureAuthorized:
		typ, obj = "payment_intent.amount_capturable_updated", fmt.Sprintf(`{"id":%q,"object":"payment_intent","amount":%d,"amount_capturable":%d,"currency":%q,"status":"requires_capture"}`, pid, amt, amt, cur)
	case provider.FixturePaid:
		if f.Echo {
			typ, obj = "charge.succeeded", fmt.Sprintf(`{"id":%q,"object":"charge","amount":%d,"amount_captured":%d,"captured":true,"currency":%q,"payment_intent":%q,"status":"succeeded"}`, charge, amt, amt, cur, pid)
		} else {
			typ, obj = "payment_intent.succeeded", fmt.Sprintf(`{"id":%q,"object":"payment_intent","amount":%d,"amount_received":%d,"currency":%q,"status":"succeeded"}`, pid, amt, amt, cur)
		}
	case provider.FixtureFailed:
		typ, obj = "payment_intent.payment_failed", fmt.Sprintf(`{"id":%q,"object":"payment_intent","amount":%d,"currency":%q,"status":"requires_payment_method"}`, pid, amt, cur)
	case provider.FixtureCanceled:
		typ, obj = "payment_intent.canceled", fmt.Sprintf(`{"id":%q,"object":"payment_intent","amount":%d,"currency":%q,"status":"canceled"}`, pid, amt, cur)
	case provider.FixtureRefund:
		typ, obj = "refund.created", fmt.Sprintf(`{"id":%q,"object":"refund","amount":%d,"charge":%q,"currency":%q,"payment_intent":%q,"status":"succeeded"}`, f.RefundID, amt, charge, cur, pid)
	case provider.FixtureFullRefund:
		typ, obj = "charge.refunded", fmt.Sprintf(`{"id":%q,"object":"charge","amount":%d,"amount_captured":%d,"amount_refunded":%d,"captured":true,"currency":%q,"payment_intent":%q,"refunded":true,"status":"succeeded"}`, charge, f.AmountMinor, f.AmountMinor, f.AmountMinor, cur, pid)
	case provider.FixtureDisputed, provider.FixtureDisputeWon, provider.FixtureDisputeLost:
		typ = "charge.dispute.closed"
		if f.Kind == provider.FixtureDisputed {
			typ = "charge.dispute.created"
		}
		obj = fmt.Sprintf(`{"id":%q,"object":"dispute","amount":%d,"charge":%q,"currency":%q,"payment_intent":%q,"status":%q}`, "dp_"+strings.TrimPrefix(pid, "pi_"), f.AmountMinor, charge, cur, pid, disputeStatuses[f.Kind])
	default:
		return nil, fmt.Errorf("stripe: %s: %w", f.Kind, provider.ErrNoFixture)
	}
	body := fmt.Appendf(nil, `{"id":%q,"object":"event","api_version":"2024-06-20","created":%d,"type":%q,"data":{"object":%s}}`, f.EventID, f.At.Unix(), typ, obj)
	return provider.HeaderWebhook("stripe", cfg, body, HeaderSignature, func(secret string) string { return Sign(secret, now, body) })
}
