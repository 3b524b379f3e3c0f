package provider

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"unicode/utf8"
)

// MaxJSONDepth is the deepest nesting DecodeJSON accepts.
const MaxJSONDepth = 32

// DecodeJSON decodes a webhook body into v strictly: the body must be valid
// UTF-8, a single JSON object with no duplicate keys at any level (two
// parsers reading one signed body differently is how forged amounts slip
// through), nested at most MaxJSONDepth deep, with nothing after it. Numbers
// are decoded as json.Number (never float64), so v should declare amount
// fields as json.Number and pass their text to package money.
//
// Errors wrap ErrUnprocessable.
func DecodeJSON(body []byte, v any) error {
	if len(bytes.TrimSpace(body)) == 0 {
		return Unprocessable("empty body")
	}
	if !utf8.Valid(body) {
		return Unprocessable("body not valid UTF-8")
	}
	if err := checkStructure(body); err != nil {
		return err
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.UseNumber()
	if err := dec.Decode(v); err != nil {
		return Unprocessable("decode body: " + shortJSONError(err))
	}
	return nil
}

// checkStructure walks body's tokens once: one top-level object, no
// duplicate keys, bounded depth, no trailing data.
func checkStructure(body []byte) error {
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
