package pagarme

import (
	"fmt"
	"strings"
	"time"

	"github.com/paystream/paystream/internal/provider"
)

// Webhook is f as Pagar.me sends it: a charge (or, for the paid echo and a
// cancellation, order) hook, signed with the first secret of cfg.
// f.PaymentID is the charge's id (ch_…); the order's derives from it.
func Webhook(cfg provider.Config, f provider.Fixture, _ time.Time) (*provider.Webhook, error) {
	pid, amt, cur := f.PaymentID, f.AmountMinor, f.Cur()
	order := "or_" + strings.TrimPrefix(pid, "ch_")
	var typ, data string
	switch f.Kind {
	case provider.FixtureCreated:
		typ, data = "charge.pending", fmt.Sprintf(`{"id":%q,"amount":%d,"status":"pending","currency":%q,"payment_method":"pix"}`, pid, amt, cur)
	case provider.FixturePaid:
		if f.Echo {
			typ, data = "order.paid", fmt.Sprintf(`{"id":%q,"status":"paid","charges":[{"id":%q,"amount":%d,"paid_amount":%d,"status":"paid","currency":%q}]}`, order, pid, amt, amt, cur)
		} else {
			typ, data = "charge.paid", fmt.Sprintf(`{"id":%q,"amount":%d,"paid_amount":%d,"status":"paid","currency":%q,"payment_method":"pix"}`, pid, amt, amt, cur)
		}
	case provider.FixtureFailed:
		typ, data = "charge.payment_failed", fmt.Sprintf(`{"id":%q,"amount":%d,"status":"failed","currency":%q,"payment_method":"credit_card"}`, pid, amt, cur)
	case provider.FixtureCanceled:
		typ, data = "order.canceled", fmt.Sprintf(`{"id":%q,"status":"canceled","charges":[{"id":%q,"amount":%d,"status":"canceled","currency":%q}]}`, order, pid, amt, cur)
	case provider.FixtureRefund:
		typ = "charge.partial_canceled"
		if f.RefundedMinor == amt {
			typ = "charge.refunded"
		}
		data = fmt.Sprintf(`{"id":%q,"amount":%d,"paid_amount":%d,"canceled_amount":%d,"status":"paid","currency":%q,"last_transaction":{"id":%q,"amount":%d,"status":"partial_void","success":true}}`,
			pid, amt, amt, f.RefundedMinor, cur, f.RefundID, f.Step())
	case provider.FixtureFullRefund:
		typ, data = "charge.refunded", fmt.Sprintf(`{"id":%q,"amount":%d,"paid_amount":%d,"canceled_amount":%d,"status":"refunded","currency":%q}`, pid, amt, amt, amt, cur)
	case provider.FixtureDisputed:
		typ, data = "charge.chargedback", fmt.Sprintf(`{"id":%q,"amount":%d,"paid_amount":%d,"status":"chargedback","currency":%q}`, pid, amt, amt, cur)
	default:
		return nil, fmt.Errorf("pagarme: %s: %w", f.Kind, provider.ErrNoFixture)
	}
	body := fmt.Appendf(nil, `{"id":%q,"account":{"id":"acc_sim","name":"simulate"},"type":%q,"created_at":%q,"data":%s}`,
		f.EventID, typ, f.At.UTC().Format(time.RFC3339Nano), data)
	return provider.HeaderWebhook("pagarme", cfg, body, HeaderSignature, func(secret string) string { return Sign(secret, body) })
}
