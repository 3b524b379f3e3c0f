package mercadopago

import (
	"fmt"
	"net/url"
	"time"

	"github.com/paystream/paystream/internal/provider"
)

// Webhook is f as Mercado Pago notifies it: a thin notification
// (payment.created for FixtureCreated, payment.updated for anything later:
// the API tells what happened), f.EventID its numeric id, with data.id and
// type in the query, and x-signature over the manifest made at now with the
// first secret of cfg. Each delivery has its own x-request-id, retries
// included.
func Webhook(cfg provider.Config, f provider.Fixture, now time.Time) (*provider.Webhook, error) {
	action := "payment.updated"
	if f.Kind == provider.FixtureCreated {
		action = "payment.created"
	}
	pid := f.PaymentID
	body := fmt.Appendf(nil, `{"action":%q,"api_version":"v1","data":{"id":%q},"date_created":%q,"id":%s,"live_mode":false,"type":"payment","user_id":"0"}`,
		action, pid, f.At.UTC().Format("2006-01-02T15:04:05.000Z07:00"), f.EventID)
	requestID := fmt.Sprintf("req%s-%s-%d", pid, f.EventID, now.UnixNano())
	w, err := provider.HeaderWebhook("mercadopago", cfg, body, HeaderSignature, func(secret string) string {
		return Sign(secret, pid, requestID, now)
	})
	if err != nil {
		return nil, err
	}
	w.Header.Set(HeaderRequestID, requestID)
	w.RawQuery = url.Values{QueryDataID: {pid}, "type": {"payment"}}.Encode()
	return w, nil
}
