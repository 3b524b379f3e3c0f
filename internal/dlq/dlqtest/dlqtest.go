// Package dlqtest puts real dead-lettered webhooks on a test topic: it runs
// paystream's ingest on the test broker and posts authentic webhooks that
// their source's driver cannot parse, so tests read DLQ records written by
// ingest's own code path.
package dlqtest

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/paystream/paystream/ingest"
	"github.com/paystream/paystream/internal/provider/drivers"
	"github.com/paystream/paystream/internal/provider/standardwebhooks"
	"github.com/paystream/paystream/internal/source"
)

// Secrets of the test sources.
const (
	Secret     = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
	HMACSecret = "hmac-secret-dlqtest"
)

// sourcesHead is the sources file of SourcesYAML and FixedSourcesYAML up
// to the end of the "gh" source's options, which close with "}".
const sourcesHead = `
sources:
  - name: acme
    driver: standardwebhooks
    secrets: ["` + Secret + `"]
  - name: gh
    driver: hmac
    secrets: ["` + HMACSecret + `"]
    options: {header: X-Signature, algorithm: sha256, encoding: hex`

// SourcesYAML configures two sources: "acme" (standardwebhooks) and "gh"
// (hmac, event id from the kept Webhook-Id header: an id longer than 255
// bytes is dead-lettered).
const SourcesYAML = sourcesHead + ", id_header: Webhook-Id}\n"

// FixedSourcesYAML is SourcesYAML after a fix of the "gh" source: its event
// ids no longer come from Webhook-Id, so the records dead-lettered for a
// too long id now parse (with a business key).
const FixedSourcesYAML = sourcesHead + "}\n"

// Sources parses a sources file's text with paystream's drivers.
func Sources(t testing.TB, yaml string) map[string]*source.Source {
	t.Helper()
	s, err := source.Parse([]byte(yaml), drivers.Factories())
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// Ingest is a running ingest writing to a test's raw and DLQ topics.
type Ingest struct {
	URL string
}

// Start runs ingest with SourcesYAML on brokers, producing to raw and dlq,
// until the test ends.
func Start(t testing.TB, brokers []string, raw, dlq string) *Ingest {
	t.Helper()
	srv, err := ingest.New(ingest.Config{
		Sources: Sources(t, SourcesYAML), Brokers: brokers, Topic: raw, DLQTopic: dlq,
		Registerer: prometheus.NewRegistry(),
		Logger:     slog.New(slog.NewTextHandler(t.Output(), nil)),
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Close)
	hs := httptest.NewServer(srv.Handler())
	t.Cleanup(hs.Close)
	return &Ingest{URL: hs.URL}
}

// PostStandard posts body to the "acme" source, signed with id, and fails
// the test unless ingest answers 200.
func (in *Ingest) PostStandard(t testing.TB, id, body string) {
	t.Helper()
	now := time.Now()
	sig, err := standardwebhooks.Sign(Secret, id, now, []byte(body))
	if err != nil {
		t.Fatal(err)
	}
	in.post(t, "acme", body, map[string]string{
		"Webhook-Id": id, "Webhook-Timestamp": strconv.FormatInt(now.Unix(), 10), "Webhook-Signature": sig,
	})
}

// PostHMAC posts body to the "gh" source with the Webhook-Id id, signed,
// and fails the test unless ingest answers 200.
func (in *Ingest) PostHMAC(t testing.TB, id, body string) {
	t.Helper()
	m := hmac.New(sha256.New, []byte(HMACSecret))
	m.Write([]byte(body))
	in.post(t, "gh", body, map[string]string{"Webhook-Id": id, "X-Signature": hex.EncodeToString(m.Sum(nil))})
}

func (in *Ingest) post(t testing.TB, src, body string, headers map[string]string) {
	t.Helper()
	req, err := http.NewRequestWithContext(t.Context(), http.MethodPost, in.URL+"/webhooks/"+src, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	for k, v := range headers {
		req.Header.Set(k, v)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	answer, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("POST /webhooks/%s: %d %s", src, resp.StatusCode, answer)
	}
}

// LongID is a webhook id longer than paystream's 255-byte limit on ids, but
// kept whole by ingest (it keeps header values up to 1 KiB): the "gh"
// source dead-letters it, the fixed one does not read it.
func LongID(tag string) string {
	return tag + "-" + strings.Repeat("x", 300)
}

// PaidBody is a Standard Webhooks convention body of type typ.
func PaidBody(typ, paymentID string, amount int64) string {
	return `{"type":"` + typ + `","timestamp":"2026-11-29T18:00:00Z","data":{"payment_id":"` + paymentID +
		`","amount":` + strconv.FormatInt(amount, 10) + `,"currency":"BRL"}}`
}
