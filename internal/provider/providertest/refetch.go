package providertest

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"math/rand/v2"
	"net/http"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/paystream/paystream/internal/payment"
	"github.com/paystream/paystream/internal/provider"
)

// RefetchCase is one answer of a gateway's API and what ParseRefetch must
// make of it.
type RefetchCase struct {
	Name string
	Body string
	// Want are the facts in order; nil: the answer is unprocessable.
	Want []payment.Fact
	// Final is the status the facts leave a new payment in ("": any).
	Final payment.Status
}

// RefetchSuite is the conformance suite of a provider.Refetcher, beside
// Harness's of the Driver: every refetching driver's tests describe
// themselves with one and call Run, and their fuzz target calls Fuzz.
type RefetchSuite struct {
	// Driver is the refetcher under test.
	Driver provider.Refetcher
	// Cases are its answers, usable and unusable (at least 5 usable).
	Cases []RefetchCase
	// IDOf is the id of the payment an answer is about, for a driver that
	// is a provider.RefetchChecker ("" when it names none).
	IDOf func(body []byte) string
	// OtherIDs are ids of other payments than id, which ParseRefetchFor
	// must refuse for an answer about id ("" is always refused too).
	OtherIDs func(id string) []string
	// Request describes RefetchRequest's checks.
	Request RefetchRequestCase
	// AlwaysRefetch is true for a driver that must refetch every event
	// whatever the source's refetch setting (its webhooks are unsigned or
	// thin): it reports so with an AlwaysRefetch method, which the sources
	// loader looks for.
	AlwaysRefetch bool
}

// RefetchRequestCase describes a driver's RefetchRequest to the suite.
type RefetchRequestCase struct {
	// Token and ID are a usable credential and payment id.
	Token, ID string
	// URLs maps base URLs to the URL requested for ID.
	URLs map[string]string
	// Auth is the Authorization header the request must carry.
	Auth string
	// BadIDs and BadTokens are ids and credentials the driver must
	// refuse, beyond the suite's own (empty, "..", NUL, spaces, newlines).
	BadIDs, BadTokens []string
}

// Run runs the suite: AlwaysRefetch, RefetchRequest, ParseRefetch on every case
// (facts that converge in any order), and ParseRefetchFor when the driver
// is a RefetchChecker.
func (s RefetchSuite) Run(t *testing.T) {
	t.Run("AlwaysRefetch", func(t *testing.T) {
		a, ok := s.Driver.(interface{ AlwaysRefetch() bool })
		if got := ok && a.AlwaysRefetch(); got != s.AlwaysRefetch {
			t.Fatalf("AlwaysRefetch = %v, want %v", got, s.AlwaysRefetch)
		}
	})
	t.Run("RefetchRequest", s.testRequest)
	t.Run("ParseRefetch", s.testParse)
	if _, ok := s.Driver.(provider.RefetchChecker); ok && s.IDOf != nil {
		t.Run("ParseRefetchFor", s.testParseFor)
	}
}

func (s RefetchSuite) testRequest(t *testing.T) {
	t.Parallel()
	rc, ctx := s.Request, context.Background()
	if len(rc.URLs) == 0 {
		t.Fatal("no base URLs to request")
	}
	for base, want := range rc.URLs {
		req, err := s.Driver.RefetchRequest(ctx, base, rc.Token, rc.ID)
		if err != nil {
			t.Fatalf("RefetchRequest(%q): %v", base, err)
		}
		if req.Method != http.MethodGet || req.URL.String() != want {
			t.Errorf("RefetchRequest(%q) = %s %s, want GET %s", base, req.Method, req.URL, want)
		}
		if got := req.Header.Get("Authorization"); got != rc.Auth {
			t.Errorf("Authorization = %q, want %q", got, rc.Auth)
		}
		if got := req.Header.Get("Accept"); got != "application/json" {
			t.Errorf("Accept = %q", got)
		}
		if req.Context() != ctx {
			t.Error("request does not carry the context")
		}
	}
	type bad struct{ base, token, id string }
	cases := map[string]bad{
		"empty token":         {"https://example.com", "", rc.ID},
		"token with newline":  {"https://example.com", "tok\r\nX-Evil: 1", rc.ID},
		"token with space":    {"https://example.com", "tok en", rc.ID},
		"empty id":            {"https://example.com", rc.Token, ""},
		"dot-dot id":          {"https://example.com", rc.Token, ".."},
		"id with NUL":         {"https://example.com", rc.Token, "1\x00"},
		"ftp base":            {"ftp://example.com", rc.Token, rc.ID},
		"relative base":       {"/v1", rc.Token, rc.ID},
		"base with user info": {"https://user:pass@example.com", rc.Token, rc.ID},
		"base with query":     {"https://example.com/?x=1", rc.Token, rc.ID},
		"base with fragment":  {"https://example.com/#x", rc.Token, rc.ID},
		"unparsable base":     {"http://[::1", rc.Token, rc.ID},
	}
	for _, id := range rc.BadIDs {
		cases["id "+id] = bad{"https://example.com", rc.Token, id}
	}
	for _, tok := range rc.BadTokens {
		cases["token "+tok] = bad{"https://example.com", tok, rc.ID}
	}
	for name, tc := range cases {
		if req, err := s.Driver.RefetchRequest(ctx, tc.base, tc.token, tc.id); err == nil {
			t.Errorf("%s: RefetchRequest = %s, want an error", name, req.URL)
		} else if strings.Contains(err.Error(), rc.Token) || (tc.token != "" && strings.Contains(err.Error(), tc.token)) {
			t.Errorf("%s: error %q reveals the token", name, err)
		} else if strings.Contains(err.Error(), "pass") {
			t.Errorf("%s: error %q reveals the base URL's password", name, err)
		}
	}
}

func (s RefetchSuite) testParse(t *testing.T) {
	t.Parallel()
	usable := 0
	for _, tc := range s.Cases {
		if tc.Want != nil {
			usable++
		}
		t.Run(tc.Name, func(t *testing.T) {
			t.Parallel()
			got, err := s.Driver.ParseRefetch([]byte(tc.Body))
			if tc.Want == nil {
				if !errors.Is(err, provider.ErrUnprocessable) || got != nil {
					t.Fatalf("ParseRefetch = %+v, %v; want ErrUnprocessable", got, err)
				}
				return
			}
			if err != nil {
				t.Fatalf("ParseRefetch: %v", err)
			}
			if !reflect.DeepEqual(got, tc.Want) {
				t.Fatalf("ParseRefetch =\n%s\nwant\n%s", DumpFacts(got), DumpFacts(tc.Want))
			}
			CheckConverges(t, got, tc.Final)
		})
	}
	if usable < 5 {
		t.Errorf("only %d usable answers", usable)
	}
}

// testParseFor: for the answer to the request for its own payment,
// ParseRefetchFor gives exactly what ParseRefetch gives; an answer about
// another payment (a lying API, a misrouting proxy) is unprocessable and
// gives no facts, as are unusable answers whatever the id.
func (s RefetchSuite) testParseFor(t *testing.T) {
	t.Parallel()
	c := s.Driver.(provider.RefetchChecker)
	for _, tc := range s.Cases {
		body := []byte(tc.Body)
		if tc.Want == nil {
			if got, err := c.ParseRefetchFor(s.Request.ID, body); !errors.Is(err, provider.ErrUnprocessable) || got != nil {
				t.Errorf("%s: ParseRefetchFor = %+v, %v; want ErrUnprocessable", tc.Name, got, err)
			}
			continue
		}
		id := s.IDOf(body)
		if id == "" {
			t.Fatalf("%s: no id in %s", tc.Name, tc.Body)
		}
		want, err := s.Driver.ParseRefetch(body)
		if err != nil {
			t.Fatal(err)
		}
		if got, err := c.ParseRefetchFor(id, body); err != nil || !reflect.DeepEqual(got, want) {
			t.Errorf("%s: ParseRefetchFor(%s) = %v, %v; want ParseRefetch's\n%s", tc.Name, id, DumpFacts(got), err, DumpFacts(want))
		}
		others := []string{""}
		if s.OtherIDs != nil {
			others = append(others, s.OtherIDs(id)...)
		}
		for _, other := range others {
			if got, err := c.ParseRefetchFor(other, body); !errors.Is(err, provider.ErrUnprocessable) || got != nil {
				t.Errorf("%s: ParseRefetchFor(%q) of payment %s = %v, %v; want ErrUnprocessable", tc.Name, other, id, DumpFacts(got), err)
			}
		}
	}
}

// Fuzz checks ParseRefetch on arbitrary answers, seeded with every case and
// seeds: it never panics; a rejection wraps provider.ErrUnprocessable and
// returns no facts; accepted facts are well formed, deterministic, survive
// a JSON round trip, all apply in the order given to a new payment, and
// converge in any order.
func (s RefetchSuite) Fuzz(f *testing.F, seeds ...string) {
	for _, tc := range s.Cases {
		f.Add([]byte(tc.Body))
	}
	for _, b := range seeds {
		f.Add([]byte(b))
	}
	f.Add([]byte(strings.Repeat(`{"a":`, 40) + "1" + strings.Repeat("}", 40)))
	f.Fuzz(func(t *testing.T, body []byte) {
		facts, err := s.Driver.ParseRefetch(body)
		if err != nil {
			if !errors.Is(err, provider.ErrUnprocessable) {
				t.Fatalf("error does not wrap ErrUnprocessable: %v", err)
			}
			if facts != nil {
				t.Fatalf("rejected answer returned facts: %+v", facts)
			}
			return
		}
		if len(facts) == 0 {
			t.Fatal("accepted answer asserts no fact")
		}
		ids := map[string]bool{}
		for _, fc := range facts {
			badCurrency := (fc.Currency != "" || fc.AmountMinor > 0) && (len(fc.Currency) != 3 || strings.ToUpper(fc.Currency) != fc.Currency)
			if fc.AmountMinor < 0 || fc.AmountMinor > payment.MaxAmountMinor || badCurrency {
				t.Fatalf("malformed fact %+v", fc)
			}
			if y := fc.OccurredAt.Year(); y < 1970 || y > 9999 || fc.OccurredAt.Location() != time.UTC {
				t.Fatalf("bad OccurredAt in %+v", fc)
			}
			if fc.RefundID != "" {
				if ids[fc.RefundID] || provider.CheckID("refund id", fc.RefundID) != nil {
					t.Fatalf("bad or repeated refund id in %+v", facts)
				}
				ids[fc.RefundID] = true
			}
		}
		again, err := s.Driver.ParseRefetch(body)
		if err != nil || !reflect.DeepEqual(again, facts) {
			t.Fatalf("re-parse differs: %+v, %v", again, err)
		}
		j, err := json.Marshal(facts)
		if err != nil {
			t.Fatal(err)
		}
		var back []payment.Fact
		if err := json.Unmarshal(j, &back); err != nil || !reflect.DeepEqual(back, facts) {
			t.Fatalf("JSON round trip: %+v, %v", back, err)
		}
		CheckConverges(t, facts, "")
	})
}

// Answer returns the API answer stored in testdata/refetch/{name}, where
// a driver keeps the real answers its refetch cases and fuzz seeds start
// from. It fails tb when the file cannot be read.
func Answer(tb testing.TB, name string) string {
	tb.Helper()
	b, err := os.ReadFile(filepath.Join("testdata", "refetch", name))
	if err != nil {
		tb.Fatal(err)
	}
	return string(b)
}

// Variants returns Fuzz seeds made from answer: its first half (a
// truncated answer), then answer with each edit (old text, new text) made
// once.
func Variants(answer string, edits [][2]string) []string {
	seeds := []string{answer[:len(answer)/2]}
	for _, e := range edits {
		seeds = append(seeds, strings.Replace(answer, e[0], e[1], 1))
	}
	return seeds
}

// CheckConverges replays facts on a new payment: in the order given every
// fact applies (nothing is left deferred or ignored) and the payment ends
// in final (when set); reversed, and shuffled with a duplicate, it ends in
// an Equivalent state with the same balances; the same facts again (a
// second refetch of the same answer) change nothing.
func CheckConverges(t testing.TB, facts []payment.Fact, final payment.Status) {
	t.Helper()
	var m payment.Machine
	in := m.Replay(payment.State{}, facts)
	for i, d := range in.Decisions {
		if d.Outcome != payment.OutcomeApplied {
			t.Fatalf("fact %d (%+v) in order: %s %s, want applied", i, facts[i], d.Outcome, d.Reason)
		}
	}
	if final != "" && in.State.Status != final {
		t.Fatalf("final status %s, want %s", in.State.Status, final)
	}
	rng := rand.New(rand.NewPCG(uint64(len(facts)), 7))
	for round := range 8 {
		order := append([]payment.Fact(nil), facts...)
		if round == 0 {
			for i, j := 0, len(order)-1; i < j; i, j = i+1, j-1 {
				order[i], order[j] = order[j], order[i]
			}
		} else {
			order = append(order, facts[rng.IntN(len(facts))])
			rng.Shuffle(len(order), func(i, j int) { order[i], order[j] = order[j], order[i] })
		}
		got := m.Replay(payment.State{}, order)
		if !got.State.Equivalent(in.State) || !reflect.DeepEqual(got.State.Balances(), in.State.Balances()) {
			t.Fatalf("order %d: state %+v, in order %+v", round, got.State, in.State)
		}
	}
	if again := m.Replay(in.State, facts); len(again.Transitions) != 0 {
		t.Fatalf("the same facts again made transitions: %+v", again.Transitions)
	}
}

// DumpFacts prints facts one JSON object a line, for failure messages.
func DumpFacts(fs []payment.Fact) string {
	var b strings.Builder
	for _, f := range fs {
		j, _ := json.Marshal(f)
		b.WriteString("  " + string(j) + "\n")
	}
	return b.String()
}

// RefetchFacts sends req with client and returns what r makes of the
// answer, failing t unless the gateway answered 200 OK with a body r
// parses: a refetch as the processor does it, end to end.
func RefetchFacts(t testing.TB, client *http.Client, req *http.Request, r provider.Refetcher) []payment.Fact {
	t.Helper()
	resp, err := client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("%s answered %d: %s", req.URL, resp.StatusCode, body)
	}
	facts, err := r.ParseRefetch(body)
	if err != nil {
		t.Fatalf("ParseRefetch: %v", err)
	}
	return facts
}

// Member is the raw JSON value of key in body's top-level object: nil
// when body is not an object or has no such key. It is what a
// RefetchSuite.IDOf reads the answer's payment id from.
func Member(body []byte, key string) json.RawMessage {
	var obj map[string]json.RawMessage
	_ = json.Unmarshal(body, &obj)
	return obj[key]
}

// StringMember is a RefetchSuite.IDOf for answers whose payment id is the
// JSON string at key in their top-level object ("" when there is none).
func StringMember(key string) func(body []byte) string {
	return func(body []byte) string {
		var id string
		_ = json.Unmarshal(Member(body, key), &id)
		return id
	}
}

// At parses an RFC 3339 time, in UTC; it panics on a bad one (tests' own
// constants).
func At(s string) time.Time {
	t, err := time.Parse(time.RFC3339Nano, s)
	if err != nil {
		panic(err)
	}
	return t.UTC()
}

// Fact is a fact of status in BRL at when.
func Fact(s payment.Status, amount int64, when string) payment.Fact {
	return payment.Fact{Status: s, AmountMinor: amount, Currency: "BRL", OccurredAt: At(when)}
}

// Refund is the refund id's fact of status in BRL at when.
func Refund(s payment.Status, id string, amount int64, when string) payment.Fact {
	return payment.Fact{Status: s, RefundID: id, AmountMinor: amount, Currency: "BRL", OccurredAt: At(when)}
}

// Object builds a compact JSON object: the keys of order with their
// defaults (raw JSON values), fields ("key=json;…", semicolons inside
// brackets kept; "key=-" drops a key; new keys go last) overriding them.
func Object(defaults map[string]string, order []string, fields string) string {
	values := make(map[string]string, len(defaults))
	for k, v := range defaults {
		values[k] = v
	}
	order = append([]string(nil), order...)
	for _, kv := range splitTop(fields) {
		k, v, _ := strings.Cut(kv, "=")
		if _, ok := values[k]; !ok {
			order = append(order, k)
		}
		values[k] = v
	}
	parts := make([]string, 0, len(order))
	for _, k := range order {
		if v := values[k]; v != "-" {
			parts = append(parts, `"`+k+`":`+v)
		}
	}
	return "{" + strings.Join(parts, ",") + "}"
}

// splitTop splits "a=1;b=[x;y]" on the semicolons outside brackets.
func splitTop(s string) []string {
	if s == "" {
		return nil
	}
	var out []string
	depth, start := 0, 0
	for i, c := range s {
		switch c {
		case '[', '{':
			depth++
		case ']', '}':
			depth--
		case ';':
			if depth == 0 {
				out = append(out, s[start:i])
				start = i + 1
			}
		}
	}
	return append(out, s[start:])
}
