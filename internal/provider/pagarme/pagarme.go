// Package pagarme is the provider driver for Pagar.me (v5 / core API)
// webhooks: "X-Hub-Signature: sha1=<hex>", the HMAC-SHA1 of the raw body
// keyed by the account's secret API key, and Pagar.me's hook payloads
// (charge.* and order.* events) normalized onto payment facts keyed by
// charge id.
package pagarme

import (
	"crypto/hmac"
	"crypto/sha1"
	"encoding/hex"
	"strings"

	"github.com/paystream/paystream/internal/provider"
)

// HeaderSignature is the header carrying Pagar.me's signature.
const HeaderSignature = "X-Hub-Signature"

// Driver verifies and parses Pagar.me webhooks. Build it with New.
type Driver struct {
	secrets []*provider.Key
	account string
}

var _ provider.Driver = (*Driver)(nil)

// New builds a Driver. cfg.Secrets are the account's secret API keys
// ("sk_…"), the HMAC keys Pagar.me signs with; several allow rotation.
// Pagar.me's scheme carries no timestamp, so cfg.Tolerance is unused.
func New(cfg provider.Config) (provider.Driver, error) {
	secrets, err := provider.Keys(cfg, "pagarme", "secret API key", provider.HMACKey(sha1.New))
	if err != nil {
		return nil, err
	}
	return &Driver{secrets: secrets, account: cfg.Account}, nil
}

// Verify checks X-Hub-Signature against the HMAC-SHA1 of the body under
// every configured key.
func (d *Driver) Verify(r *provider.Request) error {
	v, err := r.RequireHeader(HeaderSignature)
	if err != nil {
		return err
	}
	algo, encoded, ok := strings.Cut(v, "=")
	if !ok || algo != "sha1" {
		return provider.Unauthentic(provider.ReasonMalformedHeader, "want sha1=<hex>")
	}
	sig, err := hex.DecodeString(encoded)
	if err != nil || len(sig) != sha1.Size {
		return provider.Unauthentic(provider.ReasonMalformedHeader, "signature not 40 hex digits")
	}
	for _, s := range d.secrets {
		if m := s.Sum(r.Body); m.Equal(sig) {
			return nil
		}
	}
	return provider.Unauthentic(provider.ReasonBadSignature, "signature does not match")
}

// Sign returns the X-Hub-Signature value Pagar.me would send for body under
// the API key secret. Tests and the load generator use it.
func Sign(secret string, body []byte) string {
	return "sha1=" + hex.EncodeToString(mac([]byte(secret), body))
}

func mac(key, body []byte) []byte {
	m := hmac.New(sha1.New, key)
	m.Write(body)
	return m.Sum(nil)
}
