package loadgen

import (
	"bytes"
	"errors"
	"net/http"
	"net/http/httptest"
	"net/url"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/paystream/paystream/internal/payment"
	"github.com/paystream/paystream/internal/provider"
	"github.com/paystream/paystream/internal/provider/drivers"
)

func testSources(t *testing.T) []Source {
	t.Helper()
	srcs, err := ParseSources([]byte(TestSourcesYAML))
	if err != nil {
		t.Fatal(err)
	}
	return srcs
}

// driverFor builds the real driver of src, as ingest would.
func driverFor(t *testing.T, src Source) provider.Driver {
	t.Helper()
	d, err := drivers.Factories()[src.Driver](provider.Config{Secrets: src.Secrets, Options: src.Options})
	if err != nil {
		t.Fatal(err)
	}
	return d
}

// asReceived turns r into what ingest's handler gives the driver: the
// header and query as parsed from an HTTP request on the wire.
func asReceived(t *testing.T, r *Request, now time.Time) *provider.Request {
	t.Helper()
	hreq, err := r.HTTPRequest(t.Context(), "http://ingest.invalid")
	if err != nil {
		t.Fatal(err)
	}
	if got, want := hreq.URL.Path, "/webhooks/"+r.Source; got != want {
		t.Fatalf("path = %q, want %q", got, want)
	}
	// Round-trip the header through the wire format.
	var buf bytes.Buffer
	if err := hreq.Header.Write(&buf); err != nil {
		t.Fatal(err)
	}
	wire := httptest.NewRequest(http.MethodPost, hreq.URL.String(), nil)
	wire.Header = http.Header{}
	for line := range strings.SplitSeq(strings.TrimSpace(buf.String()), "\r\n") {
		k, v, _ := strings.Cut(line, ": ")
		wire.Header.Add(k, v)
	}
	return &provider.Request{Header: wire.Header, Query: wire.URL.Query(), Body: r.Body, Now: now}
}

// wantStatuses are the normalized statuses of steps 0, 1, 2 and 3 per
// driver ("" where the gateway's event says nothing but "look it up").
var wantStatuses = map[string][]payment.Status{
	"standardwebhooks": {payment.StatusPending, payment.StatusPaid, payment.StatusPartiallyRefunded, payment.StatusPartiallyRefunded},
	"hmac":             {payment.StatusPending, payment.StatusPaid, payment.StatusPartiallyRefunded, payment.StatusPartiallyRefunded},
	"stripe":           {payment.StatusPending, payment.StatusPaid, payment.StatusPartiallyRefunded, payment.StatusPartiallyRefunded},
	"pagarme":          {payment.StatusPending, payment.StatusPaid, payment.StatusPartiallyRefunded, payment.StatusPartiallyRefunded},
	"asaas":            {payment.StatusPending, payment.StatusPaid, payment.StatusPaid, payment.StatusPaid},
	"pagbank":          {payment.StatusPending, payment.StatusPaid, payment.StatusPartiallyRefunded, payment.StatusPartiallyRefunded},
	"mercadopago":      {payment.StatusPending, "", "", ""},
	"zoop":             {payment.StatusPending, payment.StatusPaid, "", ""},
}

// TestBuildVerifiesAndParses: for every supported driver, each step of a
// payment's life builds a request the real driver verifies and parses into
// the expected payment and status; distinct events have distinct dedup keys;
// a re-sent event has the same body and dedup key and verifies again.
func TestBuildVerifiesAndParses(t *testing.T) {
	t.Parallel()
	srcs := testSources(t)
	covered := map[string]bool{}
	for _, src := range srcs {
		covered[src.Driver] = true
		t.Run(src.Name+"/"+src.Driver, func(t *testing.T) {
			t.Parallel()
			d := driverFor(t, src)
			b, err := NewBuilder(src, "t1x", 42)
			if err != nil {
				t.Fatal(err)
			}
			now := time.Now()
			seen := map[string]bool{}
			for step := range 4 {
				ev := Event{Seq: uint64(100 + step), Payment: 7, Step: step, OccurredAt: now.Add(time.Duration(step) * time.Second).Truncate(time.Millisecond)}
				req, err := b.Build(ev, now)
				if err != nil {
					t.Fatalf("step %d: Build: %v", step, err)
				}
				pr := asReceived(t, req, now)
				if err := d.Verify(pr); err != nil {
					t.Fatalf("step %d: Verify: %v", step, err)
				}
				got, err := d.Parse(pr)
				if err != nil {
					t.Fatalf("step %d: Parse: %v\nbody: %s", step, err, req.Body)
				}
				if want := b.PaymentID(7); got.PaymentID != want {
					t.Errorf("step %d: PaymentID = %q, want %q", step, got.PaymentID, want)
				}
				if want := wantStatuses[src.Driver][step]; got.Fact.Status != want {
					t.Errorf("step %d: status = %q, want %q", step, got.Fact.Status, want)
				}
				if seen[got.DedupKey] {
					t.Errorf("step %d: dedup key %q repeats an earlier step's", step, got.DedupKey)
				}
				seen[got.DedupKey] = true

				// A retry a minute later: same body and dedup key, valid
				// signature at its own time.
				later := now.Add(time.Minute)
				again, err := b.Build(ev, later)
				if err != nil {
					t.Fatal(err)
				}
				if !bytes.Equal(again.Body, req.Body) {
					t.Errorf("step %d: re-sent body differs:\n%s\n%s", step, req.Body, again.Body)
				}
				pr2 := asReceived(t, again, later)
				if err := d.Verify(pr2); err != nil {
					t.Fatalf("step %d: Verify re-sent: %v", step, err)
				}
				got2, err := d.Parse(pr2)
				if err != nil {
					t.Fatal(err)
				}
				if got2.DedupKey != got.DedupKey {
					t.Errorf("step %d: re-sent dedup key %q, first %q", step, got2.DedupKey, got.DedupKey)
				}
			}
		})
	}
	for _, d := range Drivers {
		if !covered[d] {
			t.Errorf("driver %s is supported but not tested", d)
		}
	}
}

// TestBuildIsRejectedWithAnotherSecret: what verifies is the configured
// secret's signature, not something any request would carry.
func TestBuildIsRejectedWithAnotherSecret(t *testing.T) {
	t.Parallel()
	for _, src := range testSources(t) {
		t.Run(src.Name, func(t *testing.T) {
			t.Parallel()
			d := driverFor(t, src)
			wrong := src
			wrong.Secrets = []string{"whsec_d3JvbmctYnV0LXZhbGlkLWJhc2U2NA=="} // valid for every driver
			b, err := NewBuilder(wrong, "t2x", 1)
			if err != nil {
				t.Fatal(err)
			}
			now := time.Now()
			req, err := b.Build(Event{Seq: 1, Payment: 1, Step: 1, OccurredAt: now}, now)
			if err != nil {
				t.Fatal(err)
			}
			err = d.Verify(asReceived(t, req, now))
			var ve *provider.VerifyError
			if !errors.As(err, &ve) || ve.Reason != provider.ReasonBadSignature {
				t.Fatalf("Verify with another secret = %v, want %s", err, provider.ReasonBadSignature)
			}
		})
	}
}

func TestNewBuilderErrors(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name string
		src  Source
		want string
	}{
		{"no secret", Source{Name: "a", Driver: "stripe"}, "no secret"},
		{"public key only", Source{Name: "a", Driver: "standardwebhooks", Secrets: []string{"whpk_11qYAYKxCrfVS/7TyWQHOg7hcvPapiMlrwIaaPcHURo="}}, "cannot sign"},
		{"hmac without header", Source{Name: "a", Driver: "hmac", Secrets: []string{"s"}}, "header"},
		{"hmac bad encoding", Source{Name: "a", Driver: "hmac", Secrets: []string{"s"}, Options: map[string]string{"header": "X-Sig", "encoding": "base32"}}, "base32"},
		{"unknown driver", Source{Name: "a", Driver: "paypal", Secrets: []string{"s"}}, "not supported"},
	}
	for _, tc := range cases {
		_, err := NewBuilder(tc.src, "r", 1)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: NewBuilder = %v, want an error containing %q", tc.name, err, tc.want)
		}
		if err != nil && slices.ContainsFunc(tc.src.Secrets, func(s string) bool { return len(s) > 1 && strings.Contains(err.Error(), s) }) {
			t.Errorf("%s: error %q contains a secret", tc.name, err)
		}
	}
}

func TestParseSourcesKeepsOrderAndOptions(t *testing.T) {
	t.Parallel()
	srcs := testSources(t)
	var names []string
	for _, s := range srcs {
		names = append(names, s.Name)
	}
	if want := []string{"sw", "st", "hm", "hm64", "pm", "as", "pb", "mp", "zp", "zpq"}; !slices.Equal(names, want) {
		t.Errorf("names = %v, want %v (file order)", names, want)
	}
	if got := srcs[2].Options["id_header"]; got != "X-GitHub-Delivery" {
		t.Errorf("hm options id_header = %q", got)
	}
	if _, err := ParseSources([]byte("sources:\n  - name: x\n    driver: nope\n    secrets: [a]\n")); err == nil {
		t.Error("ParseSources accepted an unknown driver")
	}
}

func TestHTTPRequestURL(t *testing.T) {
	t.Parallel()
	r := &Request{Source: "mp", RawQuery: url.Values{"data.id": {"123"}}.Encode(), Header: http.Header{}, Body: []byte("{}")}
	hreq, err := r.HTTPRequest(t.Context(), "http://127.0.0.1:8080/")
	if err != nil {
		t.Fatal(err)
	}
	if got, want := hreq.URL.String(), "http://127.0.0.1:8080/webhooks/mp?data.id=123"; got != want {
		t.Errorf("URL = %q, want %q", got, want)
	}
	if hreq.Method != http.MethodPost {
		t.Errorf("method = %s", hreq.Method)
	}
}
