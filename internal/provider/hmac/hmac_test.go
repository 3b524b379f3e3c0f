package hmac

import (
	stdhmac "crypto/hmac"
	"crypto/sha1"
	"crypto/sha256"
	"crypto/sha512"
	"encoding/base64"
	"encoding/hex"
	"hash"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/paystream/paystream/internal/payment"
	"github.com/paystream/paystream/internal/provider"
	"github.com/paystream/paystream/internal/provider/providertest"
)

var githubStyle = map[string]string{
	OptionHeader:    "X-Hub-Signature-256",
	OptionAlgorithm: "sha256",
	OptionPrefix:    "sha256=",
	OptionEncoding:  "hex",
	OptionIDHeader:  "X-GitHub-Delivery",
}

// githubDedupOnID is githubStyle trusting the unsigned delivery id for the
// dedup key.
var githubDedupOnID = map[string]string{
	OptionHeader:          "X-Hub-Signature-256",
	OptionAlgorithm:       "sha256",
	OptionPrefix:          "sha256=",
	OptionEncoding:        "hex",
	OptionIDHeader:        "X-GitHub-Delivery",
	OptionDedupOnIDHeader: "true",
}

func harness(opts map[string]string) providertest.Harness {
	var trusted []string
	if opts[OptionDedupOnIDHeader] == "true" {
		trusted = []string{opts[OptionIDHeader]}
	}
	return providertest.Harness{
		TrustedHeaders: trusted,
		New:            New,
		Config:         provider.Config{Options: opts},
		OldSecret:      "old-secret-7f3a",
		NewSecret:      "new-secret-91bc",
		WrongSecret:    "wrong-secret-0000",
		Sign: func(t testing.TB, secret string, body []byte, ts time.Time) *provider.Request {
			sig, err := Sign(secret, opts[OptionAlgorithm], opts[OptionPrefix], opts[OptionEncoding], body)
			if err != nil {
				t.Fatal(err)
			}
			r := &provider.Request{Header: http.Header{}, Body: body, Now: ts}
			r.Header.Set(opts[OptionHeader], sig)
			return r
		},
		RequiredHeaders: []string{opts[OptionHeader]},
		Tampers: map[string]func(*provider.Request){
			"prefix stripped": func(r *provider.Request) {
				h := http.CanonicalHeaderKey(opts[OptionHeader])
				r.Header.Set(h, strings.TrimPrefix(r.Header.Get(h), opts[OptionPrefix])+"00")
			},
		},
		Fixtures: fixtures(opts[OptionIDHeader], opts[OptionDedupOnIDHeader] == "true"),
	}
}

func fixtures(idHeader string, dedupOnID bool) []providertest.Fixture {
	paidAt := time.Date(2024, 6, 12, 19, 45, 0, 0, time.UTC)
	paid := payment.Fact{Status: payment.StatusPaid, AmountMinor: 25990, Currency: "BRL", OccurredAt: paidAt}
	body := []byte(`{"type":"payment.paid","timestamp":"2024-06-12T19:45:00Z","data":{"payment_id":"pay_8Jd2kQ","amount":25990,"currency":"BRL"}}`)
	derived := provider.BusinessKey("pay_8Jd2kQ", "payment.paid", payment.StatusPaid, paidAt, "")
	fx := []providertest.Fixture{
		{Name: "paid, derived key", Body: body, Want: &provider.Event{DedupKey: derived, PaymentID: "pay_8Jd2kQ", Type: "payment.paid", Fact: paid}},
		{Name: "unknown type", Body: []byte(`{"type":"payment.teleported","timestamp":"2024-06-12T19:45:00Z","data":{"payment_id":"p"}}`)},
		{Name: "no timestamp", Body: []byte(`{"type":"payment.paid","data":{"payment_id":"p"}}`)},
	}
	if idHeader != "" {
		// The id header is unsigned: it names the event, and keys dedup
		// only where the config trusts it.
		const id = "72d3162e-cc78-11e3-81ab-4c9367dc0958"
		key := derived
		if dedupOnID {
			key = id
		}
		fx = append(fx, providertest.Fixture{
			Name:   "paid, id header",
			Body:   body,
			Header: http.Header{http.CanonicalHeaderKey(idHeader): {id}},
			Want:   &provider.Event{EventID: id, DedupKey: key, PaymentID: "pay_8Jd2kQ", Type: "payment.paid", Fact: paid},
		})
	}
	return fx
}

func TestConformance(t *testing.T) {
	t.Parallel()
	for name, opts := range map[string]map[string]string{
		"github":                           githubStyle,
		"github, dedup on the delivery id": githubDedupOnID,
		"sha1 base64":                      {OptionHeader: "X-Signature", OptionAlgorithm: "sha1", OptionEncoding: "base64"},
		"sha512":                           {OptionHeader: "X-Webhook-Signature", OptionAlgorithm: "sha512", OptionPrefix: "sha512="},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			providertest.Run(t, harness(opts))
		})
	}
}

// TestKnownAnswer uses GitHub's documented example: secret "It's a Secret to
// Everybody", payload "Hello, World!".
func TestKnownAnswer(t *testing.T) {
	t.Parallel()
	const want = "sha256=757107ea0eb2509fc211221cce984b8a37570b6d7586c22c46f4379c8b043e17"
	got, err := Sign("It's a Secret to Everybody", "sha256", "sha256=", "hex", []byte("Hello, World!"))
	if err != nil || got != want {
		t.Fatalf("Sign = %q, %v; want GitHub's %q", got, err, want)
	}
	d, err := New(provider.Config{Secrets: []string{"It's a Secret to Everybody"}, Options: githubStyle})
	if err != nil {
		t.Fatal(err)
	}
	r := &provider.Request{Header: http.Header{"X-Hub-Signature-256": {want}}, Body: []byte("Hello, World!")}
	if err := d.Verify(r); err != nil {
		t.Fatalf("Verify: %v", err)
	}
	// Every algorithm and encoding against the standard library directly.
	for _, alg := range []struct {
		name string
		h    func() hash.Hash
	}{{"sha1", sha1.New}, {"sha256", sha256.New}, {"sha512", sha512.New}} {
		m := stdhmac.New(alg.h, []byte("k"))
		m.Write([]byte("body"))
		sum := m.Sum(nil)
		for enc, want := range map[string]string{"hex": hex.EncodeToString(sum), "base64": base64.StdEncoding.EncodeToString(sum)} {
			if got, _ := Sign("k", alg.name, "", enc, []byte("body")); got != want {
				t.Errorf("Sign %s %s = %q, want %q", alg.name, enc, got, want)
			}
		}
	}
}

func TestNewRejects(t *testing.T) {
	t.Parallel()
	for _, cfg := range []provider.Config{
		{Secrets: []string{"s"}},
		{Secrets: []string{"s"}, Options: map[string]string{OptionHeader: "X-Sig", OptionAlgorithm: "md5"}},
		{Secrets: []string{"s"}, Options: map[string]string{OptionHeader: "X-Sig", OptionEncoding: "base32"}},
		{Options: map[string]string{OptionHeader: "X-Sig"}},
		{Secrets: []string{""}, Options: map[string]string{OptionHeader: "X-Sig"}},
		{Secrets: []string{"s"}, Options: map[string]string{OptionHeader: "X-Sig", OptionDedupOnIDHeader: "true"}},
		{Secrets: []string{"s"}, Options: map[string]string{OptionHeader: "X-Sig", OptionIDHeader: "X-Id", OptionDedupOnIDHeader: "yes"}},
	} {
		if _, err := New(cfg); err == nil {
			t.Errorf("New(%+v) accepted", cfg)
		}
	}
}

// signedBy is FuzzVerify's oracle: GitHub's HMAC-SHA256 with the standard
// library.
func signedBy(r *provider.Request, secret string) bool {
	m := stdhmac.New(sha256.New, []byte(secret))
	m.Write(r.Body)
	return strings.EqualFold(r.Header.Get("X-Hub-Signature-256"), "sha256="+hex.EncodeToString(m.Sum(nil)))
}

func FuzzVerify(f *testing.F) { harness(githubStyle).FuzzVerify(f, signedBy) }

func FuzzParse(f *testing.F) { harness(githubStyle).FuzzParse(f) }

func TestSeedCorpus(t *testing.T) {
	t.Parallel()
	providertest.SeedCorpus(t, harness(githubStyle))
}
