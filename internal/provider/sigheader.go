package provider

import (
	"encoding/hex"
	"errors"
	"strconv"
	"strings"
	"time"
)

// SignatureHeader is a signature header of comma-separated key=value parts
// carrying one timestamp and hex "v1" signatures, other parts (v0, unknown
// schemes) ignored: Stripe's Stripe-Signature ("t=…,v1=…") and Mercado
// Pago's x-signature ("ts=…,v1=…"). Blanks around parts, keys and values
// are ignored.
type SignatureHeader struct {
	// Name is the header's name.
	Name string
	// TS is the key of the timestamp part: "t", "ts".
	TS string
	// MaxSignatures bounds how many v1 signatures are compared; later ones
	// are ignored.
	MaxSignatures int
}

// Verify checks r's header h: some v1 signature must be the MAC that sum
// computes under one of keys for the header's timestamp (as written), and
// that timestamp, read by parseTS, must be within tolerance of r.Now
// either way. A header with several timestamps, none, or no readable v1
// is malformed.
func (h SignatureHeader) Verify(r *Request, keys []*Key, tolerance time.Duration,
	parseTS func(string) (time.Time, error), sum func(k *Key, ts string) MAC,
) error {
	header, err := r.RequireHeader(h.Name)
	if err != nil {
		return err
	}
	var ts string
	var sigs [][]byte
	for _, part := range strings.Split(header, ",") {
		k, v, ok := strings.Cut(strings.TrimSpace(part), "=")
		if !ok {
			continue
		}
		switch strings.TrimSpace(k) {
		case h.TS:
			if ts != "" {
				return Unauthentic(ReasonMalformedHeader, "several "+h.TS+"= in "+h.Name)
			}
			ts = strings.TrimSpace(v)
		case "v1":
			if len(sigs) == h.MaxSignatures {
				continue
			}
			if b, err := hex.DecodeString(strings.TrimSpace(v)); err == nil {
				sigs = append(sigs, b)
			}
		}
	}
	t, err := parseTS(ts)
	if err != nil {
		return Unauthentic(ReasonMalformedHeader, "no valid "+h.TS+"= in "+h.Name)
	}
	if len(sigs) == 0 {
		return Unauthentic(ReasonMalformedHeader, "no v1 signature in "+h.Name)
	}
	ok := false
	for _, k := range keys {
		want := sum(k, ts)
		for _, sig := range sigs {
			if want.Equal(sig) {
				ok = true
			}
		}
	}
	if !ok {
		return Unauthentic(ReasonBadSignature, "no v1 signature matches")
	}
	if skew := r.Now.Sub(t); skew > tolerance || skew < -tolerance {
		return Unauthentic(ReasonTimestamp, h.TS+"= too far from now")
	}
	return nil
}

// ParseDigits reads a non-negative decimal timestamp of at most max digits,
// nothing else (no sign, no blank): what a signature header's timestamp
// must be before it is compared with the clock.
func ParseDigits(s string, max int) (int64, error) {
	if s == "" || len(s) > max || strings.TrimLeft(s, "0123456789") != "" {
		return 0, errors.New("bad timestamp")
	}
	return strconv.ParseInt(s, 10, 64)
}
