package provider_test

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/paystream/paystream/internal/provider"
)

// TestSignatureHeader checks the header rules Stripe's and Mercado Pago's
// drivers share, beyond what their conformance suites try.
func TestSignatureHeader(t *testing.T) {
	t.Parallel()
	h := provider.SignatureHeader{Name: "X-Sig", TS: "t", MaxSignatures: 2}
	key := provider.NewKey(sha256.New, []byte("secret"))
	now := time.Unix(1718221500, 0)
	sum := func(k *provider.Key, ts string) provider.MAC { return k.Sum([]byte("body"), ts, ".") }
	sig := func(ts string) string {
		m := sum(key, ts)
		return hex.EncodeToString(m.Bytes())
	}
	good, old := sig("1718221500"), strconv.FormatInt(now.Unix()-301, 10)
	parse := func(s string) (time.Time, error) {
		n, err := provider.ParseDigits(s, 12)
		return time.Unix(n, 0), err
	}
	for _, tc := range []struct{ header, reason string }{
		{"t=1718221500,v1=" + good, ""},
		{" t = 1718221500 , v0=00, v1 = " + strings.ToUpper(good), ""},
		{"t=1718221500,v1=00,v1=" + good, ""},
		{"", provider.ReasonMissingHeader},
		{"t=1718221500,t=1718221500,v1=" + good, provider.ReasonMalformedHeader},
		{"v1=" + good, provider.ReasonMalformedHeader},
		{"t=-1718221500,v1=" + good, provider.ReasonMalformedHeader},
		{"t=1718221500,v0=" + good, provider.ReasonMalformedHeader},
		{"t=1718221500,v1=00,v1=01,v1=" + good, provider.ReasonBadSignature}, // past MaxSignatures
		{"t=1718221501,v1=" + good, provider.ReasonBadSignature},
		{"t=" + old + ",v1=" + sig(old), provider.ReasonTimestamp},
	} {
		r := &provider.Request{Header: http.Header{}, Body: []byte("body"), Now: now}
		if tc.header != "" {
			r.Header.Set("X-Sig", tc.header)
		}
		err := h.Verify(r, []*provider.Key{key}, 300*time.Second, parse, sum)
		var ve *provider.VerifyError
		switch {
		case tc.reason == "" && err != nil:
			t.Errorf("%q: %v", tc.header, err)
		case tc.reason != "" && (!errors.As(err, &ve) || ve.Reason != tc.reason):
			t.Errorf("%q: Verify = %v, want reason %s", tc.header, err, tc.reason)
		}
	}
}
