// Package standardwebhooks is the provider driver for senders that speak
// Standard Webhooks (https://www.standardwebhooks.com): a webhook-id, a
// webhook-timestamp in unix seconds and a webhook-signature header holding
// space-separated "v1,<base64 HMAC-SHA256>" and "v1a,<base64 Ed25519>"
// signatures over "{id}.{timestamp}.{body}".
//
// It also defines paystream's own payload convention for such senders (see
// ParsePayload), which the generic hmac driver shares.
package standardwebhooks

import (
	"crypto/ed25519"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/paystream/paystream/internal/provider"
)

// Header names of the Standard Webhooks scheme.
const (
	HeaderID        = "webhook-id"
	HeaderTimestamp = "webhook-timestamp"
	HeaderSignature = "webhook-signature"
)

// Secret prefixes: whsec_ for symmetric HMAC secrets, whpk_ for Ed25519
// public keys (verification) and whsk_ for Ed25519 private keys (signing,
// accepted by Sign only: a verifier never needs one).
const (
	PrefixSecret     = "whsec_"
	PrefixPublicKey  = "whpk_"
	PrefixPrivateKey = "whsk_"
)

// DefaultTolerance is the allowed distance between webhook-timestamp and the
// time of verification, either way, when Config.Tolerance is zero.
const DefaultTolerance = 5 * time.Minute

// maxSignatures bounds how many signatures of one header are looked at, so a
// huge header cannot buy unbounded Ed25519 work.
const maxSignatures = 16

// Driver verifies and parses Standard Webhooks requests. Build it with New.
type Driver struct {
	hmacKeys  []*provider.Key
	publicKey []ed25519.PublicKey
	tolerance time.Duration
	account   string
	refetch   bool
}

var _ provider.Driver = (*Driver)(nil)

// New builds a Driver. cfg.Secrets must hold at least one secret, each either
// "whsec_<base64 key>" (HMAC-SHA256, "v1") or "whpk_<base64 32-byte Ed25519
// public key>" ("v1a"); several allow rotation. cfg.Tolerance defaults to
// DefaultTolerance. With cfg.Refetch, every event is marked NeedsRefetch and
// the payment's state comes from the refetch convention (see
// RefetchRequest and ParseRefetch).
func New(cfg provider.Config) (provider.Driver, error) {
	tolerance, err := cfg.ToleranceOr("standardwebhooks", DefaultTolerance)
	if err != nil {
		return nil, err
	}
	d := &Driver{tolerance: tolerance, account: cfg.Account, refetch: cfg.Refetch}
	if err := cfg.EachSecret("standardwebhooks", "secret", func(_ int, s string) error {
		switch {
		case strings.HasPrefix(s, PrefixSecret):
			key, err := decodeKey(strings.TrimPrefix(s, PrefixSecret))
			if err != nil || len(key) == 0 {
				return fmt.Errorf("%s secret is not valid base64", PrefixSecret)
			}
			d.hmacKeys = append(d.hmacKeys, provider.NewKey(sha256.New, key))
		case strings.HasPrefix(s, PrefixPublicKey):
			key, err := decodeKey(strings.TrimPrefix(s, PrefixPublicKey))
			if err != nil || len(key) != ed25519.PublicKeySize {
				return fmt.Errorf("%s key must be base64 of %d bytes", PrefixPublicKey, ed25519.PublicKeySize)
			}
			d.publicKey = append(d.publicKey, ed25519.PublicKey(key))
		case strings.HasPrefix(s, PrefixPrivateKey):
			return fmt.Errorf("%s is a signing key; configure the public key (%s…) instead", PrefixPrivateKey, PrefixPublicKey)
		default:
			return fmt.Errorf("must start with %s (HMAC secret) or %s (Ed25519 public key)", PrefixSecret, PrefixPublicKey)
		}
		return nil
	}); err != nil {
		return nil, err
	}
	return d, nil
}

// decodeKey accepts standard base64 with or without padding.
func decodeKey(s string) ([]byte, error) {
	if b, err := base64.StdEncoding.DecodeString(s); err == nil {
		return b, nil
	}
	return base64.RawStdEncoding.DecodeString(s)
}

// The header names in canonical form, so that the lookups on every request
// need not canonicalize them again.
var (
	canonicalID        = http.CanonicalHeaderKey(HeaderID)
	canonicalTimestamp = http.CanonicalHeaderKey(HeaderTimestamp)
	canonicalSignature = http.CanonicalHeaderKey(HeaderSignature)
)

// headerValue is h.Get(key) for a canonical key.
func headerValue(h http.Header, key string) string {
	if v := h[key]; len(v) > 0 {
		return v[0]
	}
	return ""
}

// Verify checks the request's signature headers against every configured
// secret; any one matching signature verifies it.
func (d *Driver) Verify(r *provider.Request) error {
	id := headerValue(r.Header, canonicalID)
	tsText := headerValue(r.Header, canonicalTimestamp)
	sigs := strings.Join(r.Header[canonicalSignature], " ")
	switch {
	case id == "":
		return provider.Unauthentic(provider.ReasonMissingHeader, HeaderID)
	case tsText == "":
		return provider.Unauthentic(provider.ReasonMissingHeader, HeaderTimestamp)
	case strings.TrimSpace(sigs) == "":
		return provider.Unauthentic(provider.ReasonMissingHeader, HeaderSignature)
	}
	ts, err := parseTimestamp(tsText)
	if err != nil {
		return provider.Unauthentic(provider.ReasonMalformedHeader, HeaderTimestamp)
	}
	if skew := r.Now.Sub(ts); skew > d.tolerance || skew < -d.tolerance {
		return provider.Unauthentic(provider.ReasonTimestamp, "webhook-timestamp too far from now")
	}

	// The MACs under each secret, computed once for all the v1 signatures.
	var stack [2]provider.MAC
	macs := stack[:0]
	for _, k := range d.hmacKeys {
		macs = append(macs, k.Sum(r.Body, id, ".", tsText, "."))
	}
	var content []byte // for Ed25519, built at the first v1a signature
	seen, wellFormed := 0, 0
	for field := range strings.FieldsSeq(sigs) {
		if seen == maxSignatures {
			break
		}
		seen++
		version, encoded, ok := strings.Cut(field, ",")
		if !ok {
			continue
		}
		sig, err := base64.StdEncoding.DecodeString(encoded)
		if err != nil {
			continue
		}
		switch version {
		case "v1":
			wellFormed++
			for i := range macs {
				if macs[i].Equal(sig) {
					return nil
				}
			}
		case "v1a":
			wellFormed++
			if len(sig) != ed25519.SignatureSize || len(d.publicKey) == 0 {
				continue
			}
			if content == nil {
				content = signedContent(id, tsText, r.Body)
			}
			for _, pk := range d.publicKey {
				if ed25519.Verify(pk, content, sig) {
					return nil
				}
			}
		}
	}
	if wellFormed == 0 {
		return provider.Unauthentic(provider.ReasonMalformedHeader, "no v1 or v1a signature in webhook-signature")
	}
	return provider.Unauthentic(provider.ReasonBadSignature, "no signature matches")
}

// Parse normalizes the body, which follows the payload convention of
// ParsePayload. EventID and DedupKey are the webhook-id header (the dedup key
// prefixed with the account when Config.Account is set). When the source is
// configured `refetch: true` (Config.Refetch), the event is marked
// NeedsRefetch: its fact is kept as the webhook said it, but the processor
// applies the refetched state before money moves.
func (d *Driver) Parse(r *provider.Request) (provider.Event, error) {
	id := headerValue(r.Header, canonicalID)
	if err := provider.CheckID(HeaderID, id); err != nil {
		return provider.Event{}, err
	}
	var fallback time.Time
	if ts, err := parseTimestamp(headerValue(r.Header, canonicalTimestamp)); err == nil {
		fallback = ts
	}
	ev, err := ParsePayload(r.Body, fallback)
	if err != nil {
		return provider.Event{}, err
	}
	ev.EventID = id
	ev.DedupKey = provider.ScopeKey(d.account, id)
	ev.NeedsRefetch = d.refetch
	return ev, nil
}

// Sign returns the webhook-signature header value for body sent with the
// given id and timestamp: "v1,<base64>" for a whsec_ secret, "v1a,<base64>"
// for a whsk_ Ed25519 private key (base64 of the 64-byte key or of its
// 32-byte seed). Tests and the load generator use it.
func Sign(secret, id string, ts time.Time, body []byte) (string, error) {
	content := signedContent(id, strconv.FormatInt(ts.Unix(), 10), body)
	switch {
	case strings.HasPrefix(secret, PrefixSecret):
		key, err := decodeKey(strings.TrimPrefix(secret, PrefixSecret))
		if err != nil {
			return "", fmt.Errorf("sign: decode %s secret: %w", PrefixSecret, err)
		}
		return "v1," + base64.StdEncoding.EncodeToString(mac(key, content)), nil
	case strings.HasPrefix(secret, PrefixPrivateKey):
		key, err := decodeKey(strings.TrimPrefix(secret, PrefixPrivateKey))
		if err != nil {
			return "", fmt.Errorf("sign: decode %s key: %w", PrefixPrivateKey, err)
		}
		var priv ed25519.PrivateKey
		switch len(key) {
		case ed25519.PrivateKeySize:
			priv = ed25519.PrivateKey(key)
		case ed25519.SeedSize:
			priv = ed25519.NewKeyFromSeed(key)
		default:
			return "", fmt.Errorf("sign: %s key must be %d or %d bytes", PrefixPrivateKey, ed25519.PrivateKeySize, ed25519.SeedSize)
		}
		return "v1a," + base64.StdEncoding.EncodeToString(ed25519.Sign(priv, content)), nil
	default:
		return "", fmt.Errorf("sign: secret must start with %s or %s", PrefixSecret, PrefixPrivateKey)
	}
}

func signedContent(id, ts string, body []byte) []byte {
	b := make([]byte, 0, len(id)+len(ts)+len(body)+2)
	b = append(b, id...)
	b = append(b, '.')
	b = append(b, ts...)
	b = append(b, '.')
	return append(b, body...)
}

func mac(key, content []byte) []byte {
	m := hmac.New(sha256.New, key)
	m.Write(content)
	return m.Sum(nil)
}

// parseTimestamp reads unix seconds: digits only, no sign, at most 12 of
// them (year 33658), so garbage never reaches time arithmetic.
func parseTimestamp(s string) (time.Time, error) {
	if s == "" || len(s) > 12 {
		return time.Time{}, errors.New("bad timestamp")
	}
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return time.Time{}, errors.New("bad timestamp")
		}
	}
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil {
		return time.Time{}, err
	}
	return time.Unix(n, 0), nil
}
