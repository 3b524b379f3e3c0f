package providertest

import (
	"net/http"
	"testing"
	"time"

	"github.com/paystream/paystream/internal/provider"
)

// Conformance is a driver's TestConformance, run in parallel with the
// package's other tests: Run, and SeedCorpus as the subtest "SeedCorpus".
// A driver tested under several configurations calls Run for each and
// SeedCorpus once instead.
func Conformance(t *testing.T, h Harness) {
	t.Helper()
	t.Parallel()
	Run(t, h)
	t.Run("SeedCorpus", func(t *testing.T) {
		t.Parallel()
		SeedCorpus(t, h)
	})
}

// FuzzVerify is a driver's FuzzVerify target: h's fixtures signed with
// OldSecret as seeds, a driver configured (h.Config) with OldSecret and
// NewSecret, and the properties of the package's FuzzVerify. signedBy,
// when not nil, is the oracle, written independently of the driver: it
// reports whether r carries a valid signature (or token) made with
// secret, and every accepted request must be signed by one of the two.
func (h Harness) FuzzVerify(f *testing.F, signedBy func(r *provider.Request, secret string) bool) {
	AddSeeds(f, h, false)
	d := h.Driver(f, h.OldSecret, h.NewSecret)
	var genuine func(*provider.Request) bool
	if signedBy != nil {
		genuine = func(r *provider.Request) bool { return signedBy(r, h.OldSecret) || signedBy(r, h.NewSecret) }
	}
	FuzzVerify(f, d, genuine)
}

// FuzzParse is a driver's FuzzParse target: h's fixtures as seeds, a
// driver configured (h.Config) with OldSecret, and the properties of the
// package's FuzzParse.
func (h Harness) FuzzParse(f *testing.F) {
	AddSeeds(f, h, true)
	FuzzParse(f, h.Driver(f, h.OldSecret))
}

// HeaderHarness is the Harness of a driver whose scheme puts one value,
// computed from the secret and the body alone, in one header: New, Sign
// (SignHeader) and that header as the one RequiredHeaders. The caller
// sets the secrets, fixtures and anything else its scheme needs.
func HeaderHarness(newDriver provider.Factory, header string, sign func(secret string, body []byte) string) Harness {
	return Harness{New: newDriver, Sign: SignHeader(header, sign), RequiredHeaders: []string{header}}
}

// HeaderHarnessAt is HeaderHarness for schemes whose one header also
// covers the time of signing (SignHeaderAt); the caller sets Tolerance.
func HeaderHarnessAt(newDriver provider.Factory, header string, sign func(secret string, body []byte, ts time.Time) string) Harness {
	return Harness{New: newDriver, Sign: SignHeaderAt(header, sign), RequiredHeaders: []string{header}}
}

// SignHeader is a Harness.Sign for schemes that put one value, computed
// from the secret and the body alone, in one header.
func SignHeader(header string, sign func(secret string, body []byte) string) func(t testing.TB, secret string, body []byte, ts time.Time) *provider.Request {
	return SignHeaderAt(header, func(secret string, body []byte, _ time.Time) string { return sign(secret, body) })
}

// SignHeaderAt is SignHeader for schemes whose one header also covers the
// time of signing, ts (Stripe's).
func SignHeaderAt(header string, sign func(secret string, body []byte, ts time.Time) string) func(t testing.TB, secret string, body []byte, ts time.Time) *provider.Request {
	return func(_ testing.TB, secret string, body []byte, ts time.Time) *provider.Request {
		r := &provider.Request{Header: http.Header{}, Body: body, Now: ts}
		r.Header.Set(header, sign(secret, body, ts))
		return r
	}
}
