package standardwebhooks

import (
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/paystream/paystream/internal/provider"
)

// conventionTypes are the convention's event types of each fixture kind
// (a refund's depends on whether it completes the amount).
var conventionTypes = map[provider.FixtureKind]string{
	provider.FixtureCreated: "payment.created", provider.FixtureAuthorized: "payment.authorized",
	provider.FixturePaid: "payment.paid", provider.FixtureFailed: "payment.failed",
	provider.FixtureCanceled: "payment.canceled", provider.FixtureFullRefund: "payment.refunded",
	provider.FixtureDisputed: "payment.disputed", provider.FixtureDisputeWon: "payment.dispute_won",
	provider.FixtureDisputeLost: "payment.dispute_lost",
}

// ConventionBody is f in paystream's payload convention (the body
// ParsePayload reads), which the hmac driver's senders use too.
func ConventionBody(f provider.Fixture) ([]byte, error) {
	typ, extra := conventionTypes[f.Kind], ""
	if f.Kind == provider.FixtureRefund {
		typ = "payment.partially_refunded"
		if f.RefundedMinor == f.AmountMinor {
			typ = "payment.refunded"
		}
		extra = fmt.Sprintf(`,"refund_id":%q,"refund_amount":%d`, f.RefundID, f.Step())
	}
	if typ == "" {
		return nil, fmt.Errorf("payload convention: %s: %w", f.Kind, provider.ErrNoFixture)
	}
	return fmt.Appendf(nil, `{"type":%q,"timestamp":%q,"data":{"payment_id":%q,"amount":%d,"currency":%q%s}}`,
		typ, f.At.UTC().Format(time.RFC3339Nano), f.PaymentID, f.Step(), f.Cur(), extra), nil
}

// SigningSecret returns the first secret of secrets that can sign (whsec_
// or whsk_): a source configured with public keys only cannot.
func SigningSecret(secrets []string) (string, error) {
	for _, s := range secrets {
		if strings.HasPrefix(s, PrefixSecret) || strings.HasPrefix(s, PrefixPrivateKey) {
			return s, nil
		}
	}
	return "", fmt.Errorf("standardwebhooks: only public keys (%s…) configured: cannot sign", PrefixPublicKey)
}

// Webhook is f as a sender of paystream's convention over Standard
// Webhooks sends it: the convention's body, webhook-id f.EventID, signed at
// now with the first signing secret of cfg.
func Webhook(cfg provider.Config, f provider.Fixture, now time.Time) (*provider.Webhook, error) {
	secret, err := SigningSecret(cfg.Secrets)
	if err != nil {
		return nil, err
	}
	body, err := ConventionBody(f)
	if err != nil {
		return nil, err
	}
	w := provider.NewWebhook(body)
	if err := SetSignature(w.Header, secret, f.EventID, now, body); err != nil {
		return nil, err
	}
	return w, nil
}

// SetSignature sets on h the headers a sender signing body with secret
// sends: webhook-id id, webhook-timestamp ts and webhook-signature.
func SetSignature(h http.Header, secret, id string, ts time.Time, body []byte) error {
	sig, err := Sign(secret, id, ts, body)
	if err != nil {
		return err
	}
	h.Set(HeaderID, id)
	h.Set(HeaderTimestamp, strconv.FormatInt(ts.Unix(), 10))
	h.Set(HeaderSignature, sig)
	return nil
}

// SignedRequest is body as the driver receives it from a sender that
// signed it with secret, with webhook-id id, at ts (which is also Now):
// for tests and tools that verify without HTTP.
func SignedRequest(secret, id string, ts time.Time, body []byte) (*provider.Request, error) {
	r := &provider.Request{Header: http.Header{}, Body: body, Now: ts}
	if err := SetSignature(r.Header, secret, id, ts, body); err != nil {
		return nil, err
	}
	return r, nil
}
