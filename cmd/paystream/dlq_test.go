package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/paystream/paystream/internal/dlq"
	"github.com/paystream/paystream/internal/dlq/dlqtest"
	"github.com/paystream/paystream/internal/testenv"
)

// TestDLQCommands drives `paystream dlq` as an operator would, on DLQ
// records written by a real ingest: list (table and --json, filters), show
// (no body without --body, no secret ever, by position and by event id),
// replay refused while the driver still fails, a dry run that writes
// nothing, the replay after the fix, and a second replay refused.
func TestDLQCommands(t *testing.T) {
	t.Parallel()
	brokers := testenv.Kafka(t)
	raw, dlqTopic := testenv.Topic(t, "raw", 3), testenv.Topic(t, "dlq", 2)
	replays := "replays-" + strings.TrimPrefix(testenv.Group(t), "g-")
	t.Cleanup(func() {
		cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...))
		if err == nil {
			_, _ = kadm.NewClient(cl).DeleteTopics(t.Context(), replays)
			cl.Close()
		}
	})
	in := dlqtest.Start(t, brokers, raw, dlqTopic)
	longID := dlqtest.LongID("gh_delivery")
	ghBody := dlqtest.PaidBody("payment.paid", "pay_gh_secretive", 990)
	in.PostHMAC(t, longID, ghBody)
	in.PostStandard(t, "msg_settled", dlqtest.PaidBody("payment.settled", "pay_1", 1050))

	dir := t.TempDir()
	stock, fixed := filepath.Join(dir, "stock.yaml"), filepath.Join(dir, "fixed.yaml")
	if err := os.WriteFile(stock, []byte(dlqtest.SourcesYAML), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(fixed, []byte(dlqtest.FixedSourcesYAML), 0o600); err != nil {
		t.Fatal(err)
	}
	env := []string{"PAYSTREAM_KAFKA_BROKERS=" + strings.Join(brokers, ","), "PAYSTREAM_DLQ_TOPIC=" + dlqTopic,
		"PAYSTREAM_RAW_TOPIC=" + raw, "PAYSTREAM_DLQ_REPLAYS_TOPIC=" + replays}
	ok := func(args ...string) string {
		t.Helper()
		start := time.Now()
		r := paystream.Run(t, env, args...)
		t.Logf("paystream %.40s: %s", strings.Join(args, " "), time.Since(start))
		if r.Code != 0 {
			t.Fatalf("paystream %s: exit %d\nstdout:\n%s\nstderr:\n%s", strings.Join(args, " "), r.Code, r.Stdout, r.Stderr)
		}
		if strings.Contains(r.Stdout+r.Stderr, dlqtest.HMACSecret) || strings.Contains(r.Stdout+r.Stderr, dlqtest.Secret) {
			t.Fatalf("paystream %s printed a source secret", strings.Join(args, " "))
		}
		return r.Stdout
	}

	type item struct {
		Partition int32           `json:"partition"`
		Offset    int64           `json:"offset"`
		Source    string          `json:"source"`
		EventID   string          `json:"event_id"`
		Reason    string          `json:"reason"`
		Replayed  json.RawMessage `json:"replayed"`
	}
	list := func(args ...string) map[string]item {
		t.Helper()
		out := map[string]item{}
		sc := bufio.NewScanner(strings.NewReader(ok(append([]string{"dlq", "list", "--json"}, args...)...)))
		for sc.Scan() {
			var it item
			if err := json.Unmarshal(sc.Bytes(), &it); err != nil {
				t.Fatalf("dlq list --json line %q: %v", sc.Text(), err)
			}
			out[it.Source] = it
		}
		return out
	}
	items := list()
	gh, acme := items["gh"], items["acme"]
	if len(items) != 2 || gh.EventID != longID || !strings.Contains(gh.Reason, "too long") || !strings.Contains(acme.Reason, "unknown type") || gh.Replayed != nil {
		t.Fatalf("dlq list --json: %+v", items)
	}
	if got := list("--source", "gh", "--since", "1h", "--reason", "TOO LONG"); len(got) != 1 || got["gh"].EventID != longID {
		t.Errorf("dlq list with filters: %+v, want the gh record", got)
	}
	pos := func(it item) string { return fmt.Sprintf("%d/%d", it.Partition, it.Offset) }
	table := ok("dlq", "list", "--source", "acme")
	if !strings.Contains(table, pos(acme)) || !strings.Contains(table, "msg_settled") || strings.Contains(table, "gh_delivery") {
		t.Errorf("dlq list --source acme:\n%s", table)
	}

	show := ok("dlq", "show", pos(gh))
	for _, want := range []string{"source", "gh (driver hmac)", "Webhook-Id: " + longID, "too long", "sha256", "--body prints it"} {
		if !strings.Contains(show, want) {
			t.Errorf("dlq show does not say %q:\n%s", want, show)
		}
	}
	if !regexp.MustCompile(`(?m)^\s+replayed\s+no$`).MatchString(show) {
		t.Errorf("dlq show does not say the record was not replayed:\n%s", show)
	}
	if strings.Contains(show, "pay_gh_secretive") {
		t.Errorf("dlq show printed the body without --body:\n%s", show)
	}
	if body := ok("dlq", "show", pos(gh), "--body"); !strings.Contains(body, ghBody) {
		t.Errorf("dlq show --body does not print the body:\n%s", body)
	}
	var shown struct {
		Partition int32  `json:"partition"`
		Offset    int64  `json:"offset"`
		Reason    string `json:"reason"`
		Body      []byte `json:"body"`
	}
	if err := json.Unmarshal([]byte(ok("dlq", "show", "--event-id", "msg_settled", "--json")), &shown); err != nil ||
		shown.Partition != acme.Partition || shown.Offset != acme.Offset || shown.Body != nil {
		t.Errorf("dlq show --event-id msg_settled --json: %+v (%v), want %s and no body", shown, err, pos(acme))
	}

	rawCount := func() int64 {
		t.Helper()
		cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...))
		if err != nil {
			t.Fatal(err)
		}
		defer cl.Close()
		ends, err := kadm.NewClient(cl).ListEndOffsets(t.Context(), raw)
		if err != nil {
			t.Fatal(err)
		}
		var n int64
		ends.Each(func(o kadm.ListedOffset) { n += o.Offset })
		return n
	}

	if r := paystream.Run(t, env, "dlq", "replay", pos(gh), "--sources", stock); r.Code == 0 || !strings.Contains(r.Stderr, "still unprocessable") {
		t.Errorf("replay with the stock sources: exit %d, stderr %s; want a failure saying it is still unprocessable", r.Code, r.Stderr)
	}
	if out := ok("dlq", "replay", pos(gh), "--sources", fixed, "--dry-run"); !strings.Contains(out, "dry run") || !strings.Contains(out, "gh:pay_gh_secretive") {
		t.Errorf("dry run: %s", out)
	}
	if n := rawCount(); n != 0 {
		t.Fatalf("after a refused replay and a dry run the raw topic has %d records, want 0", n)
	}
	if out := ok("dlq", "replay", "--event-id", longID, "--sources", fixed); !strings.Contains(out, "replayed dlq record "+pos(gh)) {
		t.Errorf("replay: %s", out)
	}
	if n := rawCount(); n != 1 {
		t.Fatalf("after the replay the raw topic has %d records, want 1", n)
	}
	if r := paystream.Run(t, env, "dlq", "replay", pos(gh), "--sources", fixed); r.Code == 0 || !strings.Contains(r.Stderr, "already replayed") {
		t.Errorf("second replay: exit %d, stderr %s; want a refusal", r.Code, r.Stderr)
	}
	if n := rawCount(); n != 1 {
		t.Errorf("after the refused second replay the raw topic has %d records, want 1", n)
	}
	if got := list("--source", "gh"); got["gh"].Replayed == nil {
		t.Errorf("dlq list does not show the replay: %+v", got)
	}
	if show := ok("dlq", "show", pos(gh)); !strings.Contains(show, "dedup key") {
		t.Errorf("dlq show does not show the replay:\n%s", show)
	}
}

// TestScanProgress: off a terminal, a progress line at most every 5 s of
// the (fake) clock, none for a short scan; on one, a line rewritten in
// place and cleared at the end.
func TestScanProgress(t *testing.T) {
	t.Parallel()
	now := time.Unix(0, 0)
	clock := func() time.Time { return now }
	var plain bytes.Buffer
	report, done := scanProgress(&plain, false, "dlq list", clock)
	for i := range 12 {
		now = now.Add(time.Second)
		report(dlq.Progress{Scanned: int64(i+1) * 100, Total: 1200, Matched: i})
	}
	done()
	lines := strings.Split(strings.TrimSpace(plain.String()), "\n")
	if len(lines) != 2 || lines[0] != "dlq list: scanned 500 of 1200 offsets (42%), 4 matched, 5s" {
		t.Errorf("plain progress over 12 s: %q, want 2 lines, the first at 5 s", lines)
	}
	var tty bytes.Buffer
	report, done = scanProgress(&tty, true, "dlq list", clock)
	now = now.Add(time.Second)
	report(dlq.Progress{Scanned: 1, Total: 2})
	done()
	if got := tty.String(); got != "\r\x1b[Kdlq list: scanned 1 of 2 offsets (50%), 0 matched, 1s\r\x1b[K" {
		t.Errorf("terminal progress: %q", got)
	}
	var short bytes.Buffer
	report, done = scanProgress(&short, false, "dlq list", clock)
	report(dlq.Progress{Scanned: 2, Total: 2})
	done()
	if short.Len() != 0 {
		t.Errorf("a scan shorter than the interval printed %q", short.String())
	}
}

func TestParseSince(t *testing.T) {
	t.Parallel()
	now := time.Date(2026, 11, 29, 18, 0, 0, 0, time.UTC)
	for in, want := range map[string]time.Time{
		"":                     {},
		"24h":                  now.Add(-24 * time.Hour),
		"2026-11-28T10:00:00Z": time.Date(2026, 11, 28, 10, 0, 0, 0, time.UTC),
	} {
		if got, err := parseSince(in, now); err != nil || !got.Equal(want) {
			t.Errorf("parseSince(%q) = %v, %v; want %v", in, got, err, want)
		}
	}
	for _, bad := range []string{"yesterday", "-1h", "2026-11-28"} {
		if _, err := parseSince(bad, now); err == nil {
			t.Errorf("parseSince(%q) accepted", bad)
		}
	}
}
