// Package stripe is the provider driver for Stripe webhooks: the
// Stripe-Signature header ("t=<unix>,v1=<hex HMAC-SHA256>") over
// "{t}.{body}" keyed by the endpoint's signing secret, and Stripe's event
// objects normalized onto payment facts keyed by PaymentIntent.
package stripe

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"strconv"
	"strings"
	"time"

	"github.com/paystream/paystream/internal/provider"
)

// HeaderSignature is the header carrying Stripe's signature.
const HeaderSignature = "Stripe-Signature"

// DefaultTolerance is the allowed distance between the signed timestamp and
// the time of verification, either way, when Config.Tolerance is zero. It is
// Stripe's own default.
const DefaultTolerance = 300 * time.Second

// maxSignatures bounds how many v1 signatures of one header are compared.
const maxSignatures = 16

// Driver verifies and parses Stripe webhooks. Build it with New.
type Driver struct {
	signing provider.Signing
}

var _ provider.Driver = (*Driver)(nil)

// New builds a Driver. cfg.Secrets are endpoint signing secrets ("whsec_…",
// used as the HMAC key as is, the way Stripe does); several allow rotation.
// cfg.Tolerance defaults to DefaultTolerance.
func New(cfg provider.Config) (provider.Driver, error) {
	signing, err := provider.NewSigning(cfg, "stripe", "endpoint signing secret", DefaultTolerance, func(s string) (*provider.Key, error) {
		if !strings.HasPrefix(s, "whsec_") {
			return nil, errors.New("an endpoint signing secret starts with whsec_ (is this an API key?)")
		}
		return provider.NewKey(sha256.New, []byte(s)), nil
	})
	if err != nil {
		return nil, err
	}
	return &Driver{signing: signing}, nil
}

// Verify checks the Stripe-Signature header: any v1 signature matching any
// configured secret verifies, other schemes (v0) are ignored, and the signed
// timestamp must be within the tolerance of r.Now either way.
func (d *Driver) Verify(r *provider.Request) error {
	return signatureHeader.Verify(r, d.signing.Keys, d.signing.Tolerance, parseUnix, func(k *provider.Key, ts string) provider.MAC {
		return k.Sum(r.Body, ts, ".")
	})
}

// signatureHeader is Stripe-Signature: "t=…,v1=…[,v1=…][,v0=…]".
var signatureHeader = provider.SignatureHeader{Name: HeaderSignature, TS: "t", MaxSignatures: maxSignatures}

// Sign returns the Stripe-Signature header value Stripe would send for body
// at ts with secret. Tests and the load generator use it.
func Sign(secret string, ts time.Time, body []byte) string {
	t := strconv.FormatInt(ts.Unix(), 10)
	return "t=" + t + ",v1=" + hex.EncodeToString(mac([]byte(secret), t, body))
}

func mac(secret []byte, ts string, body []byte) []byte {
	m := hmac.New(sha256.New, secret)
	m.Write([]byte(ts))
	m.Write([]byte{'.'})
	m.Write(body)
	return m.Sum(nil)
}

func parseUnix(s string) (time.Time, error) {
	n, err := provider.ParseDigits(s, 12)
	return time.Unix(n, 0), err
}
