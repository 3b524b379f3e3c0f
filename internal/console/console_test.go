package console_test

import (
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/paystream/paystream/internal/console"
	"github.com/paystream/paystream/internal/dlq/dlqtest"
	"github.com/paystream/paystream/internal/testenv"
)

// inOrder fails unless each of want appears in s after the one before.
func inOrder(t *testing.T, s string, want ...string) {
	t.Helper()
	pos := 0
	for _, w := range want {
		i := strings.Index(s[pos:], w)
		if i < 0 {
			t.Errorf("%q not found after offset %d (or not at all)", w, pos)
			return
		}
		pos += i + len(w)
	}
}

func TestPaymentPageTellsTheStory(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{readOnly: true})
	b.seedPaidAndRefunded(t)
	b.seedHeld(t) // must not leak into pay_1's page

	code, _, page := b.get(t, "/payment?key="+url.QueryEscape("acme:pay_1"))
	if code != http.StatusOK {
		t.Fatalf("GET payment: %d\n%s", code, page)
	}
	// Status and amount, in major units with thousands grouped.
	inOrder(t, page, `id="status">partially_refunded<`, "id=\"amount\">1\u2009050.00 BRL<")
	// Deliveries in arrival order with their outcomes and reasons.
	inOrder(t, page, "evt_created", "processed", "evt_authorized", "processed", "evt_paid", "processed",
		"evt_paid", "ignored", "duplicate_event", "evt_pending_late", "ignored", "stale", "evt_refund", "processed")
	// The four transitions in version order, each with its state event id.
	inOrder(t, page, `id="transitions"`,
		"(new) → pending", "acme:pay_1:1",
		"pending → authorized", "acme:pay_1:2",
		"authorized → paid", "1\u2009050.00 BRL", "acme:pay_1:3",
		"paid → partially_refunded", "50.00 BRL", "re_1", "acme:pay_1:4")
	inOrder(t, page, `id="ledger"`, "gateway_receivable", "merchant_payable", "1\u2009050.00 BRL", "merchant_payable", "gateway_receivable", "50.00 BRL")
	if strings.Contains(page, "pay_held") || strings.Contains(page, "evt_held") {
		t.Error("pay_1's page shows another payment's rows")
	}
	// Bodies are off by default: the kept body's size shows, not its text.
	if strings.Contains(page, "4242") {
		t.Error("a delivery body is shown without ShowBodies")
	}
}

func TestPaymentPageShowsBodiesOnlyWhenConfigured(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{cfg: func(c *console.Config) { c.ShowBodies = true }})
	b.seedPaidAndRefunded(t)
	_, _, page := b.get(t, "/payment?key=acme:pay_1")
	if !strings.Contains(page, "card_last4&#34;:&#34;4242") {
		t.Errorf("ShowBodies: the paid delivery's body is not shown (escaped)")
	}
}

func TestPaymentDeliveriesPageByKeyset(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{cfg: func(c *console.Config) { c.PageSize = 4 }})
	b.seedPaidAndRefunded(t)
	_, _, first := b.get(t, "/payment?key=acme:pay_1")
	next := regexp.MustCompile(`id="next" href="([^"]+)"`).FindStringSubmatch(first)
	if next == nil {
		t.Fatal("6 deliveries at 4 a page: no link to the next page")
	}
	inOrder(t, first, "evt_created", "evt_authorized", "evt_paid", "evt_paid")
	if strings.Contains(first, "evt_pending_late") {
		t.Error("first page shows the fifth delivery")
	}
	_, _, second := b.get(t, strings.ReplaceAll(next[1], "&amp;", "&"))
	inOrder(t, second, "evt_pending_late", "evt_refund")
	if strings.Contains(second, "evt_created") || strings.Contains(second, `id="next"`) {
		t.Error("second page repeats the first or links further")
	}
}

func TestSearchFindsPaymentsByEveryKindOfID(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{readOnly: true})
	b.seedPaidAndRefunded(t)
	b.seedHeld(t)
	payPage := "/payment?key=" + url.QueryEscape("acme:pay_1")
	for _, q := range []string{"acme:pay_1", "pay_1", "acme:pay_1:3", "evt_refund", " evt_paid "} {
		code, loc, body := b.get(t, "/?q="+url.QueryEscape(q))
		if code != http.StatusSeeOther || loc != payPage {
			t.Errorf("search %q: %d to %q, want 303 to %q\n%s", q, code, loc, payPage, body)
		}
	}
	// A webhook event id that is not its dedup key: found by the scan.
	b.exec(t, `INSERT INTO deliveries (id, recorded_at, source, dedup_key, event_id, event_type, payment_key, status, topic, partition, kafka_offset, received_at)
	           VALUES (nextval('deliveries_id_seq'), now(), 'acme', 'acme:business-key-7', 'evt_not_the_key', 'payment.paid', 'acme:pay_1', 'processed', 'raw', 0, 99, now())`)
	if code, loc, _ := b.get(t, "/?q=evt_not_the_key"); code != http.StatusSeeOther || loc != payPage {
		t.Errorf("search by an event id that is not its dedup key: %d to %q", code, loc)
	}
	// A version the payment never reached is not its state event id.
	if code, _, body := b.get(t, "/?q="+url.QueryEscape("acme:pay_1:9")); code != http.StatusOK || !strings.Contains(body, `id="nothing"`) {
		t.Errorf("search for a state event id that does not exist: %d, want the no-match page", code)
	}
	// One gateway id under two sources: both listed.
	b.exec(t, `INSERT INTO payments (payment_key, source, payment_id, status, version, state) VALUES ('other:pay_1', 'other', 'pay_1', 'paid', 1, '{}')`)
	b.exec(t, `INSERT INTO dedup_keys (source, dedup_key, delivery_id, recorded_at) VALUES ('other', 'x', 0, now())`)
	code, _, body := b.get(t, "/?q=pay_1")
	if code != http.StatusOK {
		t.Fatalf("ambiguous search: %d", code)
	}
	inOrder(t, body, `id="hits"`, "acme:pay_1", "gateway payment id", "other:pay_1", "gateway payment id")
	// A gateway id under an account, found by the scan.
	b.exec(t, `INSERT INTO payments (payment_key, source, payment_id, status, version, state) VALUES ('acme:acct_9:pay_9', 'acme', 'pay_9', 'paid', 1, '{}')`)
	if code, loc, _ := b.get(t, "/?q=pay_9"); code != http.StatusSeeOther || loc != "/payment?key="+url.QueryEscape("acme:acct_9:pay_9") {
		t.Errorf("search by a gateway id under an account: %d to %q", code, loc)
	}
	if code, _, body := b.get(t, "/payment?key=acme:nope"); code != http.StatusNotFound || !strings.Contains(body, "no payment") {
		t.Errorf("unknown payment: %d", code)
	}
}

func TestStuckPageShowsHeldQuarantinedAndDeferred(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{readOnly: true})
	b.seedPaidAndRefunded(t)
	b.seedHeld(t)
	b.seedDeliveries(t, delivery{payment: "acme:pay_3", eventID: "evt_3_refund", typ: "payment.refunded", status: "deferred",
		reason: "needs_predecessor", received: at.Add(-5 * time.Minute)})
	code, _, page := b.get(t, "/stuck")
	if code != http.StatusOK {
		t.Fatalf("GET /stuck: %d\n%s", code, page)
	}
	// now is at+2h: the hold is 3h old, the quarantined delivery too.
	inOrder(t, page, `id="held"`, "acme:pay_held", "currency_mismatch", "3h 0m", `<td class="num">1</td><td class="num">1</td>`)
	inOrder(t, page, `id="quarantined"`, "acme:pay_held", "evt_held_paid", "currency_mismatch", "3h 0m")
	inOrder(t, page, `id="deferred"`, "evt_held_refund", "payment_held", "2h 30m", "evt_3_refund", "needs_predecessor", "2h 5m")
	inOrder(t, page, `id="dlq-error"`, "Kafka is not configured")
	if strings.Contains(page, "evt_paid") {
		t.Error("a processed delivery is listed as stuck")
	}
	_, _, only := b.get(t, "/stuck/deferred?reason=needs_predecessor")
	if !strings.Contains(only, "evt_3_refund") || strings.Contains(only, "evt_held_refund") {
		t.Error("/stuck/deferred?reason=needs_predecessor does not filter by reason")
	}
}

func TestStuckListsPageByKeysetOldestFirst(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{cfg: func(c *console.Config) { c.PageSize = 2 }})
	var ds []delivery
	// Two at the same instant: the id breaks the tie across the page.
	for i, age := range []time.Duration{5, 4, 3, 3, 1} {
		ds = append(ds, delivery{payment: fmt.Sprintf("acme:q%d", i), eventID: fmt.Sprintf("evt_q%d", i), typ: "payment.paid",
			status: "quarantined", reason: fmt.Sprintf("reason_%d", i), received: at.Add(-age * time.Hour)})
	}
	b.seedDeliveries(t, ds...)
	var seen []string
	path := "/stuck/quarantined"
	for pages := 0; path != ""; pages++ {
		if pages > 5 {
			t.Fatal("pagination does not end")
		}
		code, _, page := b.get(t, path)
		if code != http.StatusOK {
			t.Fatalf("GET %s: %d\n%s", path, code, page)
		}
		seen = append(seen, regexp.MustCompile(`evt_q\d`).FindAllString(page, -1)...)
		path = ""
		if m := regexp.MustCompile(`href="(/stuck/quarantined\?after=[^"]+)"`).FindStringSubmatch(page); m != nil {
			path = strings.ReplaceAll(m[1], "&amp;", "&")
		}
	}
	if got, want := strings.Join(seen, " "), "evt_q0 evt_q1 evt_q2 evt_q3 evt_q4"; got != want {
		t.Errorf("quarantined pages, oldest first: %s, want %s", got, want)
	}
}

func TestAuthentication(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{})
	for _, tc := range []struct {
		name string
		prep func(*http.Request)
		want int
	}{
		{"no credentials", nil, http.StatusUnauthorized},
		{"wrong password", func(r *http.Request) { r.SetBasicAuth(testUser, "hunter2") }, http.StatusUnauthorized},
		{"unknown user", func(r *http.Request) { r.SetBasicAuth("mallory", testPassword) }, http.StatusUnauthorized},
		{"right password", func(r *http.Request) { r.SetBasicAuth(testUser, testPassword) }, http.StatusOK},
	} {
		code, _, body := b.do(t, http.MethodGet, "/stuck", tc.prep)
		if code != tc.want {
			t.Errorf("%s: %d, want %d", tc.name, code, tc.want)
		}
		if code == http.StatusUnauthorized && strings.Contains(body, "Held payments") {
			t.Errorf("%s: refused, but the page was rendered", tc.name)
		}
	}
	err := testutil.GatherAndCompare(b.reg, strings.NewReader(`
# HELP paystream_console_requests_total Console requests by page (search, payment, stuck, health, ...) and HTTP status code; 401 counts refused credentials.
# TYPE paystream_console_requests_total counter
paystream_console_requests_total{code="200",page="stuck"} 1
paystream_console_requests_total{code="401",page="auth"} 3
`), "paystream_console_requests_total")
	if err != nil {
		t.Error(err)
	}
	// Probes need no credentials and say nothing.
	if code, _, body := b.do(t, http.MethodGet, "/healthz", nil); code != http.StatusOK || body != "ok\n" {
		t.Errorf("/healthz: %d %q", code, body)
	}

	hb := setup(t, setupOpts{cfg: func(c *console.Config) { c.Auth = console.Auth{Header: "X-Forwarded-User"} }})
	for _, tc := range []struct {
		name   string
		remote string
		user   string
		want   int
	}{
		{"proxy on loopback", "127.0.0.1:40000", "ana@example.com", http.StatusOK},
		{"proxy without the header", "127.0.0.1:40000", "", http.StatusUnauthorized},
		{"header from elsewhere", "192.0.2.7:40000", "ana@example.com", http.StatusUnauthorized},
	} {
		code, _, body := hb.do(t, http.MethodGet, "/", func(r *http.Request) {
			r.RemoteAddr = tc.remote
			if tc.user != "" {
				r.Header.Set("X-Forwarded-User", tc.user)
			}
		})
		if code != tc.want {
			t.Errorf("header auth, %s: %d, want %d", tc.name, code, tc.want)
		}
		if code == http.StatusOK && !strings.Contains(body, "signed in as ana@example.com") {
			t.Errorf("header auth: the page does not name the user")
		}
	}

	if _, err := console.New(b.db.Pool, console.Config{}); !errors.Is(err, console.ErrNoAuth) {
		t.Errorf("New without auth: %v, want ErrNoAuth", err)
	}
}

func TestNothingWrites(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{readOnly: true})
	for _, m := range []string{http.MethodPost, http.MethodPut, http.MethodDelete, http.MethodPatch} {
		code, _, _ := b.do(t, m, "/payment?key=acme:pay_1", func(r *http.Request) { r.SetBasicAuth(testUser, testPassword) })
		if code != http.StatusMethodNotAllowed {
			t.Errorf("%s: %d, want 405", m, code)
		}
	}
	code, _, page := b.get(t, "/")
	if code != http.StatusOK || strings.Contains(page, `method="post"`) || strings.Contains(page, "<script") {
		t.Errorf("search page: %d; it must have no POST form and no script", code)
	}
}

// setupHealth is a console on a raw topic of 2 partitions holding 4 and 3
// records, whose group stored offset 3 of partition 0 (90 s before the
// console's clock minus 2h) and nothing of partition 1: lags 1 and 3.
func setupHealth(t *testing.T) (*bundle, string) {
	t.Helper()
	brokers := testenv.Kafka(t)
	raw := testenv.Topic(t, "console-raw", 2)
	group := testenv.Group(t)
	b := setup(t, setupOpts{readOnly: true, cfg: func(c *console.Config) {
		c.Brokers, c.RawTopic, c.Group, c.DLQTopic = brokers, raw, group, testenv.Topic(t, "console-dlq", 1)
	}})
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.RecordPartitioner(kgo.ManualPartitioner()))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	for i := range 7 {
		r := &kgo.Record{Topic: raw, Partition: int32(i % 2), Value: []byte("x")}
		if err := cl.ProduceSync(t.Context(), r).FirstErr(); err != nil {
			t.Fatal(err)
		}
	}
	b.exec(t, `INSERT INTO consumer_offsets (group_id, topic, partition, next_offset, owner_epoch, updated_at) VALUES ($1, $2, 0, 3, 7, $3)`,
		group, raw, at.Add(-90*time.Second))
	return b, group
}

func TestHealthPage(t *testing.T) {
	t.Parallel()
	b, _ := setupHealth(t)
	code, _, page := b.get(t, "/health")
	if code != http.StatusOK {
		t.Fatalf("GET /health: %d\n%s", code, page)
	}
	cells := func(s string) string { return regexp.MustCompile(`<[^>]+>|\s+`).ReplaceAllString(s, " ") }
	text := cells(page)
	inOrder(t, text, "partition", " 0 ", " 7 ", " 3 ", " 4 ", " 1 ", "2026-11-29 17:58:30.000Z", "(2h 1m ago)", // now is at+2h
		" 1 ", " - ", " 0 ", " - ", " 3 ", " 3 ", "never", "total lag", " 4 ")
	if strings.Contains(page, `id="kafka-error"`) {
		t.Errorf("Kafka error on the health page: %s", page[strings.Index(page, `id="kafka-error"`):][:200])
	}
	// No relay ran on this schema: its slot is missing, and said so.
	inOrder(t, page, `id="slot"`, "paystream_", "missing")
	// Migration 004 made today's partition and two days ahead (of the real
	// clock; the console's is fixed in 2026).
	inOrder(t, page, `id="retention"`, "daily partitions of deliveries")
}

func TestStuckPageListsDeadLetteredWebhooksWithTheirReplayCommand(t *testing.T) {
	t.Parallel()
	brokers := testenv.Kafka(t)
	raw, dlqTopic := testenv.Topic(t, "console-raw", 1), testenv.Topic(t, "console-dlq", 1)
	in := dlqtest.Start(t, brokers, raw, dlqTopic)
	in.PostStandard(t, "msg_settled", dlqtest.PaidBody("payment.settled", "pay_42", 1050))
	b := setup(t, setupOpts{cfg: func(c *console.Config) {
		c.Brokers, c.RawTopic, c.DLQTopic, c.SourcesFile = brokers, raw, dlqTopic, "/etc/paystream/sources.yaml"
		c.Now = time.Now
	}})
	code, _, page := b.get(t, "/stuck")
	if code != http.StatusOK {
		t.Fatalf("GET /stuck: %d\n%s", code, page)
	}
	want := "paystream dlq replay 0/0 --dlq-topic " + dlqTopic + " --raw-topic " + raw + " --sources /etc/paystream/sources.yaml"
	inOrder(t, page, `id="dlq"`, "0/0", "acme", "msg_settled", want)
	if strings.Contains(page, "pay_42") {
		t.Error("the DLQ section shows the webhook's body")
	}
}
