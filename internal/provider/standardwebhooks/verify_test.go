package standardwebhooks

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/paystream/paystream/internal/provider"
	"github.com/paystream/paystream/internal/provider/providertest"
)

const (
	oldSecret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
	newSecret = "whsec_c2Vjb25kIHNlY3JldCBmb3Igcm90YXRpb24="
)

// verifyCases is both the table of TestVerify and FuzzVerify's seed corpus.
// Every case is sent with webhook-id "msg_1" unless id is set; sig is the
// webhook-signature header, "" meaning computed with Sign under secret.
var verifyCases = []struct {
	name   string
	secret string // signs the request; empty means use sig as given
	id     string
	ts     string
	sig    string
	body   string
	skew   time.Duration // Now - timestamp
	reason string        // "" means accepted
}{
	{name: "old secret", secret: oldSecret, id: "msg_1", ts: "1718210703", body: `{"type":"payment.paid"}`},
	{name: "new secret", secret: newSecret, id: "msg_1", ts: "1718210703", body: `{"type":"payment.paid"}`},
	{name: "clock behind", secret: newSecret, id: "msg_1", ts: "1718210703", body: `{}`, skew: -4 * time.Minute},
	{name: "clock ahead", secret: newSecret, id: "msg_1", ts: "1718210703", body: `{}`, skew: 4 * time.Minute},
	{name: "too old", secret: newSecret, id: "msg_1", ts: "1718210703", body: `{}`, skew: 6 * time.Minute, reason: provider.ReasonTimestamp},
	{name: "from the future", secret: newSecret, id: "msg_1", ts: "1718210703", body: `{}`, skew: -6 * time.Minute, reason: provider.ReasonTimestamp},
	{name: "wrong secret", secret: "whsec_d3Jvbmcgc2VjcmV0", id: "msg_1", ts: "1718210703", body: `{}`, reason: provider.ReasonBadSignature},
	{name: "missing id", sig: "v1,AAAA", ts: "1718210703", body: `{}`, reason: provider.ReasonMissingHeader},
	{name: "missing timestamp", sig: "v1,AAAA", id: "msg_1", body: `{}`, reason: provider.ReasonMissingHeader},
	{name: "missing signature", id: "msg_1", ts: "1718210703", body: `{}`, reason: provider.ReasonMissingHeader},
	{name: "timestamp not a number", sig: "v1,AAAA", id: "msg_1", ts: "2024-06-12", body: `{}`, reason: provider.ReasonMalformedHeader},
	{name: "negative timestamp", sig: "v1,AAAA", id: "msg_1", ts: "-1718210703", body: `{}`, reason: provider.ReasonMalformedHeader},
	{name: "unknown version only", sig: "v2,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE=", id: "msg_1", ts: "1718210703", body: `{}`, reason: provider.ReasonMalformedHeader},
	{name: "not base64", sig: "v1,!!!", id: "msg_1", ts: "1718210703", body: `{}`, reason: provider.ReasonMalformedHeader},
	{name: "huge header", sig: strings.Repeat("v1,AAAA ", 4096), id: "msg_1", ts: "1718210703", body: `{}`, reason: provider.ReasonBadSignature},
	{name: "empty body", secret: oldSecret, id: "msg_1", ts: "1718210703", body: ``},
}

func verifyRequest(t testing.TB, secret, id, ts, sig, body string, skew time.Duration) *provider.Request {
	r := &provider.Request{Header: http.Header{}, Body: []byte(body)}
	n, err := strconv.ParseInt(ts, 10, 64)
	if err != nil {
		n = 1718210703
	}
	r.Now = time.Unix(n, 0).Add(skew)
	if secret != "" {
		s, err := Sign(secret, id, time.Unix(n, 0), []byte(body))
		if err != nil {
			t.Fatal(err)
		}
		sig = s
	}
	for k, v := range map[string]string{HeaderID: id, HeaderTimestamp: ts, HeaderSignature: sig} {
		if v != "" {
			r.Header.Set(k, v)
		}
	}
	return r
}

func TestVerify(t *testing.T) {
	t.Parallel()
	d, err := New(provider.Config{Secrets: []string{oldSecret, newSecret}})
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range verifyCases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			r := verifyRequest(t, tc.secret, tc.id, tc.ts, tc.sig, tc.body, tc.skew)
			err := d.Verify(r)
			if tc.reason == "" {
				if err != nil {
					t.Fatalf("Verify: %v", err)
				}
				// Tampering with the body, id or timestamp breaks it.
				for name, tamper := range map[string]func(*provider.Request){
					"body":      func(r *provider.Request) { r.Body = append(append([]byte{}, r.Body...), ' ') },
					"id":        func(r *provider.Request) { r.Header.Set(HeaderID, "msg_2") },
					"timestamp": func(r *provider.Request) { r.Header.Set(HeaderTimestamp, strconv.FormatInt(r.Now.Unix()+1, 10)) },
				} {
					r := verifyRequest(t, tc.secret, tc.id, tc.ts, tc.sig, tc.body, tc.skew)
					tamper(r)
					var ve *provider.VerifyError
					if err := d.Verify(r); !errors.As(err, &ve) || ve.Reason != provider.ReasonBadSignature {
						t.Errorf("tampered %s: Verify = %v, want bad_signature", name, err)
					}
				}
				return
			}
			var ve *provider.VerifyError
			if !errors.As(err, &ve) || ve.Reason != tc.reason {
				t.Fatalf("Verify = %v, want reason %s", err, tc.reason)
			}
		})
	}
}

func FuzzVerify(f *testing.F) {
	d, err := New(provider.Config{Secrets: []string{oldSecret, newSecret}})
	if err != nil {
		f.Fatal(err)
	}
	for _, tc := range verifyCases {
		r := verifyRequest(f, tc.secret, tc.id, tc.ts, tc.sig, tc.body, tc.skew)
		f.Add(providertest.Encode(r), []byte(tc.body), r.Now.Unix())
	}
	providertest.AddSeeds(f, harness(), false)
	providertest.FuzzVerify(f, d, func(r *provider.Request) bool {
		// Independent oracle: HMAC-SHA256 with the standard library.
		ts := r.Header.Get(HeaderTimestamp)
		content := r.Header.Get(HeaderID) + "." + ts + "." + string(r.Body)
		for _, s := range []string{oldSecret, newSecret} {
			key, _ := base64.StdEncoding.DecodeString(strings.TrimPrefix(s, "whsec_"))
			m := hmac.New(sha256.New, key)
			m.Write([]byte(content))
			want := "v1," + base64.StdEncoding.EncodeToString(m.Sum(nil))
			for _, field := range strings.Fields(strings.Join(r.Header.Values(HeaderSignature), " ")) {
				if field == want {
					return true
				}
			}
		}
		return false
	})
}

// BenchmarkVerify verifies one signed 1 KiB webhook under one secret: the
// signature check every Standard Webhooks delivery pays in ingest.
func BenchmarkVerify(b *testing.B) {
	d := harness().Driver(b, newSecret)
	body := `{"type":"payment.paid","data":{"pad":"` + strings.Repeat("x", 1000) + `"}}`
	r := verifyRequest(b, newSecret, "msg_2Lh1Xc0MbkbOuXo3fWyJ2pe2vXK", "1718210703", "", body, 0)
	b.ReportAllocs()
	b.SetBytes(int64(len(body)))
	for b.Loop() {
		if err := d.Verify(r); err != nil {
			b.Fatal(err)
		}
	}
}
