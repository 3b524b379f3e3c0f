package providertest

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
)

// UpdateCorpusEnv names the environment variable that makes SeedCorpus
// rewrite the committed seed corpora instead of checking them:
//
//	PAYSTREAM_UPDATE_CORPUS=1 go test ./internal/provider/... -run 'Conformance|SeedCorpus'
const UpdateCorpusEnv = "PAYSTREAM_UPDATE_CORPUS"

// Seed is one hostile request for the fuzz seed corpora.
type Seed struct {
	Name   string
	Header string // as Request reads it
	Body   []byte
}

var (
	amountRE = regexp.MustCompile(`"(amount|value|amount_received|paid_amount)":\s*-?[0-9][0-9.eE+-]*`)
	stringRE = regexp.MustCompile(`"(id|payment_id|type|event)":\s*"`)
	timeRE   = regexp.MustCompile(`"(created_at|timestamp|dateCreated|date_created|paid_at)":\s*"[0-9]{4}`)
	keyRE    = regexp.MustCompile(`^\s*\{\s*("[^"]+":\s*("[^"]*"|[0-9]+))`)
)

// BadInputs derives hostile variants of h's first accepted fixture, signed
// (so Parse sees them as it would after Verify) where the scheme allows:
// malformed and truncated JSON, duplicate keys, invalid UTF-8, NUL inside
// strings, 400-digit, float, negative and non-finite amounts, a year past
// 9999, empty and form-encoded bodies with the wrong content type, deep
// nesting and huge headers.
func BadInputs(t testing.TB, h Harness) []Seed {
	var base []byte
	for _, fx := range h.Fixtures {
		if fx.Want != nil {
			base = fx.Body
			break
		}
	}
	if base == nil {
		t.Fatal("harness has no accepted fixture")
	}
	s := string(base)
	variants := []struct{ name, body string }{
		{"truncated", s[:len(s)/2]},
		{"malformed", strings.Replace(s, ":", "", 1)},
		{"trailing garbage", s + "}"},
		{"two objects", s + s},
		{"empty", ""},
		{"whitespace", " \n\t "},
		{"null", "null"},
		{"array", "[" + s + "]"},
		{"form", "type=payment.paid&id=1&amount=100"},
		{"deep", strings.Repeat(`{"a":`, 200) + "1" + strings.Repeat("}", 200)},
		{"invalid UTF-8", stringRE.ReplaceAllStringFunc(s, func(m string) string { return m + "\xff\xfe" })},
		{"NUL in strings", stringRE.ReplaceAllStringFunc(s, func(m string) string { return m + `\u0000` })},
		{"raw NUL", strings.Replace(s, `"`, "\"\x00", 2)},
		{"400-digit amount", amountRE.ReplaceAllStringFunc(s, func(m string) string { return amountKey(m) + strings.Repeat("9", 400) })},
		{"float amount", amountRE.ReplaceAllStringFunc(s, func(m string) string { return amountKey(m) + "100.5" })},
		{"over-precise amount", amountRE.ReplaceAllStringFunc(s, func(m string) string { return amountKey(m) + "100.001" })},
		{"exponent amount", amountRE.ReplaceAllStringFunc(s, func(m string) string { return amountKey(m) + "1e400" })},
		{"negative amount", amountRE.ReplaceAllStringFunc(s, func(m string) string { return amountKey(m) + "-100" })},
		{"minus zero amount", amountRE.ReplaceAllStringFunc(s, func(m string) string { return amountKey(m) + "-0" })},
		{"string amount", amountRE.ReplaceAllStringFunc(s, func(m string) string { return amountKey(m) + `"NaN"` })},
		{"int64 overflow amount", amountRE.ReplaceAllStringFunc(s, func(m string) string { return amountKey(m) + "9223372036854775808" })},
		{"year 10000", timeRE.ReplaceAllStringFunc(s, func(m string) string { return m[:len(m)-4] + "10000" })},
	}
	if m := keyRE.FindStringSubmatch(s); m != nil {
		variants = append(variants, struct{ name, body string }{"duplicate key", strings.Replace(s, "{", "{"+m[1]+",", 1)})
	}
	var seeds []Seed
	for _, v := range variants {
		r := h.Sign(t, h.OldSecret, []byte(v.body), Now)
		header := Encode(r)
		if v.name == "form" {
			header += "Content-Type: application/x-www-form-urlencoded\n"
		} else {
			header += "Content-Type: application/json; charset=utf-8\n"
		}
		seeds = append(seeds, Seed{Name: v.name, Header: header, Body: []byte(v.body)})
	}
	r := h.Sign(t, h.OldSecret, base, Now)
	seeds = append(seeds,
		Seed{Name: "huge header", Header: Encode(r) + "X-Padding: " + strings.Repeat("A", 8<<10) + "\n", Body: base},
		Seed{Name: "wrong content type", Header: Encode(r) + "Content-Type: text/plain\n", Body: base},
		Seed{Name: "no headers", Header: "", Body: base},
	)
	for _, name := range h.RequiredHeaders {
		r := h.Sign(t, h.OldSecret, base, Now)
		v := r.Header.Get(name)
		r.Header.Set(name, strings.Repeat(v+",", 128))
		seeds = append(seeds, Seed{Name: "huge " + name, Header: Encode(r), Body: base})
		r.Header.Set(name, v[:len(v)/2])
		seeds = append(seeds, Seed{Name: "truncated " + name, Header: Encode(r), Body: base})
	}
	return seeds
}

func amountKey(m string) string {
	i := strings.Index(m, ":")
	return m[:i+1]
}

// SeedCorpus keeps the committed seed corpora of a driver's FuzzVerify and
// FuzzParse (testdata/fuzz/…, in the "go test fuzz v1" format plain go test
// runs) in step with BadInputs: it fails when a file is missing, and
// rewrites them when UpdateCorpusEnv is set.
func SeedCorpus(t *testing.T, h Harness) {
	t.Helper()
	update := os.Getenv(UpdateCorpusEnv) != ""
	for _, s := range BadInputs(t, h) {
		files := map[string]string{
			"FuzzVerify": "go test fuzz v1\nstring(" + strconv.Quote(s.Header) + ")\n[]byte(" + strconv.Quote(string(s.Body)) + ")\nint64(" + strconv.FormatInt(Now.Unix(), 10) + ")\n",
			"FuzzParse":  "go test fuzz v1\nstring(" + strconv.Quote(s.Header) + ")\n[]byte(" + strconv.Quote(string(s.Body)) + ")\n",
		}
		for target, content := range files {
			sum := sha256.Sum256([]byte(content))
			path := filepath.Join("testdata", "fuzz", target, "seed-"+slug(s.Name)+"-"+hex.EncodeToString(sum[:4]))
			if update {
				if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
					t.Fatal(err)
				}
				if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
					t.Fatal(err)
				}
				continue
			}
			if _, err := os.Stat(path); err != nil {
				t.Errorf("seed corpus file %s missing (%v); regenerate with %s=1", path, err, UpdateCorpusEnv)
			}
		}
	}
}

func slug(s string) string {
	var b strings.Builder
	for _, r := range strings.ToLower(s) {
		switch {
		case 'a' <= r && r <= 'z', '0' <= r && r <= '9':
			b.WriteRune(r)
		default:
			b.WriteByte('-')
		}
	}
	return fmt.Sprint(strings.Trim(b.String(), "-"))
}
