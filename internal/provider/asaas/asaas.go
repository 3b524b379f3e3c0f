// Package asaas is the provider driver for Asaas webhooks: a static
// authentication token in the asaas-access-token header (chosen when the
// webhook is configured) and Asaas' PAYMENT_* events normalized onto payment
// facts keyed by the Asaas payment id.
package asaas

import (
	"github.com/paystream/paystream/internal/provider"
)

// HeaderToken is the header carrying the webhook's authentication token.
const HeaderToken = "asaas-access-token"

// Driver verifies and parses Asaas webhooks. Build it with New.
type Driver struct {
	tokens  []provider.TokenDigest
	account string
}

var _ provider.Driver = (*Driver)(nil)

// New builds a Driver. cfg.Secrets are the webhook authentication tokens
// configured in Asaas; several allow rotation. Asaas' scheme carries no
// timestamp, so cfg.Tolerance is unused.
func New(cfg provider.Config) (provider.Driver, error) {
	tokens, err := provider.Keys(cfg, "asaas", "authentication token", func(s string) (provider.TokenDigest, error) { return provider.DigestToken(s), nil })
	if err != nil {
		return nil, err
	}
	return &Driver{tokens: tokens, account: cfg.Account}, nil
}

// Verify compares the token header with every configured token in constant
// time: both sides are hashed with SHA-256 first, so neither the comparison
// nor an early length check leaks the token's length.
func (d *Driver) Verify(r *provider.Request) error {
	v, err := r.RequireHeader(HeaderToken)
	if err != nil {
		return err
	}
	if !provider.MatchToken(d.tokens, v) {
		return provider.Unauthentic(provider.ReasonBadSignature, "token does not match")
	}
	return nil
}

// Sign returns the header value Asaas sends: the token itself. It exists so
// tests and the load generator treat every driver alike.
func Sign(token string) string { return token }
