package provider

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"reflect"
	"strings"
	"testing"
	"time"
	"unicode/utf8"
)

// decodeJSONReference is DecodeJSON as it was before its single-pass
// scanner: utf8.Valid, then a walk over encoding/json's tokens (one map of
// keys per object), then the decoding. It is slow and obviously right, and
// FuzzDecodeJSONReference holds DecodeJSON to accept exactly what it
// accepts.
func decodeJSONReference(body []byte, v any) error {
	if len(bytes.TrimSpace(body)) == 0 {
		return Unprocessable("empty body")
	}
	if !utf8.Valid(body) {
		return Unprocessable("body not valid UTF-8")
	}
	if err := checkStructureReference(body); err != nil {
		return err
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.UseNumber()
	if err := dec.Decode(v); err != nil {
		return Unprocessable("decode body: " + shortJSONError(err))
	}
	return nil
}

func checkStructureReference(body []byte) error {
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.UseNumber()
	type frame struct {
		object bool
		keys   map[string]struct{}
		key    bool // next string token in an object is a key
	}
	var stack []*frame
	first := true
	for {
		tok, err := dec.Token()
		if errors.Is(err, io.EOF) {
			if len(stack) != 0 {
				return Unprocessable("truncated JSON")
			}
			return nil
		}
		if err != nil {
			return Unprocessable("malformed JSON: " + shortJSONError(err))
		}
		if len(stack) == 0 && !first {
			return Unprocessable("trailing data after JSON object")
		}
		if first {
			if d, ok := tok.(json.Delim); !ok || d != '{' {
				return Unprocessable("body is not a JSON object")
			}
		}
		first = false
		var top *frame
		if len(stack) > 0 {
			top = stack[len(stack)-1]
		}
		if k, isString := tok.(string); isString && top != nil && top.object && top.key {
			if _, dup := top.keys[k]; dup {
				return Unprocessable(fmt.Sprintf("duplicate key %q", clipKey(k)))
			}
			top.keys[k] = struct{}{}
			top.key = false
			continue
		}
		switch tok {
		case json.Delim('{'), json.Delim('['):
			if len(stack) >= MaxJSONDepth {
				return Unprocessable("JSON nested too deep")
			}
			object := tok == json.Delim('{')
			f := &frame{object: object, key: object}
			if object {
				f.keys = map[string]struct{}{}
			}
			stack = append(stack, f)
		case json.Delim('}'), json.Delim(']'):
			stack = stack[:len(stack)-1]
			if len(stack) > 0 && stack[len(stack)-1].object {
				stack[len(stack)-1].key = true
			}
		default:
			if top != nil && top.object {
				top.key = true
			}
		}
	}
}

// scannerCases are bodies at the edges of the scanner's grammar, checked
// against the reference by TestDecodeJSONMatchesReference and seeding
// FuzzDecodeJSONReference.
var scannerCases = []string{
	`{}`, `{ }`, "\t{\r\n}\n", `{"a":[]}`, `{"a":[ ]}`, `{"a":{}}`,
	`{"a":true,"b":false,"c":null}`, `{"a":tru}`, `{"a":nul}`, `{"a":nulll}`, `{"a":True}`,
	`{"a":0}`, `{"a":-0}`, `{"a":01}`, `{"a":-}`, `{"a":1.}`, `{"a":.5}`, `{"a":1.5e}`, `{"a":1e+}`,
	`{"a":1E-7}`, `{"a":-1.25e+10}`, `{"a":1e400}`, `{"a":+1}`, `{"a":0x10}`, `{"a":Infinity}`, `{"a":NaN}`,
	`{"a":"\"\\\/\b\f\n\r\t\u00e9"}`, `{"a":"\x"}`, `{"a":"\u12"}`, `{"a":"\u12G4"}`, "{\"a\":\"\t\"}", "{\"a\":\"\x7f\"}",
	`{"a":"\ud800"}`, `{"\ud800":1,"\udc00":2}`, `{"\ud800":1,"\ufffd":2}`, `{"\ud83d\ude00":1,"😀":2}`,
	`{"a":1,"A":2}`, `{"é":1,"\u00e9":2}`, `{"\/":1,"/":2}`, `{"a\u0000":1,"a":2}`,
	`{"a":1,}`, `{,"a":1}`, `{"a":1 "b":2}`, `{"a" 1}`, `{"a"::1}`, `{a:1}`, `{'a':1}`, `{"a":[1,]}`, `{"a":[,1]}`,
	`{"a":[1 2]}`, `{"a":1]`, `{"a":[1}`, `{"a":1}}`, `{"a":1}]`, `{"a":1} `, `{"a":1}` + "\x00", `{"a":1}/**/`,
	"\ufeff{}", "\u00a0{}", `{"a":"b"`, `{"a"`, `{"a`, `{`, `[{}]`, `null`, `1`, `{"a":1}{`,
	strings.Repeat(`[`, 31), `{"a":` + strings.Repeat(`[`, 31) + strings.Repeat(`]`, 31) + `}`,
	`{"a":` + strings.Repeat(`[`, 32) + strings.Repeat(`]`, 32) + `}`,
	strings.Repeat(`{"a":`, 32) + `1` + strings.Repeat(`}`, 32),
	strings.Repeat(`{"a":`, 33) + `1` + strings.Repeat(`}`, 33),
	manyKeys(keysScannedLinearly, ""), manyKeys(keysScannedLinearly+1, ""), manyKeys(100, ""),
	manyKeys(100, `"k5"`), manyKeys(100, `"k99"`), manyKeys(keysScannedLinearly+1, `"k\u0030"`), manyKeys(3, `"k\u0030"`),
	`{"a":{"x":1},"b":{"x":2},"x":3}`, `{"a":[{"x":1},{"x":2}]}`, `{"a":{"b":1,"c":{"b":2}},"b":3}`,
	// Decoded into planned: every field, nulls, wrong kinds, case.
	plannedBody,
	`{"s":null,"n":null,"a":null,"b":null,"pb":null,"ps":null,"pa":null,"pps":null,"r":null,"t":null,"sub":null,"psub":null}`,
	`{"s":1}`, `{"s":true}`, `{"s":{}}`, `{"s":[]}`, `{"n":"12"}`, `{"n":"x"}`, `{"n":true}`, `{"b":"true"}`, `{"b":1}`,
	`{"pb":"x"}`, `{"ps":1}`, `{"sub":"x"}`, `{"sub":[]}`, `{"psub":1}`, `{"t":"yesterday"}`, `{"t":1}`, `{"r":[1,2]}`,
	`{"S":"upper"}`, `{"s":"a","S":"b"}`, `{"S":"b","s":"a"}`, `{"plain":"lower"}`, `{"SUB":{"ID":"x"}}`, `{"sub":{"Id":"x"}}`,
	`{"\u0073":"escaped"}`, `{"s\u0000":"nul"}`, `{"\u212Aey":1}`, `{"ſ":"long s"}`, `{"a-B.C":"d"}`, `{"skip":"x","Skip":"y"}`,
	`{"i":1,"f":["a"],"m":{"k":1.5},"q":"\"x\"","sub":{"id":"s"}}`, `{"i":"1"}`, `{"q":"x"}`,
	`{"pps":null}`, `{"pps":1}`, `{"self":{"s":"x","self":{"a":1}}}`, `{"self":{"self":{"S":1}}}`, `{"psub":{"inner":{"x":1}}}`, `{"sub":{"inner":null,"amount":{}}}`,
}

// plannedBody sets every field of planned.
const plannedBody = `{"s":"x\u00e9\n","n":-1.5e3,"a":1050,"b":true,"pb":false,"ps":"p","pa":10.50,"pps":"q","r":{"k":[1,"2"]},` +
	`"t":"2024-06-12T19:45:03Z","sub":{"id":"i","amount":"7","inner":{"x":"y"}},"psub":{"id":"j"},"named":"paid",` +
	`"Plain":"pl","a-b.c":"d","Skip":"no","skip":"no","other":{"s":1}}`

// manyKeys returns an object with n keys k0…k(n-1) and then, unless extra
// is empty, one more key extra.
func manyKeys(n int, extra string) string {
	var b strings.Builder
	b.WriteString("{")
	for i := range n {
		if i > 0 {
			b.WriteString(",")
		}
		fmt.Fprintf(&b, `"k%d":%d`, i, i)
	}
	if extra != "" {
		b.WriteString("," + extra + ":true")
	}
	b.WriteString("}")
	return b.String()
}

// planned exercises every kind of plan (and fields without one) for the
// differential tests: DecodeJSON decodes it in the scanning pass.
type planned struct {
	S     string          `json:"s"`
	N     json.Number     `json:"n"`
	A     Amount          `json:"a"`
	B     bool            `json:"b,omitempty"`
	PB    *bool           `json:"pb"`
	PS    *string         `json:"ps"`
	PA    *Amount         `json:"pa"`
	PPS   **string        `json:"pps"`
	R     json.RawMessage `json:"r"`
	T     time.Time       `json:"t"`
	Sub   plannedSub      `json:"sub"`
	PSub  *plannedSub     `json:"psub"`
	Named status          `json:"named"`
	Self  *planned        `json:"self"`
	Plain string
	Dash  string `json:"a-b.c"`
	Skip  string `json:"-"`
	skip  string //nolint:unused // never decoded into: the decoder leaves unexported fields alone
}

type plannedSub struct {
	ID     string `json:"id"`
	Amount Amount `json:"amount"`
	Inner  struct {
		X string `json:"x"`
	} `json:"inner"`
}

type status string

// unplanned has fields no plan covers: encoding/json decodes it after the
// check.
type unplanned struct {
	I   int            `json:"i"`
	F   []string       `json:"f"`
	M   map[string]any `json:"m"`
	Q   string         `json:"q,string"`
	Sub plannedSub     `json:"sub"`
}

// sameDecoding reports a difference between DecodeJSON and the reference
// on body, decoding into any, planned and unplanned: one accepting what the
// other refuses, a different value, or an error not wrapping
// ErrUnprocessable.
func sameDecoding(body []byte) error {
	for _, newV := range []func() any{
		func() any { return new(any) },
		func() any { return new(planned) },
		func() any { return new(unplanned) },
	} {
		got, want := newV(), newV()
		err, wantErr := DecodeJSON(body, got), decodeJSONReference(body, want)
		if err != nil && !errors.Is(err, ErrUnprocessable) {
			return fmt.Errorf("%T: error does not wrap ErrUnprocessable: %v", got, err)
		}
		if (err == nil) != (wantErr == nil) {
			return fmt.Errorf("%T: DecodeJSON = %v, reference = %v", got, err, wantErr)
		}
		if err == nil && !reflect.DeepEqual(got, want) {
			return fmt.Errorf("%T: DecodeJSON decoded %+v, reference %+v", got, got, want)
		}
	}
	return nil
}

// TestDecodeJSONMatchesReference: the single-pass scanner accepts exactly
// the bodies the token walk did, and decodes them the same way.
func TestDecodeJSONMatchesReference(t *testing.T) {
	t.Parallel()
	bodies := append([]string{}, scannerCases...)
	for _, tc := range decodeCases {
		bodies = append(bodies, tc.body)
	}
	for _, body := range bodies {
		if err := sameDecoding([]byte(body)); err != nil {
			t.Errorf("%.60q: %v", body, err)
		}
	}
}

// FuzzDecodeJSONReference holds DecodeJSON to the reference on any input.
func FuzzDecodeJSONReference(f *testing.F) {
	for _, tc := range decodeCases {
		f.Add([]byte(tc.body))
	}
	for _, body := range scannerCases {
		f.Add([]byte(body))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		if err := sameDecoding(body); err != nil {
			t.Fatal(err)
		}
	})
}

// TestDecodeJSONDuplicateInLargeObject: past the keys compared one by one,
// a duplicate is still found, escaped or not, and distinct keys pass.
func TestDecodeJSONDuplicateInLargeObject(t *testing.T) {
	t.Parallel()
	for body, ok := range map[string]bool{
		manyKeys(1000, ""):                         true,
		manyKeys(1000, `"k0"`):                     false,
		manyKeys(1000, `"k999"`):                   false,
		manyKeys(1000, `"k\u0035"`):                false,
		manyKeys(keysScannedLinearly, `"k0"`):      false,
		manyKeys(keysScannedLinearly, `"k\u0031"`): false,
	} {
		var v map[string]any
		if err := DecodeJSON([]byte(body), &v); (err == nil) != ok {
			t.Errorf("%d bytes: DecodeJSON = %v, want ok %v", len(body), err, ok)
		}
	}
}

// TestDecodeJSONOnePass: payload types are decoded in the checking pass,
// and a key matching a field only without regard to case, a value of
// another kind or a type without a plan go to encoding/json.
func TestDecodeJSONOnePass(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		body    string
		v       any
		onePass bool
	}{
		{string(benchBody), new(benchPayload), true},
		{plannedBody, new(planned), true},
		{`{"s":null,"psub":null,"unknown":[{"s":1}]}`, new(planned), true},
		{`{"S":"x"}`, new(planned), false},
		{`{"\u0073":"x"}`, new(planned), false},
		{`{"s":1}`, new(planned), false},
		{`{"sub":{"inner":{"x":1}}}`, new(planned), false},
		{`{"s":"x"}`, new(unplanned), false},
		{`{"s":"x"}`, new(any), false},
		{`{"s":"x"}`, nil, false},
	} {
		onePass, _ := decodeJSON([]byte(tc.body), tc.v)
		if onePass != tc.onePass {
			t.Errorf("%T %.40s: one pass %v, want %v", tc.v, tc.body, onePass, tc.onePass)
		}
	}
}

// benchBody is a Standard Webhooks payload as ingest sees on every request.
var benchBody = []byte(`{"type":"payment.paid","timestamp":"2026-11-29T18:00:00Z","data":{"payment_id":"pay_3f9a1c2b","amount":1050,"currency":"BRL"}}`)

type benchPayload struct {
	Type      string `json:"type"`
	Timestamp string `json:"timestamp"`
	Data      struct {
		PaymentID string `json:"payment_id"`
		Amount    Amount `json:"amount"`
		Currency  string `json:"currency"`
	} `json:"data"`
}

func BenchmarkDecodeJSON(b *testing.B) {
	for _, bc := range []struct {
		name   string
		decode func([]byte, any) error
	}{{"scanner", DecodeJSON}, {"reference", decodeJSONReference}} {
		b.Run(bc.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				var p benchPayload
				if err := bc.decode(benchBody, &p); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkCheckJSON is the check alone, without decoding.
func BenchmarkCheckJSON(b *testing.B) {
	b.ReportAllocs()
	for b.Loop() {
		s := scanner{data: benchBody}
		if err := s.check(target{}); err != nil {
			b.Fatal(err)
		}
	}
}
