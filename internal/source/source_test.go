package source_test

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/paystream/paystream/internal/provider"
	"github.com/paystream/paystream/internal/provider/drivers"
	"github.com/paystream/paystream/internal/provider/standardwebhooks"
	"github.com/paystream/paystream/internal/source"
)

// readmeSourcesYAML returns the YAML block under docs/running.md's "Sources
// file" heading, as a reader would copy it.
func readmeSourcesYAML(t *testing.T) string {
	t.Helper()
	readme, err := os.ReadFile(filepath.Join("..", "..", "docs", "running.md"))
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile("(?s)### Sources file\\s*\n```yaml\n(.*?)```").FindSubmatch(readme)
	if m == nil {
		t.Fatal("docs/running.md has no ```yaml block under \"### Sources file\"")
	}
	return string(m[1])
}

// parse parses a sources file with every driver.
func parse(yaml string) (map[string]*source.Source, error) {
	return source.Parse([]byte(yaml), drivers.Factories())
}

// mustParse is parse for a sources file that must load.
func mustParse(t *testing.T, yaml string) map[string]*source.Source {
	t.Helper()
	sources, err := parse(yaml)
	if err != nil {
		t.Fatal(err)
	}
	return sources
}

// signedRequest is a Standard Webhooks request signed with secret.
func signedRequest(t *testing.T, secret string) *provider.Request {
	t.Helper()
	now := time.Now()
	body := []byte(`{"type":"payment.paid","timestamp":"2026-11-29T18:00:00Z","data":{"payment_id":"pay_1","amount":1050,"currency":"BRL"}}`)
	r, err := standardwebhooks.SignedRequest(secret, "msg_1", now, body)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

const readmeSecret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"

// TestReadmeSourcesFile: the README's example loads as written — and with
// its commented optional settings switched on — into a source whose driver
// verifies requests signed with the example's secret.
func TestReadmeSourcesFile(t *testing.T) {
	t.Parallel()
	yaml := readmeSourcesYAML(t)
	if !strings.Contains(yaml, readmeSecret) {
		t.Fatalf("README's sources file no longer uses %s; update this test:\n%s", readmeSecret, yaml)
	}
	sources, err := parse(yaml)
	if err != nil {
		t.Fatalf("README's sources file: %v\n%s", err, yaml)
	}
	acme := sources["acme"]
	if len(sources) != 1 || acme == nil {
		t.Fatalf("sources = %v, want just acme", sources)
	}
	if acme.Name != "acme" || acme.DriverName != "standardwebhooks" || acme.Account != "" ||
		acme.MaxBodyBytes != source.DefaultMaxBodyBytes || len(acme.Secrets) != 1 || acme.Secrets[0] != readmeSecret {
		t.Errorf("acme = %+v", acme)
	}
	if got := acme.PaymentKey("pay_1"); got != "acme:pay_1" {
		t.Errorf("PaymentKey = %q, want acme:pay_1", got)
	}
	if err := acme.Driver.Verify(signedRequest(t, readmeSecret)); err != nil {
		t.Errorf("driver rejects a request signed with the README's secret: %v", err)
	}

	// The optional settings, uncommented as documented.
	uncommented := regexp.MustCompile(`(?m)^(\s*)# ((account|tolerance|max_body_bytes):)`).ReplaceAllString(yaml, "$1$2")
	if strings.Count(uncommented, "#") >= strings.Count(yaml, "#") {
		t.Fatalf("found no commented optional setting to switch on:\n%s", yaml)
	}
	sources, err = parse(uncommented)
	if err != nil {
		t.Fatalf("README's sources file with its optional settings: %v\n%s", err, uncommented)
	}
	acme = sources["acme"]
	if acme.Account != "br-1" || acme.MaxBodyBytes != 1048576 || acme.PaymentKey("pay_1") != "acme:br-1:pay_1" {
		t.Errorf("acme with options = %+v, payment key %q", acme, acme.PaymentKey("pay_1"))
	}
}

// TestExampleSourcesFile: the file `make run` uses loads.
func TestExampleSourcesFile(t *testing.T) {
	t.Parallel()
	sources, err := source.Load(filepath.Join("..", "..", "deploy", "sources.example.yaml"), drivers.Factories())
	if err != nil {
		t.Fatal(err)
	}
	if sources["acme"] == nil || sources["acme"].DriverName != "standardwebhooks" {
		t.Errorf("sources = %v, want acme on standardwebhooks", sources)
	}
}

// TestSecretReferences: env:NAME and file:PATH resolve to the secret (a
// file's trailing newline trimmed), alongside literal secrets, in order.
func TestSecretReferences(t *testing.T) {
	const fromEnv = "whsec_ZW52LXNlY3JldC1mb3ItdGVzdHM="  // base64("env-secret-for-tests")
	const fromFile = "whsec_ZmlsZS1zZWNyZXQtZm9yLXRlc3Rz" // base64("file-secret-for-tests")
	t.Setenv("PAYSTREAM_TEST_SOURCE_SECRET", fromEnv)
	path := filepath.Join(t.TempDir(), "secret")
	if err := os.WriteFile(path, []byte(fromFile+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	sources := mustParse(t, `
sources:
  - name: acme
    driver: standardwebhooks
    secrets: ["env:PAYSTREAM_TEST_SOURCE_SECRET", "file:`+path+`", "`+readmeSecret+`"]
`)
	got := sources["acme"].Secrets
	if want := []string{fromEnv, fromFile, readmeSecret}; strings.Join(got, " ") != strings.Join(want, " ") {
		t.Fatalf("secrets = %q, want %q", got, want)
	}
	// Each verifies: rotation means any configured secret is accepted.
	for _, s := range got {
		if err := sources["acme"].Driver.Verify(signedRequest(t, s)); err != nil {
			t.Errorf("request signed with secret %d rejected: %v", len(s), err)
		}
	}
}

// TestErrors: each mistake in a sources file is refused with an error that
// names the source and the field at fault, and never carries a secret —
// not even when the mistake is in the secrets themselves.
func TestErrors(t *testing.T) {
	const secret = "whsec_c2VjcmV0LXRoYXQtbXVzdC1ub3QtbGVhaw==" // base64("secret-that-must-not-leak")
	const shortSecret = "hunter2"
	t.Setenv("PAYSTREAM_TEST_EMPTY_SECRET", "")
	emptyFile := filepath.Join(t.TempDir(), "empty")
	if err := os.WriteFile(emptyFile, []byte("\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	ok := `  - name: good
    driver: standardwebhooks
    secrets: ["` + secret + `"]
`
	cases := []struct {
		name  string
		yaml  string
		want  []string // substrings of the error
		leaks []string // what must not appear in it
	}{
		{"unknown driver", `
  - name: acme
    driver: standardwebhookz
    secrets: ["` + secret + `"]`, []string{`source "acme"`, "driver", "standardwebhookz", "standardwebhooks"}, nil},
		{"missing driver", `
  - name: acme
    secrets: ["` + secret + `"]`, []string{`source "acme"`, "driver is required"}, nil},
		{"bad name", `
  - name: Acme Payments
    driver: standardwebhooks
    secrets: ["` + secret + `"]`, []string{`source "Acme Payments"`, "name"}, nil},
		{"missing name", `
  - driver: standardwebhooks
    secrets: ["` + secret + `"]`, []string{"sources[1]", "name"}, nil},
		{"duplicate name", `
  - name: good
    driver: standardwebhooks
    secrets: ["` + secret + `"]`, []string{`source "good"`, "name"}, nil},
		{"unknown key", `
  - name: acme
    driver: standardwebhooks
    secret: ["` + secret + `"]`, []string{`source "acme"`, "secret"}, nil},
		{"unknown key before the name", `
  - tolerence: 5m
    name: acme
    driver: standardwebhooks
    secrets: ["` + secret + `"]`, []string{`source "acme"`, "tolerence"}, nil},
		{"empty secret", `
  - name: acme
    driver: standardwebhooks
    secrets: [""]`, []string{`source "acme"`, "secrets[0]", "empty"}, nil},
		{"no secrets", `
  - name: acme
    driver: standardwebhooks`, []string{`source "acme"`, "Secrets"}, nil},
		{"missing env var", `
  - name: acme
    driver: standardwebhooks
    secrets: ["` + secret + `", "env:PAYSTREAM_TEST_UNSET_SECRET_VAR"]`, []string{`source "acme"`, "secrets[1]", "PAYSTREAM_TEST_UNSET_SECRET_VAR"}, nil},
		{"empty env var", `
  - name: acme
    driver: standardwebhooks
    secrets: ["env:PAYSTREAM_TEST_EMPTY_SECRET"]`, []string{`source "acme"`, "secrets[0]", "PAYSTREAM_TEST_EMPTY_SECRET"}, nil},
		{"missing secret file", `
  - name: acme
    driver: standardwebhooks
    secrets: ["file:/nonexistent/paystream-secret"]`, []string{`source "acme"`, "secrets[0]", "/nonexistent/paystream-secret"}, nil},
		{"empty secret file", `
  - name: acme
    driver: standardwebhooks
    secrets: ["file:` + emptyFile + `"]`, []string{`source "acme"`, "secrets[0]", "empty"}, nil},
		{"secret the driver refuses", `
  - name: acme
    driver: standardwebhooks
    secrets: ["whsec_!!` + strings.TrimPrefix(secret, "whsec_") + `"]`, []string{`source "acme"`, "Secrets[0]"}, []string{"!!" + strings.TrimPrefix(secret, "whsec_")[:8]}},
		{"secret without the driver's prefix", `
  - name: acme
    driver: standardwebhooks
    secrets: ["` + shortSecret + `"]`, []string{`source "acme"`, "Secrets[0]"}, []string{shortSecret}},
		{"secrets as a string, not a list", `
  - name: acme
    driver: standardwebhooks
    secrets: ` + secret, []string{`source "acme"`, "secrets"}, []string{strings.TrimPrefix(secret, "whsec_")[:4]}},
		{"short secret as a string, not a list", `
  - name: acme
    driver: standardwebhooks
    secrets: ` + shortSecret, []string{`source "acme"`, "secrets"}, []string{shortSecret}},
		{"secrets as a map", `
  - name: acme
    driver: standardwebhooks
    secrets: {key: ` + shortSecret + `}`, []string{`source "acme"`, "secrets"}, []string{shortSecret}},
		{"key given twice", `
  - name: acme
    driver: standardwebhooks
    secrets: ["` + secret + `"]
    driver: stripe`, []string{`source "acme"`, "driver given twice"}, nil},
		{"secret list item not a string", `
  - name: acme
    driver: standardwebhooks
    secrets: [{key: ` + shortSecret + `}]`, []string{`source "acme"`, "secrets[0]"}, []string{shortSecret}},
		{"bad tolerance", `
  - name: acme
    driver: standardwebhooks
    secrets: ["` + secret + `"]
    tolerance: soon`, []string{`source "acme"`, "tolerance", "soon"}, nil},
		{"negative max_body_bytes", `
  - name: acme
    driver: standardwebhooks
    secrets: ["` + secret + `"]
    max_body_bytes: -1`, []string{`source "acme"`, "max_body_bytes"}, nil},
		{"max_body_bytes not a number", `
  - name: acme
    driver: standardwebhooks
    secrets: ["` + secret + `"]
    max_body_bytes: lots`, []string{`source "acme"`, "max_body_bytes"}, nil},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			doc := "sources:\n" + ok + strings.TrimPrefix(tc.yaml, "\n") + "\n"
			_, err := parse(doc)
			if err == nil {
				t.Fatalf("accepted:\n%s", doc)
			}
			msg := err.Error()
			for _, w := range tc.want {
				if !strings.Contains(msg, w) {
					t.Errorf("error %q does not mention %q", msg, w)
				}
			}
			for _, leak := range append([]string{secret, strings.TrimPrefix(secret, "whsec_")}, tc.leaks...) {
				if strings.Contains(msg, leak) {
					t.Errorf("error %q contains secret material %q", msg, leak)
				}
			}
		})
	}
}

// TestAnchorsAndMergeKeys: YAML anchors, aliases and merge keys work as
// they do with yaml's own decoding: a source may inherit another's settings
// and override some.
func TestAnchorsAndMergeKeys(t *testing.T) {
	t.Parallel()
	sources := mustParse(t, `
sources:
  - &base
    name: acme
    driver: standardwebhooks
    secrets: &secrets ["`+readmeSecret+`"]
    max_body_bytes: 2048
  - <<: *base
    name: acme-br
    account: br-1
  - name: other
    driver: standardwebhooks
    secrets: *secrets
`)
	br, other := sources["acme-br"], sources["other"]
	if len(sources) != 3 || br == nil || other == nil {
		t.Fatalf("sources = %v, want acme, acme-br and other", sources)
	}
	if br.DriverName != "standardwebhooks" || br.Account != "br-1" || br.MaxBodyBytes != 2048 || len(br.Secrets) != 1 {
		t.Errorf("acme-br = %+v, want acme's settings with account br-1", br)
	}
	if len(other.Secrets) != 1 || other.Secrets[0] != readmeSecret {
		t.Errorf("other's secrets through an alias = %d secrets", len(other.Secrets))
	}
}

func TestFileErrors(t *testing.T) {
	t.Parallel()
	if _, err := source.Load(filepath.Join(t.TempDir(), "missing.yaml"), drivers.Factories()); err == nil || !strings.Contains(err.Error(), "missing.yaml") {
		t.Errorf("missing file: %v, want an error naming it", err)
	}
	for _, doc := range []string{"", "sources: []\n", "sources:\n", "other: 1\n", "sources: [\n", "sources: acme\n", "- acme\n",
		"sources: []\nsources: []\n"} {
		if _, err := parse(doc); err == nil {
			t.Errorf("%q accepted", doc)
		}
	}
}
