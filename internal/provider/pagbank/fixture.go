package pagbank

import (
	"fmt"
	"time"

	"github.com/paystream/paystream/internal/provider"
)

// Webhook is f as PagBank sends it: the charge with its status and amount
// summary, signed with the first secret of cfg (the account's token).
// PagBank sends no event id; a refund is a PAID charge whose summary
// counts the refunded total (no refund id); the orders API has no disputes.
func Webhook(cfg provider.Config, f provider.Fixture, _ time.Time) (*provider.Webhook, error) {
	created, paidAt := f.At, time.Time{}
	var status string
	var paid, refunded int64
	switch f.Kind {
	case provider.FixtureCreated:
		status = "WAITING"
	case provider.FixtureAuthorized:
		status = "AUTHORIZED"
	case provider.FixturePaid:
		status, paid, paidAt, created = "PAID", f.AmountMinor, f.At, f.Created()
	case provider.FixtureRefund:
		status, paid, paidAt, created, refunded = "PAID", f.AmountMinor, f.At, f.Created(), f.RefundedMinor
	case provider.FixtureFailed:
		status = "DECLINED"
	case provider.FixtureCanceled:
		status = "CANCELED"
	case provider.FixtureFullRefund:
		status, paid, refunded = "CANCELED", f.AmountMinor, f.AmountMinor
	default:
		return nil, fmt.Errorf("pagbank: %s: %w", f.Kind, provider.ErrNoFixture)
	}
	paidField := ""
	if !paidAt.IsZero() {
		paidField = fmt.Sprintf(`,"paid_at":%q`, paidAt.UTC().Format(time.RFC3339Nano))
	}
	body := fmt.Appendf(nil, `{"id":%q,"reference_id":"simulate","status":%q,"created_at":%q%s,"amount":{"value":%d,"currency":%q,"summary":{"total":%d,"paid":%d,"refunded":%d}},"payment_method":{"type":"CREDIT_CARD"}}`,
		f.PaymentID, status, created.UTC().Format(time.RFC3339Nano), paidField, f.AmountMinor, f.Cur(), f.AmountMinor, paid, refunded)
	return provider.HeaderWebhook("pagbank", cfg, body, HeaderSignature, func(secret string) string { return Sign(secret, body) })
}
