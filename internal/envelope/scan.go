package envelope

import (
	"bytes"
	"encoding/base64"
	"time"
	"unicode"
	"unicode/utf16"
	"unicode/utf8"
)

// textBuffer collects the decoded contents of an envelope's strings. Its
// first bytes live in the decoder, on the stack, so that they make no
// garbage: a slice appended to through the decoder's pointer would be
// moved to the heap.
type textBuffer struct {
	small [1024]byte // enough for the strings of nearly every envelope
	n     int        // bytes of small used
	large []byte     // all of the text once small is full
}

// Len returns the number of bytes written.
func (t *textBuffer) Len() int {
	if t.large != nil {
		return len(t.large)
	}
	return t.n
}

// Write appends p.
func (t *textBuffer) Write(p []byte) {
	if t.large == nil && t.n+len(p) <= len(t.small) {
		t.n += copy(t.small[t.n:], p)
		return
	}
	if t.large == nil {
		t.large = append(make([]byte, 0, 2*len(t.small)+len(p)), t.small[:t.n]...)
	}
	t.large = append(t.large, p...)
}

// WriteRune appends r's UTF-8 encoding.
func (t *textBuffer) WriteRune(r rune) {
	var b [utf8.UTFMax]byte
	t.Write(utf8.AppendRune(b[:0], r))
}

// String returns the text as one newly allocated string.
func (t *textBuffer) String() string {
	if t.large != nil {
		return string(t.large)
	}
	return string(t.small[:t.n])
}

// skipSpace skips JSON whitespace.
func (d *fastDecoder) skipSpace() {
	for d.pos < len(d.data) {
		switch d.data[d.pos] {
		case ' ', '\t', '\n', '\r':
			d.pos++
		default:
			return
		}
	}
}

// begin consumes the '{' starting an object.
func (d *fastDecoder) begin() bool {
	d.skipSpace()
	if d.pos < len(d.data) && d.data[d.pos] == '{' {
		d.pos++
		return true
	}
	return false
}

// next reads what follows the '{' (first) or a member of an object: the
// '}' ending it (more == false) or, after a ',' unless first, the '"' of
// the next member's key, which it does not consume.
func (d *fastDecoder) next(first bool) (more, ok bool) {
	d.skipSpace()
	if d.pos >= len(d.data) {
		return false, false
	}
	if d.data[d.pos] == '}' {
		d.pos++
		return false, true
	}
	if !first {
		if d.data[d.pos] != ',' {
			return false, false
		}
		d.pos++
		d.skipSpace()
	}
	if d.pos < len(d.data) && d.data[d.pos] == '"' {
		return true, true
	}
	return false, false
}

// member reads the key of an object's next member and the ':' after it
// (more), or the '}' ending the object (!more). Only the envelope's own
// key spelling passes (lower-case letters and '_', unescaped): any other
// key could match a field the way encoding/json matches keys, case-folded.
func (d *fastDecoder) member(first bool) (name []byte, more, ok bool) {
	if more, ok = d.next(first); !ok || !more {
		return nil, more, ok
	}
	start := d.pos + 1 // after the '"' next saw
	for i := start; i < len(d.data); i++ {
		switch c := d.data[i]; {
		case c == '"':
			d.pos = i + 1
			return d.data[start:i], true, d.colon()
		case c != '_' && (c < 'a' || c > 'z'):
			return nil, false, false
		}
	}
	return nil, false, false
}

// colon consumes the ':' between a key and its value.
func (d *fastDecoder) colon() bool {
	d.skipSpace()
	if d.pos < len(d.data) && d.data[d.pos] == ':' {
		d.pos++
		d.skipSpace()
		return true
	}
	return false
}

// str decodes a JSON string value into text, as encoding/json unquotes it.
// It gives up on invalid UTF-8, which encoding/json would replace.
func (d *fastDecoder) str() (span, bool) {
	if d.pos >= len(d.data) || d.data[d.pos] != '"' {
		return span{}, false
	}
	s := span{off: d.text.Len()}
	i := d.pos + 1
	for i < len(d.data) {
		// Copy the run of bytes that need no unescaping in one go.
		run := i
		for i < len(d.data) && isPlain(d.data[i]) {
			i++
		}
		d.text.Write(d.data[run:i])
		if i >= len(d.data) {
			break
		}
		switch c := d.data[i]; {
		case c == '"':
			d.pos = i + 1
			s.end = d.text.Len()
			return s, true
		case c == '\\':
			n, ok := d.unescape(d.data[i:])
			if !ok {
				return span{}, false
			}
			i += n
		case c < 0x20:
			return span{}, false // a control character: invalid JSON
		default:
			r, size := utf8.DecodeRune(d.data[i:])
			if r == utf8.RuneError && size == 1 {
				return span{}, false
			}
			d.text.Write(d.data[i : i+size])
			i += size
		}
	}
	return span{}, false
}

// isPlain reports whether c stands for itself in a JSON string: ASCII
// from the space up, other than '"' and '\\'.
func isPlain(c byte) bool {
	return 0x20 <= c && c < utf8.RuneSelf && c != '"' && c != '\\'
}

// unescape appends the character of the escape sequence esc starts with
// to text and returns the sequence's length. Like encoding/json, a \u
// high surrogate followed by a \u low surrogate is one character, and a
// surrogate that is not half of such a pair is U+FFFD.
func (d *fastDecoder) unescape(esc []byte) (int, bool) {
	if len(esc) < 2 {
		return 0, false
	}
	var c byte
	switch esc[1] {
	case '"', '\\', '/':
		c = esc[1]
	case 'b':
		c = '\b'
	case 'f':
		c = '\f'
	case 'n':
		c = '\n'
	case 'r':
		c = '\r'
	case 't':
		c = '\t'
	case 'u':
		r := hex4(esc)
		if r < 0 {
			return 0, false
		}
		if utf16.IsSurrogate(r) {
			if pair := utf16.DecodeRune(r, hex4(esc[6:])); pair != unicode.ReplacementChar {
				d.text.WriteRune(pair)
				return 12, true
			}
			r = unicode.ReplacementChar
		}
		d.text.WriteRune(r)
		return 6, true
	default:
		return 0, false
	}
	d.text.Write([]byte{c})
	return 2, true
}

// hex4 returns the code unit of the \uXXXX that esc starts with, or -1.
func hex4(esc []byte) rune {
	if len(esc) < 6 || esc[0] != '\\' || esc[1] != 'u' {
		return -1
	}
	var r rune
	for _, c := range esc[2:6] {
		switch {
		case '0' <= c && c <= '9':
			c -= '0'
		case 'a' <= c && c <= 'f':
			c -= 'a' - 10
		case 'A' <= c && c <= 'F':
			c -= 'A' - 10
		default:
			return -1
		}
		r = r<<4 | rune(c)
	}
	return r
}

// plain reads a string value without escapes, control characters or
// non-ASCII bytes, returning it with its quotes: the form in which
// encoding/json hands a string to an Unmarshaler, and whose content it
// would unquote to itself.
func (d *fastDecoder) plain() ([]byte, bool) {
	if d.pos >= len(d.data) || d.data[d.pos] != '"' {
		return nil, false
	}
	for i := d.pos + 1; i < len(d.data); i++ {
		switch c := d.data[i]; {
		case c == '"':
			q := d.data[d.pos : i+1]
			d.pos = i + 1
			return q, true
		case !isPlain(c):
			return nil, false
		}
	}
	return nil, false
}

// timestamp decodes an RFC 3339 time with time.Time's own UnmarshalJSON,
// which is what encoding/json calls, with the same bytes.
func (d *fastDecoder) timestamp(t *time.Time) bool {
	q, ok := d.plain()
	return ok && t.UnmarshalJSON(q) == nil
}

// base64Bytes decodes the body as encoding/json decodes a []byte: the
// string's content through base64.StdEncoding.Decode into a slice of
// DecodedLen bytes ("" gives an empty, non-nil slice). Null, which is how
// Raw.Marshal writes a nil body, leaves it nil: the body is read only once.
func (d *fastDecoder) base64Bytes() ([]byte, bool) {
	if rest := d.data[d.pos:]; len(rest) >= 4 && string(rest[:4]) == "null" {
		d.pos += 4
		return nil, true
	}
	if d.pos >= len(d.data) || d.data[d.pos] != '"' {
		return nil, false
	}
	// The body is most of the record: find its end with IndexByte rather
	// than check it byte by byte as plain does. The base64 decoder rejects
	// what plain would (an escape, a control or non-ASCII byte) except
	// '\r' and '\n', which it skips but are invalid raw in a JSON string.
	src := d.data[d.pos+1:]
	end := bytes.IndexByte(src, '"')
	if end < 0 {
		return nil, false
	}
	src = src[:end]
	if bytes.IndexByte(src, '\n') >= 0 || bytes.IndexByte(src, '\r') >= 0 {
		return nil, false
	}
	d.pos += 1 + end + 1
	b := make([]byte, base64.StdEncoding.DecodedLen(len(src)))
	n, err := base64.StdEncoding.Decode(b, src)
	if err != nil {
		return nil, false
	}
	return b[:n], true
}

// maxDigits is the most digits integer reads: any 18-digit number fits in
// an int64, so no overflow check is needed.
const maxDigits = 18

// integer reads a JSON integer: an optional '-', then 0 or digits not
// starting with 0. A fraction or exponent is left unread, so the member's
// end is not where next looks for it and the scan gives up.
func (d *fastDecoder) integer() (int64, bool) {
	i := d.pos
	neg := i < len(d.data) && d.data[i] == '-'
	if neg {
		i++
	}
	start := i
	var n int64
	for i < len(d.data) && '0' <= d.data[i] && d.data[i] <= '9' {
		n = n*10 + int64(d.data[i]-'0')
		i++
	}
	digits := i - start
	if digits == 0 || digits > maxDigits || (digits > 1 && d.data[start] == '0') {
		return 0, false
	}
	d.pos = i
	if neg {
		n = -n
	}
	return n, true
}

// boolean reads true or false.
func (d *fastDecoder) boolean() (bool, bool) {
	rest := d.data[d.pos:]
	switch {
	case len(rest) >= 4 && string(rest[:4]) == "true":
		d.pos += 4
		return true, true
	case len(rest) >= 5 && string(rest[:5]) == "false":
		d.pos += 5
		return false, true
	}
	return false, false
}
