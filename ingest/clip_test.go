package ingest

import (
	"net/http"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/paystream/paystream/internal/envelope"
)

// TestEnvelopeClipsLongHeadersAndReason: kept header values and the DLQ
// reason longer than the envelope's limits are cut at a UTF-8 boundary,
// identically by the fast encoder and by Marshal, so the record stays
// within envelope.MaxOverheadBytes of its body's base64.
func TestEnvelopeClipsLongHeadersAndReason(t *testing.T) {
	t.Parallel()
	long := "a" + strings.Repeat("é", 2000) // 2-byte runes, odd offset: the cut falls mid-rune
	f := envelopeFields{
		source: "sw", driver: "standardwebhooks", paymentKey: "sw:unknown",
		receivedAt: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC),
		header:     http.Header{"User-Agent": {long}, "X-Request-Id": {"short"}},
		body:       []byte(`{}`),
		reason:     long,
	}
	checkEncoding(t, "long", f)
	r := f.raw()
	for _, v := range []string{r.Headers["User-Agent"], r.Reason} {
		if len(v) > envelope.MaxHeaderValueBytes || len(v) < envelope.MaxHeaderValueBytes-1 || !utf8.ValidString(v) {
			t.Errorf("clipped to %d bytes (valid UTF-8 %v), want at most %d, whole runes", len(v), utf8.ValidString(v), envelope.MaxHeaderValueBytes)
		}
	}
	if r.Headers["X-Request-Id"] != "short" {
		t.Errorf("short header changed: %q", r.Headers["X-Request-Id"])
	}
}
