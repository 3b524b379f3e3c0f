package provider

import (
	"bytes"
	"encoding/json"
	"reflect"
	"strconv"
	"unicode/utf8"
)

// MaxJSONDepth is the deepest nesting DecodeJSON accepts.
const MaxJSONDepth = 32

// DecodeJSON decodes a webhook body into v strictly: the body must be valid
// UTF-8, a single JSON object with no duplicate keys at any level (two
// parsers reading one signed body differently is how forged amounts slip
// through), nested at most MaxJSONDepth deep, with nothing after it. Numbers
// are decoded as json.Number (never float64), so v should declare amount
// fields as Amount (or json.Number) and pass their text to package money.
// Otherwise v is decoded as encoding/json decodes it.
//
// Payload types (structs of strings, bools, Amount, json.Number,
// json.RawMessage, other structs and pointers to these) are decoded in the
// same pass as the check; others by encoding/json after it. On error, v may
// be partly set.
//
// Errors wrap ErrUnprocessable.
func DecodeJSON(body []byte, v any) error {
	_, err := decodeJSON(body, v)
	return err
}

// decodeJSON is DecodeJSON; onePass reports that the body was decoded in
// the same pass as the check.
func decodeJSON(body []byte, v any) (onePass bool, err error) {
	var t target
	if rv := reflect.ValueOf(v); rv.Kind() == reflect.Pointer && !rv.IsNil() {
		t = target{rv.Elem(), planFor(rv.Elem().Type())}
	}
	s := scanner{data: body, decoding: t.plan != nil}
	if err := s.check(t); err != nil {
		return false, err
	}
	if s.decoding {
		return true, nil
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.UseNumber()
	if err := dec.Decode(v); err != nil {
		return false, Unprocessable("decode body: " + shortJSONError(err))
	}
	return false, nil
}

// scanner checks JSON syntax (RFC 8259, as encoding/json reads it),
// duplicate keys and depth in one pass, and meanwhile decodes what it can
// into its target. UTF-8 is checked beforehand.
type scanner struct {
	data []byte
	pos  int
	// decoding is cleared when the target's plan meets what only
	// encoding/json decodes right (a key matching a field only without
	// regard to case, a value of the wrong kind, an Unmarshaler's error):
	// the scan then only checks, and encoding/json decodes afterwards.
	decoding bool
}

// target is where the value being scanned goes: a settable value and its
// type's plan, or nowhere (nil plan).
type target struct {
	v    reflect.Value
	plan *plan
}

// check scans the whole body into t, without allocating beyond what is
// decoded unless an object has many keys or an escaped key.
func (s *scanner) check(t target) error {
	if len(bytes.TrimSpace(s.data)) == 0 {
		return Unprocessable("empty body")
	}
	if !utf8.Valid(s.data) {
		return Unprocessable("body not valid UTF-8")
	}
	s.skipSpace()
	if s.peek() != '{' {
		return Unprocessable("body is not a JSON object")
	}
	if err := s.value(0, t); err != nil {
		return err
	}
	s.skipSpace()
	if s.pos < len(s.data) {
		return Unprocessable("trailing data after JSON object")
	}
	return nil
}

// giveUp stops decoding: encoding/json will.
func (s *scanner) giveUp() { s.decoding = false }

// keysScannedLinearly is how many keys an object may have before its
// duplicates are looked up in a map instead of by comparing with each
// earlier key, so that a huge object costs linear time. A key with an
// escape goes to the map at once: only its decoded value compares.
const keysScannedLinearly = 16

// peek returns the byte at the current position, or 0 at the end.
func (s *scanner) peek() byte {
	if s.pos < len(s.data) {
		return s.data[s.pos]
	}
	return 0
}

func (s *scanner) skipSpace() {
	for s.pos < len(s.data) {
		switch s.data[s.pos] {
		case ' ', '\t', '\n', '\r':
			s.pos++
		default:
			return
		}
	}
}

func (s *scanner) errorf(what string) error {
	if s.pos >= len(s.data) {
		return Unprocessable("truncated JSON")
	}
	return Unprocessable("malformed JSON: " + what + " at offset " + strconv.Itoa(s.pos))
}

// value scans one value into t; depth is how many containers enclose it.
func (s *scanner) value(depth int, t target) error {
	s.skipSpace()
	if !s.decoding {
		t = target{}
	}
	for t.plan != nil && t.plan.kind == planPointer {
		if s.peek() == 'n' { // null (or a bad literal, refused below)
			t.v.SetZero()
			t = target{}
			break
		}
		if t.v.IsNil() {
			t.v.Set(reflect.New(t.v.Type().Elem()))
		}
		t = target{t.v.Elem(), t.plan.elem}
	}
	start := s.pos
	var err error
	switch c := s.peek(); {
	case c == '{':
		if depth >= MaxJSONDepth {
			return Unprocessable("JSON nested too deep")
		}
		if t.plan != nil && t.plan.kind == planStruct {
			return s.object(depth+1, t.plan, t.v)
		}
		err = s.object(depth+1, nil, reflect.Value{})
	case c == '[':
		if depth >= MaxJSONDepth {
			return Unprocessable("JSON nested too deep")
		}
		err = s.array(depth + 1)
	case c == '"':
		var raw []byte
		if raw, err = s.string(); err == nil && t.plan != nil && t.plan.kind == planString {
			t.v.SetString(unquote(raw))
			return nil
		}
	case c == '-' || ('0' <= c && c <= '9'):
		if err = s.number(); err == nil && t.plan != nil && t.plan.kind == planNumber {
			t.v.SetString(string(s.data[start:s.pos]))
			return nil
		}
	case c == 't' || c == 'f':
		lit := "true"
		if c == 'f' {
			lit = "false"
		}
		if err = s.literal(lit); err == nil && t.plan != nil && t.plan.kind == planBool {
			t.v.SetBool(c == 't')
			return nil
		}
	case c == 'n':
		if err = s.literal("null"); err == nil && t.plan != nil && t.plan.kind != planUnmarshaler {
			return nil // encoding/json leaves a non-pointer alone on null
		}
	default:
		return s.errorf("unexpected character")
	}
	if err != nil || t.plan == nil {
		return err
	}
	if t.plan.kind == planUnmarshaler {
		u := t.v.Addr().Interface().(json.Unmarshaler)
		if u.UnmarshalJSON(s.data[start:s.pos]) == nil {
			return nil
		}
	}
	s.giveUp() // a value of a kind the field does not take: encoding/json's error
	return nil
}

// object scans an object; with a struct plan p it decodes the fields into
// v, a struct.
func (s *scanner) object(depth int, p *plan, v reflect.Value) error {
	s.pos++ // '{'
	s.skipSpace()
	if s.peek() == '}' {
		s.pos++
		return nil
	}
	// The object's keys as raw JSON strings, compared byte for byte while
	// there are few and none has an escape; then decoded, in a map.
	var first [keysScannedLinearly][]byte
	keys := first[:0]
	var seen map[string]struct{}
	for {
		s.skipSpace()
		if s.peek() != '"' {
			return s.errorf("expected a key")
		}
		key, err := s.string()
		if err != nil {
			return err
		}
		if seen == nil && len(keys) < cap(keys) && bytes.IndexByte(key, '\\') < 0 {
			for _, k := range keys {
				if bytes.Equal(k, key) {
					return duplicateKey(unquote(key))
				}
			}
			keys = append(keys, key)
		} else {
			if seen == nil {
				seen = make(map[string]struct{}, 2*keysScannedLinearly)
				for _, k := range keys {
					seen[unquote(k)] = struct{}{}
				}
			}
			k := unquote(key)
			if _, dup := seen[k]; dup {
				return duplicateKey(k)
			}
			seen[k] = struct{}{}
		}
		s.skipSpace()
		if s.peek() != ':' {
			return s.errorf("expected ':'")
		}
		s.pos++
		var t target
		if p != nil && s.decoding {
			f, maybe := p.field(key)
			switch {
			case f != nil:
				t = target{v.Field(f.index), f.plan}
			case maybe:
				s.giveUp()
			}
		}
		if err := s.value(depth, t); err != nil {
			return err
		}
		s.skipSpace()
		switch s.peek() {
		case ',':
			s.pos++
		case '}':
			s.pos++
			return nil
		default:
			return s.errorf("expected ',' or '}'")
		}
	}
}

// unquote decodes a string scanned by string exactly as encoding/json
// decodes it (an invalid surrogate escape becomes U+FFFD).
func unquote(raw []byte) string {
	if bytes.IndexByte(raw, '\\') < 0 {
		return string(raw[1 : len(raw)-1])
	}
	var k string
	_ = json.Unmarshal(raw, &k) // string checked raw: a valid JSON string
	return k
}

func duplicateKey(k string) error {
	return Unprocessable("duplicate key " + strconv.Quote(clipKey(k)))
}

func (s *scanner) array(depth int) error {
	s.pos++ // '['
	s.skipSpace()
	if s.peek() == ']' {
		s.pos++
		return nil
	}
	for {
		if err := s.value(depth, target{}); err != nil {
			return err
		}
		s.skipSpace()
		switch s.peek() {
		case ',':
			s.pos++
		case ']':
			s.pos++
			return nil
		default:
			return s.errorf("expected ',' or ']'")
		}
	}
}

// string scans a string and returns it as it is in data, quotes included.
func (s *scanner) string() ([]byte, error) {
	start := s.pos
	s.pos++ // '"'
	for s.pos < len(s.data) {
		switch c := s.data[s.pos]; {
		case c == '"':
			s.pos++
			return s.data[start:s.pos], nil
		case c == '\\':
			s.pos++
			switch s.peek() {
			case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
				s.pos++
			case 'u':
				s.pos++
				for range 4 {
					if !isHex(s.peek()) {
						return nil, s.errorf("bad \\u escape")
					}
					s.pos++
				}
			default:
				return nil, s.errorf("bad escape")
			}
		case c < 0x20:
			return nil, s.errorf("control character in string")
		default:
			s.pos++
		}
	}
	return nil, s.errorf("unterminated string")
}

func isHex(c byte) bool {
	return '0' <= c && c <= '9' || 'a' <= c && c <= 'f' || 'A' <= c && c <= 'F'
}

func isDigit(c byte) bool { return '0' <= c && c <= '9' }

// number scans -?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?.
func (s *scanner) number() error {
	if s.peek() == '-' {
		s.pos++
	}
	switch c := s.peek(); {
	case c == '0':
		s.pos++
	case '1' <= c && c <= '9':
		for isDigit(s.peek()) {
			s.pos++
		}
	default:
		return s.errorf("bad number")
	}
	if s.peek() == '.' {
		s.pos++
		if !isDigit(s.peek()) {
			return s.errorf("bad number")
		}
		for isDigit(s.peek()) {
			s.pos++
		}
	}
	if c := s.peek(); c == 'e' || c == 'E' {
		s.pos++
		if c := s.peek(); c == '+' || c == '-' {
			s.pos++
		}
		if !isDigit(s.peek()) {
			return s.errorf("bad number")
		}
		for isDigit(s.peek()) {
			s.pos++
		}
	}
	return nil
}

func (s *scanner) literal(lit string) error {
	if len(s.data)-s.pos < len(lit) || string(s.data[s.pos:s.pos+len(lit)]) != lit {
		return s.errorf("bad literal")
	}
	s.pos += len(lit)
	return nil
}

func shortJSONError(err error) string {
	s := err.Error()
	if len(s) > 80 {
		s = s[:80] + "…"
	}
	return s
}

func clipKey(k string) string {
	if len(k) > 32 {
		return k[:32] + "…"
	}
	return k
}
