// Package mercadopago is the provider driver for Mercado Pago webhooks. Mercado
// Pago signs a manifest, not the body: x-signature "ts=<unix>,v1=<hex>" is
// the HMAC-SHA256, keyed by the application's webhook secret, of
// "id:{data.id};request-id:{x-request-id};ts:{ts};", where data.id comes
// from the query string and x-request-id from its header. Since the body's
// contents are not authenticated, every event is marked NeedsRefetch: the
// payment's state must be read from Mercado Pago's API before money moves.
package mercadopago

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"strconv"
	"strings"
	"time"

	"github.com/paystream/paystream/internal/provider"
)

// Header names and the query parameter of the scheme.
const (
	HeaderSignature = "x-signature"
	HeaderRequestID = "x-request-id"
	QueryDataID     = "data.id"
)

// DefaultTolerance is the allowed distance between ts and the time of
// verification, either way, when Config.Tolerance is zero.
const DefaultTolerance = 5 * time.Minute

// Driver verifies and parses Mercado Pago webhooks. Build it with New.
type Driver struct {
	signing provider.Signing
}

var _ provider.Driver = (*Driver)(nil)

// New builds a Driver. cfg.Secrets are the application's webhook secret
// signatures ("assinatura secreta"); several allow rotation. cfg.Tolerance
// defaults to DefaultTolerance.
func New(cfg provider.Config) (provider.Driver, error) {
	signing, err := provider.NewSigning(cfg, "mercadopago", "webhook secret", DefaultTolerance, provider.HMACKey(sha256.New))
	if err != nil {
		return nil, err
	}
	return &Driver{signing: signing}, nil
}

// Verify checks x-signature against the manifest built from the query's
// data.id, x-request-id and ts, under every configured secret, then checks
// ts against r.Now. ts is in seconds, as Mercado Pago documents; a 13-digit
// ts is read as milliseconds.
func (d *Driver) Verify(r *provider.Request) error {
	return signatureHeader.Verify(r, d.signing.Keys, d.signing.Tolerance, parseTS, func(k *provider.Key, ts string) provider.MAC {
		return k.Sum(nil, Manifest(r.Query.Get(QueryDataID), r.Header.Get(HeaderRequestID), ts))
	})
}

// signatureHeader is x-signature: "ts=…,v1=…".
var signatureHeader = provider.SignatureHeader{Name: HeaderSignature, TS: "ts", MaxSignatures: 8}

// Manifest builds the string Mercado Pago signs. dataID is lower-cased when
// alphanumeric, as Mercado Pago documents; a part whose value is absent is
// left out.
func Manifest(dataID, requestID, ts string) string {
	var b strings.Builder
	if dataID != "" {
		if isAlnum(dataID) {
			dataID = strings.ToLower(dataID)
		}
		b.WriteString("id:" + dataID + ";")
	}
	if requestID != "" {
		b.WriteString("request-id:" + requestID + ";")
	}
	if ts != "" {
		b.WriteString("ts:" + ts + ";")
	}
	return b.String()
}

// Sign returns the x-signature value Mercado Pago would send for a
// notification about dataID with the given x-request-id at ts (in seconds).
// Tests and the load generator use it.
func Sign(secret, dataID, requestID string, ts time.Time) string {
	t := strconv.FormatInt(ts.Unix(), 10)
	return "ts=" + t + ",v1=" + hex.EncodeToString(mac([]byte(secret), Manifest(dataID, requestID, t)))
}

func mac(secret []byte, manifest string) []byte {
	m := hmac.New(sha256.New, secret)
	m.Write([]byte(manifest))
	return m.Sum(nil)
}

func isAlnum(s string) bool {
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !('0' <= c && c <= '9' || 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z') {
			return false
		}
	}
	return true
}

// parseTS reads ts: unix seconds, or milliseconds when it has 13 digits.
func parseTS(s string) (time.Time, error) {
	n, err := provider.ParseDigits(s, 13)
	if err != nil {
		return time.Time{}, err
	}
	if len(s) == 13 {
		return time.UnixMilli(n), nil
	}
	return time.Unix(n, 0), nil
}
