package providertest

import (
	"bufio"
	"encoding/json"
	"errors"
	"net/http"
	"net/url"
	"reflect"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/paystream/paystream/internal/provider"
)

// Request builds a request from the textual form the fuzz targets use:
// header is "Name: value" lines, and a line starting with '?' is the raw
// query string; now is unix seconds.
func Request(header string, body []byte, now int64) *provider.Request {
	r := &provider.Request{Header: http.Header{}, Query: url.Values{}, Body: body, Now: time.Unix(now, 0)}
	sc := bufio.NewScanner(strings.NewReader(header))
	sc.Buffer(make([]byte, 0, 64*1024), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if strings.HasPrefix(line, "?") {
			if q, err := url.ParseQuery(line[1:]); err == nil {
				r.Query = q
			}
			continue
		}
		if k, v, ok := strings.Cut(line, ":"); ok {
			r.Header.Add(strings.TrimSpace(k), strings.TrimSpace(v))
		}
	}
	return r
}

// Encode is the inverse of Request for the header and query: the textual
// form a seed corpus entry uses.
func Encode(r *provider.Request) string {
	var b strings.Builder
	keys := make([]string, 0, len(r.Header))
	for k := range r.Header {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		for _, v := range r.Header[k] {
			b.WriteString(k + ": " + v + "\n")
		}
	}
	if len(r.Query) > 0 {
		b.WriteString("?" + r.Query.Encode() + "\n")
	}
	return b.String()
}

// AddSeeds adds every fixture of h, signed with h.OldSecret, to f's seed
// corpus in the (header, body, now) form of FuzzVerify and the (header,
// body) form of FuzzParse, depending on parse.
func AddSeeds(f *testing.F, h Harness, parse bool) {
	for _, fx := range h.Fixtures {
		r := h.signed(f, fx)
		if parse {
			f.Add(Encode(r), fx.Body)
		} else {
			f.Add(Encode(r), fx.Body, Now.Unix())
		}
	}
}

// FuzzVerify checks the properties every verifier has on arbitrary input:
// it never panics, a rejection is a *provider.VerifyError, and verification
// is deterministic. When genuine is not nil, every accepted request must
// also satisfy it: an oracle, written independently of the driver, for
// "this request was signed with a configured secret". Call it from a
// driver's FuzzVerify after adding seeds.
func FuzzVerify(f *testing.F, d provider.Driver, genuine func(r *provider.Request) bool) {
	f.Fuzz(func(t *testing.T, header string, body []byte, now int64) {
		r := Request(header, body, now)
		err := d.Verify(r)
		if err != nil {
			var ve *provider.VerifyError
			if !errors.As(err, &ve) {
				t.Fatalf("Verify error is not a *provider.VerifyError: %v", err)
			}
			return
		}
		if err := d.Verify(Request(header, body, now)); err != nil {
			t.Fatalf("Verify accepted once, then rejected: %v", err)
		}
		if genuine != nil && !genuine(r) {
			t.Fatalf("Verify accepted a request the oracle says is forged: %q", header)
		}
	})
}

// FuzzParse checks the properties every parser has on arbitrary input: it
// never panics, a rejection wraps provider.ErrUnprocessable and produces no
// event, an accepted event has a payment id, dedup key and non-negative
// amount, re-parsing gives the same event, and the event survives a JSON
// round trip unchanged.
func FuzzParse(f *testing.F, d provider.Driver) {
	f.Fuzz(func(t *testing.T, header string, body []byte) {
		r := Request(header, body, Now.Unix())
		ev, err := d.Parse(r)
		if err != nil {
			if !errors.Is(err, provider.ErrUnprocessable) {
				t.Fatalf("Parse error does not wrap ErrUnprocessable: %v", err)
			}
			if !reflect.DeepEqual(ev, provider.Event{}) {
				t.Fatalf("rejected parse returned an event: %+v", ev)
			}
			return
		}
		if ev.PaymentID == "" || ev.DedupKey == "" || ev.Type == "" {
			t.Fatalf("accepted event lacks payment id, dedup key or type: %+v", ev)
		}
		if ev.Fact.AmountMinor < 0 {
			t.Fatalf("negative amount accepted: %+v", ev)
		}
		again, err := d.Parse(Request(header, body, Now.Unix()))
		if err != nil || !reflect.DeepEqual(again, ev) {
			t.Fatalf("re-parse differs: %+v, %v; first %+v", again, err, ev)
		}
		b, err := json.Marshal(ev)
		if err != nil {
			t.Fatal(err)
		}
		var back provider.Event
		if err := json.Unmarshal(b, &back); err != nil || !reflect.DeepEqual(back, ev) {
			t.Fatalf("JSON round trip: %+v, %v; want %+v", back, err, ev)
		}
	})
}
