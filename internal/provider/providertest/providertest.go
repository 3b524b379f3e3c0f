// Package providertest is the conformance suite every provider driver must
// pass, plus the fuzz properties every driver's FuzzVerify and FuzzParse
// targets share. A driver's _test.go describes itself with a Harness and
// calls Conformance (or Run); its fuzz targets call the Harness's
// FuzzVerify and FuzzParse.
package providertest

import (
	"errors"
	"net/http"
	"net/url"
	"reflect"
	"slices"
	"testing"
	"time"

	"github.com/paystream/paystream/internal/provider"
)

// Harness describes one driver to the suite.
type Harness struct {
	// New builds the driver under test.
	New provider.Factory
	// Config is the base configuration. The suite sets Secrets itself.
	Config provider.Config
	// OldSecret and NewSecret are two valid secrets, configured together to
	// test rotation: a request signed with either must verify.
	OldSecret, NewSecret string
	// WrongSecret is a well-formed secret that is not configured.
	WrongSecret string
	// Sign returns a request carrying body, authenticated with secret as the
	// gateway would at time ts (Now is set to ts).
	Sign func(t testing.TB, secret string, body []byte, ts time.Time) *provider.Request
	// Tolerance is the allowed clock skew of a timestamped scheme; zero when
	// the scheme carries no time. The suite checks both directions.
	Tolerance time.Duration
	// RequiredHeaders are removed one at a time: each removal must be
	// rejected with provider.ReasonMissingHeader.
	RequiredHeaders []string
	// Tampers change a signed request in ways that must be rejected, beyond
	// the body tampering the suite always tries (unless BodyUnsigned).
	Tampers map[string]func(r *provider.Request)
	// BodyUnsigned is true for schemes that do not cover the body (Asaas'
	// static token, Mercado Pago's manifest): the suite then skips body
	// tampering.
	BodyUnsigned bool
	// RefetchAll is true for drivers whose every event must be refetched
	// before money moves (Mercado Pago): the suite then requires
	// NeedsRefetch on every parsed fixture.
	RefetchAll bool
	// TrustedHeaders are headers the signature does not cover that the
	// driver's Config tells it to take the dedup key from (the hmac
	// driver's dedup_on_id_header). Any other header the signature does
	// not cover must leave the dedup key as it is: see "unsigned headers
	// leave the dedup key".
	TrustedHeaders []string
	// Documented, when not nil, computes the value Sign must put in the
	// first of RequiredHeaders, independently of the driver: with the
	// standard library alone, the way the gateway documents its scheme.
	// The suite checks Sign against it on every fixture's body, and that
	// the driver verifies what Sign made.
	Documented func(secret string, body []byte, ts time.Time) string
	// SignBody is the body Sign is called with for the verification tests.
	// Defaults to the first fixture's body.
	SignBody []byte
	// Fixtures are realistic gateway payloads and what they normalize to.
	Fixtures []Fixture
}

// Fixture is one payload and the Event it must normalize to.
type Fixture struct {
	Name string
	Body []byte
	// Query and Header are added to the request Parse sees (for gateways
	// that put ids in the query string or headers).
	Query  url.Values
	Header http.Header
	// Want is the expected Event; nil means Parse must fail with
	// provider.ErrUnprocessable.
	Want *provider.Event
	// Irrelevant means Parse must fail with provider.ErrIrrelevant.
	Irrelevant bool
}

// Now is the fixed time the suite signs and verifies at.
var Now = time.Date(2024, 6, 12, 19, 45, 3, 0, time.UTC)

// Driver builds the driver under test from h.Config with secrets, failing
// t when New refuses them.
func (h Harness) Driver(t testing.TB, secrets ...string) provider.Driver {
	t.Helper()
	cfg := h.Config
	cfg.Secrets = secrets
	d, err := h.New(cfg)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	return d
}

func (h Harness) body() []byte {
	if h.SignBody != nil {
		return h.SignBody
	}
	if len(h.Fixtures) > 0 {
		return h.Fixtures[0].Body
	}
	return []byte(`{}`)
}

// signed is fx's request as the gateway sends it: fx.Body signed with
// OldSecret at Now, with fx's query and headers added.
func (h Harness) signed(t testing.TB, fx Fixture) *provider.Request {
	r := h.Sign(t, h.OldSecret, fx.Body, Now)
	for k, v := range fx.Query {
		if r.Query == nil {
			r.Query = url.Values{}
		}
		r.Query[k] = v
	}
	for k, v := range fx.Header {
		r.Header[k] = v
	}
	return r
}

// eachFixture runs check on every fixture, as its own subtest, with a
// driver configured with OldSecret; a harness without fixtures fails t.
func (h Harness) eachFixture(t *testing.T, check func(t *testing.T, d provider.Driver, fx Fixture)) {
	t.Helper()
	if len(h.Fixtures) == 0 {
		t.Fatal("harness has no fixtures")
	}
	d := h.Driver(t, h.OldSecret)
	for _, fx := range h.Fixtures {
		t.Run(fx.Name, func(t *testing.T) { check(t, d, fx) })
	}
}

func wantReason(t *testing.T, err error, reasons ...string) {
	t.Helper()
	var ve *provider.VerifyError
	if !errors.As(err, &ve) {
		t.Fatalf("Verify = %v, want a *provider.VerifyError", err)
	}
	for _, r := range reasons {
		if ve.Reason == r {
			return
		}
	}
	t.Fatalf("Verify reason = %q (%v), want one of %v", ve.Reason, err, reasons)
}

// Run runs the conformance suite against h.
func Run(t *testing.T, h Harness) {
	t.Helper()
	t.Run("New rejects missing secrets", func(t *testing.T) {
		t.Parallel()
		cfg := h.Config
		cfg.Secrets = nil
		if _, err := h.New(cfg); err == nil {
			t.Fatal("New accepted a config without secrets")
		}
	})
	t.Run("valid signature accepted", func(t *testing.T) {
		t.Parallel()
		d := h.Driver(t, h.OldSecret)
		if err := d.Verify(h.Sign(t, h.OldSecret, h.body(), Now)); err != nil {
			t.Fatalf("Verify: %v", err)
		}
	})
	t.Run("rotation accepts old and new", func(t *testing.T) {
		t.Parallel()
		d := h.Driver(t, h.OldSecret, h.NewSecret)
		for _, s := range []string{h.OldSecret, h.NewSecret} {
			if err := d.Verify(h.Sign(t, s, h.body(), Now)); err != nil {
				t.Fatalf("Verify with one of two configured secrets: %v", err)
			}
		}
		d = h.Driver(t, h.NewSecret)
		wantReason(t, d.Verify(h.Sign(t, h.OldSecret, h.body(), Now)), provider.ReasonBadSignature)
	})
	t.Run("wrong secret rejected", func(t *testing.T) {
		t.Parallel()
		d := h.Driver(t, h.OldSecret, h.NewSecret)
		wantReason(t, d.Verify(h.Sign(t, h.WrongSecret, h.body(), Now)), provider.ReasonBadSignature)
	})
	t.Run("tampering rejected", func(t *testing.T) {
		t.Parallel()
		d := h.Driver(t, h.OldSecret)
		tampers := map[string]func(*provider.Request){}
		for k, v := range h.Tampers {
			tampers[k] = v
		}
		if !h.BodyUnsigned {
			tampers["body appended"] = func(r *provider.Request) { r.Body = append(append([]byte{}, r.Body...), ' ') }
			tampers["body byte flipped"] = func(r *provider.Request) {
				b := append([]byte{}, r.Body...)
				b[len(b)/2] ^= 0x01
				r.Body = b
			}
			tampers["body emptied"] = func(r *provider.Request) { r.Body = nil }
		}
		if len(tampers) == 0 {
			t.Fatal("harness declares nothing to tamper with")
		}
		for name, tamper := range tampers {
			r := h.Sign(t, h.OldSecret, h.body(), Now)
			tamper(r)
			err := d.Verify(r)
			if err == nil {
				t.Errorf("tampered %s: accepted", name)
				continue
			}
			var ve *provider.VerifyError
			if !errors.As(err, &ve) {
				t.Errorf("tampered %s: Verify = %v, want *provider.VerifyError", name, err)
			}
		}
	})
	t.Run("missing headers rejected", func(t *testing.T) {
		t.Parallel()
		if len(h.RequiredHeaders) == 0 {
			t.Fatal("harness declares no required headers")
		}
		d := h.Driver(t, h.OldSecret)
		for _, name := range h.RequiredHeaders {
			r := h.Sign(t, h.OldSecret, h.body(), Now)
			if r.Header.Get(name) == "" {
				t.Fatalf("signed request lacks required header %s", name)
			}
			r.Header.Del(name)
			wantReason(t, d.Verify(r), provider.ReasonMissingHeader)
		}
	})
	t.Run("documented signature", func(t *testing.T) {
		t.Parallel()
		switch {
		case h.Documented == nil:
			t.Skip("harness has no independent signature")
		case len(h.RequiredHeaders) == 0:
			t.Fatal("harness declares no required headers")
		}
		h.eachFixture(t, func(t *testing.T, d provider.Driver, fx Fixture) {
			r := h.Sign(t, h.OldSecret, fx.Body, Now)
			if got, want := r.Header.Get(h.RequiredHeaders[0]), h.Documented(h.OldSecret, fx.Body, Now); got != want {
				t.Fatalf("Sign = %q, the documented scheme gives %q", got, want)
			}
			if err := d.Verify(r); err != nil {
				t.Fatalf("Verify: %v", err)
			}
		})
	})
	t.Run("tolerance", func(t *testing.T) {
		t.Parallel()
		if h.Tolerance == 0 {
			t.Skip("scheme carries no timestamp")
		}
		d := h.Driver(t, h.OldSecret)
		for _, skew := range []time.Duration{h.Tolerance - time.Second, -(h.Tolerance - time.Second)} {
			r := h.Sign(t, h.OldSecret, h.body(), Now)
			r.Now = Now.Add(skew)
			if err := d.Verify(r); err != nil {
				t.Errorf("skew %v within tolerance %v: %v", skew, h.Tolerance, err)
			}
		}
		for _, skew := range []time.Duration{h.Tolerance + time.Second, -(h.Tolerance + time.Second), 24 * time.Hour, -24 * time.Hour} {
			r := h.Sign(t, h.OldSecret, h.body(), Now)
			r.Now = Now.Add(skew)
			wantReason(t, d.Verify(r), provider.ReasonTimestamp)
		}
	})
	t.Run("fixtures", func(t *testing.T) {
		t.Parallel()
		h.eachFixture(t, func(t *testing.T, d provider.Driver, fx Fixture) {
			r := h.signed(t, fx)
			ev, err := d.Parse(r)
			switch {
			case fx.Irrelevant:
				if !errors.Is(err, provider.ErrIrrelevant) {
					t.Fatalf("Parse = %+v, %v; want ErrIrrelevant", ev, err)
				}
				return
			case fx.Want == nil:
				if !errors.Is(err, provider.ErrUnprocessable) || errors.Is(err, provider.ErrIrrelevant) {
					t.Fatalf("Parse = %+v, %v; want ErrUnprocessable", ev, err)
				}
				return
			case err != nil:
				t.Fatalf("Parse: %v", err)
			}
			if !reflect.DeepEqual(ev, *fx.Want) {
				t.Fatalf("Parse =\n  %+v\nwant\n  %+v", ev, *fx.Want)
			}
			if h.RefetchAll && !ev.NeedsRefetch {
				t.Fatal("unsigned body parsed without NeedsRefetch")
			}
			if ev.DedupKey == "" || ev.PaymentID == "" || ev.Type == "" {
				t.Fatalf("event lacks dedup key, payment id or type: %+v", ev)
			}
		})
	})
	t.Run("unsigned headers leave the dedup key", func(t *testing.T) {
		t.Parallel()
		unsignedHeadersKeepDedupKey(t, h)
	})
	t.Run("account scopes dedup key", func(t *testing.T) {
		t.Parallel()
		var fx *Fixture
		for i := range h.Fixtures {
			if h.Fixtures[i].Want != nil {
				fx = &h.Fixtures[i]
				break
			}
		}
		if fx == nil {
			t.Fatal("harness has no accepted fixture")
		}
		cfg := h.Config
		cfg.Secrets = []string{h.OldSecret}
		cfg.Account = "acct-7"
		d, err := h.New(cfg)
		if err != nil {
			t.Fatal(err)
		}
		r := h.signed(t, *fx)
		ev, err := d.Parse(r)
		if err != nil {
			t.Fatal(err)
		}
		if want := "acct-7:" + fx.Want.DedupKey; ev.DedupKey != want {
			t.Fatalf("DedupKey = %q, want %q", ev.DedupKey, want)
		}
	})
}

// Accept verifies r with d and parses it, as ingest does with a delivery,
// failing t unless both succeed.
func Accept(t testing.TB, d provider.Driver, r *provider.Request) provider.Event {
	t.Helper()
	if err := d.Verify(r); err != nil {
		t.Fatalf("Verify: %v", err)
	}
	ev, err := d.Parse(r)
	if err != nil {
		t.Fatalf("Parse: %v", err)
	}
	return ev
}

// unsignedHeadersKeepDedupKey checks, for every accepted fixture whose
// signed request verifies, that no header the signature does not cover
// decides the dedup key: each header is changed in turn, and a change
// that still verifies (the header is not signed) must parse to the same
// dedup key, or fail to parse. Otherwise anyone holding one captured
// delivery could replay its signed body past dedup with a fresh value,
// once per value. Headers in h.TrustedHeaders are exempt: the source's
// config chose to trust them.
func unsignedHeadersKeepDedupKey(t *testing.T, h Harness) {
	d := h.Driver(t, h.OldSecret)
	checked := 0
	for _, fx := range h.Fixtures {
		if fx.Want == nil {
			continue
		}
		request := func() *provider.Request { return h.signed(t, fx) }
		r := request()
		if d.Verify(r) != nil {
			continue // the fixture's own headers replace signed ones: nothing to compare against
		}
		ev, err := d.Parse(r)
		if err != nil {
			t.Fatalf("fixture %s: Parse: %v", fx.Name, err)
		}
		for name := range r.Header {
			if slices.ContainsFunc(h.TrustedHeaders, func(s string) bool { return http.CanonicalHeaderKey(s) == name }) {
				continue
			}
			changed := request()
			changed.Header.Set(name, changed.Header.Get(name)+"-replayed")
			if d.Verify(changed) != nil {
				continue // covered by the signature
			}
			checked++
			got, err := d.Parse(changed)
			if err == nil && got.DedupKey != ev.DedupKey {
				t.Errorf("fixture %s: changing the unsigned header %s changed the dedup key from %q to %q: a replayed body gets past dedup",
					fx.Name, name, ev.DedupKey, got.DedupKey)
			}
		}
	}
	t.Logf("%d unsigned header values changed", checked)
}
