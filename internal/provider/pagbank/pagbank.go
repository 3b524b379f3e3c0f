// Package pagbank is the provider driver for PagBank (PagSeguro) orders API
// webhooks: x-authenticity-token is the SHA-256, in hex, of the account's
// token, a hyphen and the raw body ("{token}-{body}"), and the order (or
// charge) payload is normalized onto payment facts keyed by charge id.
package pagbank

import (
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"strings"

	"github.com/paystream/paystream/internal/provider"
)

// HeaderSignature is the header carrying PagBank's signature.
const HeaderSignature = "x-authenticity-token"

// Driver verifies and parses PagBank webhooks. Build it with New.
type Driver struct {
	tokens  [][]byte
	account string
}

var _ provider.Driver = (*Driver)(nil)

// New builds a Driver. cfg.Secrets are the account's PagBank tokens;
// several allow rotation. The scheme carries no timestamp, so cfg.Tolerance
// is unused.
func New(cfg provider.Config) (provider.Driver, error) {
	tokens, err := provider.Keys(cfg, "pagbank", "account token", func(s string) ([]byte, error) { return []byte(s), nil })
	if err != nil {
		return nil, err
	}
	return &Driver{tokens: tokens, account: cfg.Account}, nil
}

// Verify checks x-authenticity-token against SHA-256("{token}-{body}") for
// every configured token, in constant time.
func (d *Driver) Verify(r *provider.Request) error {
	v, err := r.RequireHeader(HeaderSignature)
	if err != nil {
		return err
	}
	sig, err := hex.DecodeString(strings.TrimSpace(v))
	if err != nil || len(sig) != sha256.Size {
		return provider.Unauthentic(provider.ReasonMalformedHeader, "token not 64 hex digits")
	}
	match := 0
	for _, t := range d.tokens {
		want := digest(t, r.Body)
		match |= subtle.ConstantTimeCompare(want[:], sig)
	}
	if match != 1 {
		return provider.Unauthentic(provider.ReasonBadSignature, "authenticity token does not match")
	}
	return nil
}

// Sign returns the x-authenticity-token PagBank would send for body under
// token. Tests and the load generator use it.
func Sign(token string, body []byte) string {
	sum := digest([]byte(token), body)
	return hex.EncodeToString(sum[:])
}

func digest(token, body []byte) [sha256.Size]byte {
	h := sha256.New()
	h.Write(token)
	h.Write([]byte{'-'})
	h.Write(body)
	var out [sha256.Size]byte
	h.Sum(out[:0])
	return out
}
