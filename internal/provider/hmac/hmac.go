// Package hmac is the generic provider driver for senders that sign the raw
// body with an HMAC in one header, GitHub-style ("X-Hub-Signature-256:
// sha256=<hex>"). Header, algorithm, prefix and encoding are options; the
// payload follows paystream's convention (see standardwebhooks.ParsePayload).
//
// The scheme carries no timestamp, so it cannot reject replays by age: a
// replayed delivery has the same body, hence the same derived dedup key, and
// is dropped as a duplicate.
package hmac

import (
	stdhmac "crypto/hmac"
	"crypto/sha1"
	"crypto/sha256"
	"crypto/sha512"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"hash"
	"net/http"
	"strings"
	"time"

	"github.com/paystream/paystream/internal/provider"
	"github.com/paystream/paystream/internal/provider/standardwebhooks"
)

// Option keys read from Config.Options.
const (
	// OptionHeader names the header carrying the signature. Required.
	OptionHeader = "header"
	// OptionAlgorithm is sha256, sha1 or sha512. Defaults to sha256.
	OptionAlgorithm = "algorithm"
	// OptionPrefix is stripped from the header value before decoding, e.g.
	// "sha256=". Defaults to none.
	OptionPrefix = "prefix"
	// OptionEncoding is hex or base64. Defaults to hex.
	OptionEncoding = "encoding"
	// OptionIDHeader names a header carrying the sender's event id, kept
	// as EventID. Defaults to none. The header is not covered by the
	// signature, so it is the dedup key only with OptionDedupOnIDHeader.
	OptionIDHeader = "id_header"
	// OptionDedupOnIDHeader, "true", makes the id header's value the dedup
	// key instead of the business key derived from the signed body: for
	// senders whose distinct events can share payment, type, status,
	// timestamp and refund id. Anyone replaying a captured body with a new
	// id then gets past dedup (the state machine still ignores it as a
	// duplicate fact). Defaults to false.
	OptionDedupOnIDHeader = "dedup_on_id_header"
)

// Driver verifies and parses generic-HMAC webhooks. Build it with New.
type Driver struct {
	header   string
	newHash  func() hash.Hash
	prefix   string
	base64   bool
	idHeader string
	idDedup  bool // the id header is the dedup key (OptionDedupOnIDHeader)
	secrets  []*provider.Key
	account  string
}

var _ provider.Driver = (*Driver)(nil)

// New builds a Driver from cfg.Options (see the Option constants) and
// cfg.Secrets, the HMAC keys used as given; several allow rotation.
func New(cfg provider.Config) (provider.Driver, error) {
	d := &Driver{
		header:   http.CanonicalHeaderKey(cfg.Options[OptionHeader]),
		prefix:   cfg.Options[OptionPrefix],
		idHeader: cfg.Options[OptionIDHeader],
		account:  cfg.Account,
	}
	if d.header == "" {
		return nil, errors.New("hmac: Options.header: the signature header is required")
	}
	switch v := cfg.Options[OptionDedupOnIDHeader]; v {
	case "", "false":
	case "true":
		if d.idHeader == "" {
			return nil, errors.New("hmac: Options.dedup_on_id_header: needs Options.id_header")
		}
		d.idDedup = true
	default:
		return nil, fmt.Errorf("hmac: Options.dedup_on_id_header: %q is not true or false", v)
	}
	var err error
	if d.newHash, err = algorithm(cfg.Options[OptionAlgorithm]); err != nil {
		return nil, err
	}
	switch cfg.Options[OptionEncoding] {
	case "", "hex":
	case "base64":
		d.base64 = true
	default:
		return nil, fmt.Errorf("hmac: Options.encoding: %q is not hex or base64", cfg.Options[OptionEncoding])
	}
	if d.secrets, err = provider.Keys(cfg, "hmac", "secret", provider.HMACKey(d.newHash)); err != nil {
		return nil, err
	}
	return d, nil
}

func algorithm(name string) (func() hash.Hash, error) {
	switch name {
	case "", "sha256":
		return sha256.New, nil
	case "sha1":
		return sha1.New, nil
	case "sha512":
		return sha512.New, nil
	}
	return nil, fmt.Errorf("hmac: Options.algorithm: %q is not sha256, sha1 or sha512", name)
}

// Verify checks the signature header against the HMAC of the body under
// every configured secret.
func (d *Driver) Verify(r *provider.Request) error {
	v, err := r.RequireHeader(d.header)
	if err != nil {
		return err
	}
	if !strings.HasPrefix(v, d.prefix) {
		return provider.Unauthentic(provider.ReasonMalformedHeader, "missing prefix "+d.prefix)
	}
	sig, err := d.decode(strings.TrimPrefix(v, d.prefix))
	if err != nil {
		return provider.Unauthentic(provider.ReasonMalformedHeader, "signature not "+d.encoding())
	}
	for _, s := range d.secrets {
		if m := s.Sum(r.Body); m.Equal(sig) {
			return nil
		}
	}
	return provider.Unauthentic(provider.ReasonBadSignature, "signature does not match")
}

func (d *Driver) encoding() string {
	if d.base64 {
		return "base64"
	}
	return "hex"
}

func (d *Driver) decode(s string) ([]byte, error) {
	if d.base64 {
		return base64.StdEncoding.DecodeString(s)
	}
	return hex.DecodeString(s)
}

// Parse normalizes a body following paystream's payload convention. The
// dedup key is a business key derived from the signed body (payment id,
// type, status, timestamp and refund id), or the id header's value when
// OptionDedupOnIDHeader says to trust it and it is present. The id
// header's value is the EventID either way.
func (d *Driver) Parse(r *provider.Request) (provider.Event, error) {
	ev, err := standardwebhooks.ParsePayload(r.Body, time.Time{})
	if err != nil {
		return provider.Event{}, err
	}
	if d.idHeader != "" {
		if id := r.Header.Get(d.idHeader); id != "" {
			if err := provider.CheckID(d.idHeader, id); err != nil {
				return provider.Event{}, err
			}
			ev.EventID = id
		}
	}
	key := provider.BusinessKey(ev.PaymentID, ev.Type, ev.Fact.Status, ev.Fact.OccurredAt, ev.Fact.RefundID)
	if d.idDedup && ev.EventID != "" {
		key = ev.EventID
	}
	ev.DedupKey = provider.ScopeKey(d.account, key)
	return ev, nil
}

// Sign returns the signature header value for body: prefix followed by the
// HMAC of body under secret with algorithm (sha256, sha1, sha512) in
// encoding (hex, base64). Tests and the load generator use it.
func Sign(secret, algorithmName, prefix, encoding string, body []byte) (string, error) {
	newHash, err := algorithm(algorithmName)
	if err != nil {
		return "", err
	}
	m := stdhmac.New(newHash, []byte(secret))
	m.Write(body)
	switch encoding {
	case "", "hex":
		return prefix + hex.EncodeToString(m.Sum(nil)), nil
	case "base64":
		return prefix + base64.StdEncoding.EncodeToString(m.Sum(nil)), nil
	}
	return "", fmt.Errorf("hmac: encoding %q is not hex or base64", encoding)
}
