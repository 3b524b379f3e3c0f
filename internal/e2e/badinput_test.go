package e2e

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/paystream/paystream/internal/envelope"
	"github.com/paystream/paystream/internal/lab/loadgen"
	"github.com/paystream/paystream/internal/provider/asaas"
	"github.com/paystream/paystream/internal/provider/hmac"
	"github.com/paystream/paystream/internal/provider/mercadopago"
	"github.com/paystream/paystream/internal/provider/pagarme"
	"github.com/paystream/paystream/internal/provider/pagbank"
	"github.com/paystream/paystream/internal/provider/standardwebhooks"
	"github.com/paystream/paystream/internal/provider/stripe"
	"github.com/paystream/paystream/internal/testenv"
	"github.com/paystream/paystream/schemas"
)

// Secrets of the bad-input corpus's sources, one source per driver. They
// must never show up in a record or in ingest's logs.
var badInputSecrets = map[string]string{
	"sw": testSecret,
	"st": "whsec_badinput_stripe_5n3Kq8vT",
	"hm": "badinput-hmac-secret-2c9e",
	"pm": "sk_test_badinput_pagarme_4471",
	"as": "badinput-asaas-token-7e21",
	"pb": "BADINPUT-PAGBANK-TOKEN-0A1B2C3D",
	"mp": "badinput-mp-secret-93f0",
}

// badInputDrivers is each corpus source's driver.
var badInputDrivers = map[string]string{
	"sw": "standardwebhooks", "st": "stripe", "hm": "hmac", "pm": "pagarme",
	"as": "asaas", "pb": "pagbank", "mp": "mercadopago",
}

const (
	badInputHMACHeader   = "X-Hub-Signature-256"
	badInputHMACIDHeader = "X-GitHub-Delivery"
	badInputMaxBody      = 1 << 20 // every source's max_body_bytes: the default
)

func badInputSourcesYAML() string {
	var b strings.Builder
	b.WriteString("sources:\n")
	for _, name := range []string{"sw", "st", "hm", "pm", "as", "pb", "mp"} {
		fmt.Fprintf(&b, "  - name: %s\n    driver: %s\n    secrets: [%q]\n", name, badInputDrivers[name], badInputSecrets[name])
		if name == "hm" {
			fmt.Fprintf(&b, "    options: {header: %s, algorithm: sha256, prefix: \"sha256=\", encoding: hex, id_header: %s}\n",
				badInputHMACHeader, badInputHMACIDHeader)
		}
	}
	return b.String()
}

// fate is where a webhook must end up.
type fate int

const (
	nowhere fate = iota // on neither topic
	onRaw               // on the raw topic, once
	onDLQ               // on the DLQ topic, once, with a reason
)

func (f fate) String() string {
	return [...]string{"nowhere", "raw", "DLQ"}[f]
}

// badRequest is one request of the corpus: an HTTP request, or raw bytes
// written on a fresh connection when raw is set.
type badRequest struct {
	source  string // the source whose canary follows the case
	method  string // POST when empty
	path    string // /webhooks/{source} when empty; sent as written
	query   url.Values
	header  http.Header
	body    []byte
	chunked bool   // sent with Transfer-Encoding: chunked
	raw     []byte // when set, the whole request as written on the wire
	// halfClose sends the request on a connection of its own and then
	// closes the connection's write side (shutdown(SHUT_WR)), as some
	// clients do once the request is out, still reading the answer.
	halfClose bool
}

// badCase is one bad input and the answer README's "HTTP answers" table
// gives it.
type badCase struct {
	name   string
	driver string // the driver of the source posted to
	req    badRequest
	status int
	fate   fate
	reason string // for onDLQ: a substring of the DLQ record's reason ("" = any)
}

// TestBadInputCorpus sends a corpus of bad requests — for every driver:
// malformed, hostile or forged bodies under valid signatures, missing,
// garbled, replayed and misapplied signatures; and at the HTTP layer:
// oversize and chunked bodies, header floods, slow clients, wrong methods,
// odd source names, request-smuggling framings — to the real `paystream
// ingest` binary on the real broker, and checks each one's answer against
// README's "HTTP answers" table. A 200 for an authentic but unprocessable
// body must have put exactly that body on the DLQ (with a reason) and
// nothing on the raw topic; every other rejected request must have put
// nothing anywhere. After each case the process must still answer /healthz,
// and a valid webhook of the same source must be answered 200 and be on the
// raw topic. Two slow clients (slow headers, slow body) run during the whole
// corpus: the server's timeouts must cut both. Records carry no secret, and
// ingest logs none, nor a race or a panic.
func TestBadInputCorpus(t *testing.T) {
	testenv.SkipIfShort(t)
	eachHTTPServer(t, func(t *testing.T, server string) {
		start := time.Now()
		brokers := testenv.Kafka(t)
		raw, dlq := testenv.Topic(t, "raw", 3), testenv.Topic(t, "dlq", 1)
		ing := startBadInputIngest(t, brokers, raw, dlq, server)

		now := time.Now()
		g := &badInputGen{t: t, now: now}
		cases := badInputCases(g)
		canaries := newCanaries(t, g)
		checkUniqueBodies(t, cases)

		// The slow clients run while the corpus runs: each holds one
		// connection (and, for the body, one admitted request) the whole time.
		slow := []*slowClient{
			startSlowClient(ing.addr, "slow headers (one header byte every 200ms)",
				"POST /webhooks/sw HTTP/1.1\r\nHost: ingest\r\nX-Slow: ", 'a'),
			startSlowClient(ing.addr, "slow body (one byte every 200ms, Content-Length 100000)",
				"POST /webhooks/sw HTTP/1.1\r\nHost: ingest\r\nContent-Type: application/json\r\nContent-Length: 100000\r\n\r\n{", ' '),
		}

		client := &http.Client{Timeout: 30 * time.Second}
		got := make([]int, len(cases))
		gotErr := make([]string, len(cases))
		corpusStart := time.Now()
		for i, c := range cases {
			got[i], gotErr[i] = sendBad(client, ing.base, ing.addr, c.req)
			if got[i] != c.status || gotErr[i] != "" {
				t.Errorf("%s (%s): answer %d%s, want %s", c.name, c.driver, got[i], gotErr[i], wantAnswer(c.status))
			}
			// The process is still up and the source still takes webhooks.
			if code, err := getStatus(client, ing.base+"/healthz"); code != http.StatusOK {
				t.Fatalf("after %s: /healthz answered %d (%v): ingest is down", c.name, code, err)
			}
			if code, err := canaries.post(client, ing.base, c.req.source, c.name); code != http.StatusOK {
				t.Errorf("after %s: a valid %s webhook answered %d (%v), want 200", c.name, c.req.source, code, err)
			}
		}
		corpusTook := time.Since(corpusStart)

		// Both slow clients are cut by the server, not by this test's bound.
		for _, s := range slow {
			s.wait(45 * time.Second)
			switch {
			case !s.ended:
				t.Errorf("%s: connection still open after %s: the server's timeouts did not cut it", s.name, s.after.Round(time.Millisecond))
			case s.status != 0 && s.status != http.StatusBadRequest && s.status != http.StatusRequestTimeout:
				t.Errorf("%s: answered %d %q, want the connection closed, 400 or 408: the webhook was never read whole", s.name, s.status, s.answer)
			}
		}
		if code, err := getStatus(client, ing.base+"/healthz"); code != http.StatusOK {
			t.Fatalf("after the slow clients: /healthz answered %d (%v)", code, err)
		}
		if code, err := canaries.post(client, ing.base, "sw", "the slow clients"); code != http.StatusOK {
			t.Errorf("after the slow clients: a valid webhook answered %d (%v), want 200", code, err)
		}

		// What landed where.
		rawBodies := readTopicBodies(t, brokers, raw, schemas.RawEnvelope)
		dlqBodies := readTopicBodies(t, brokers, dlq, schemas.DLQRecord)
		fates := make([]string, len(cases))
		for i, c := range cases {
			k := recordKey(c.req.source, c.req.body)
			r, d := rawBodies[k], dlqBodies[k]
			fates[i] = describeFate(r, d)
			delete(rawBodies, k)
			delete(dlqBodies, k)
			want := map[fate][2]int{nowhere: {0, 0}, onRaw: {1, 0}, onDLQ: {0, 1}}[c.fate]
			if len(r) != want[0] || len(d) != want[1] {
				t.Errorf("%s (%s): %s, want %s", c.name, c.driver, fates[i], c.fate)
				continue
			}
			if c.fate == onDLQ {
				env := d[0]
				if env.Reason == "" || !strings.Contains(env.Reason, c.reason) {
					t.Errorf("%s: DLQ reason %q, want one containing %q", c.name, env.Reason, c.reason)
				}
				if env.PaymentKey != c.req.source+":unknown" || env.Driver != c.driver {
					t.Errorf("%s: DLQ record payment key %q, driver %q; want %s:unknown, %s", c.name, env.PaymentKey, env.Driver, c.req.source, c.driver)
				}
			}
			if c.fate == onRaw && c.driver == "mercadopago" && !r[0].Event.NeedsRefetch {
				t.Errorf("%s: a Mercado Pago event (unsigned body) on the raw topic without needs_refetch", c.name)
			}
		}
		for _, cn := range canaries.sent {
			k := recordKey(cn.source, cn.body)
			if n := len(rawBodies[k]); n != 1 || len(dlqBodies[k]) != 0 {
				t.Errorf("canary after %s (%s): %s, want raw", cn.after, cn.source, describeFate(rawBodies[k], dlqBodies[k]))
			}
			delete(rawBodies, k)
			delete(dlqBodies, k)
		}
		for k, envs := range rawBodies {
			t.Errorf("raw topic: %d record(s) of %s matching no case expected there (body %.80q)", len(envs), envs[0].Source, k)
		}
		for k, envs := range dlqBodies {
			t.Errorf("DLQ topic: %d record(s) of %s matching no case expected there (body %.80q, reason %q)", len(envs), envs[0].Source, k, envs[0].Reason)
		}

		// Logs: no secret, no race, no panic.
		logs := ing.Output.String()
		for name, secret := range badInputSecrets {
			if strings.Contains(logs, secret) {
				t.Errorf("ingest's logs contain source %s's secret", name)
			}
		}
		for _, bad := range []string{"DATA RACE", "panic:", "goroutine "} {
			if strings.Contains(logs, bad) {
				t.Errorf("ingest's logs contain %q", bad)
			}
		}
		if err := ing.Exited(); err != nil {
			t.Errorf("ingest exited during the corpus: %v", err)
		}

		outcomes := requestOutcomes(t, client, ing.base)

		// The report.
		perDriver := map[string]int{}
		var table strings.Builder
		fmt.Fprintf(&table, "%-3s %-17s %-62s %-16s %s\n", "#", "driver", "case", "want", "got")
		for i, c := range cases {
			perDriver[c.driver]++
			fmt.Fprintf(&table, "%-3d %-17s %-62s %-16s %s\n", i+1, c.driver, c.name,
				fmt.Sprintf("%d %s", c.status, c.fate), fmt.Sprintf("%d %s%s", got[i], fates[i], gotErr[i]))
		}
		for _, s := range slow {
			fmt.Fprintf(&table, "%-3s %-17s %-62s %-16s %s\n", "-", "standardwebhooks", s.name, "cut by server",
				fmt.Sprintf("status %d %q, ended %v after %s", s.status, s.answer, s.ended, s.after.Round(time.Millisecond)))
		}
		t.Logf("bad-input corpus: %d cases + %d slow clients, %d canaries; cases per driver %v\n%s",
			len(cases), len(slow), len(canaries.sent), perDriver, table.String())
		t.Logf("ingest's paystream_ingest_requests_total by outcome: %v", outcomes)
		t.Logf("corpus sent in %s; whole test %s", corpusTook.Round(time.Millisecond), time.Since(start).Round(time.Millisecond))
	})
}

// wantAnswer describes the answer wanted with status.
func wantAnswer(status int) string {
	if status == http.StatusOK {
		return `200 {"received":true}`
	}
	return strconv.Itoa(status)
}

// requestOutcomes sums ingest's paystream_ingest_requests_total by outcome,
// as its /metrics shows them.
func requestOutcomes(t *testing.T, client *http.Client, base string) map[string]float64 {
	t.Helper()
	resp, err := client.Get(base + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	out := map[string]float64{}
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		m := outcomeLine.FindStringSubmatch(sc.Text())
		if m == nil {
			continue
		}
		v, err := strconv.ParseFloat(m[2], 64)
		if err != nil {
			t.Fatalf("metrics line %q: %v", sc.Text(), err)
		}
		out[m[1]] += v
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

var outcomeLine = regexp.MustCompile(`^paystream_ingest_requests_total\{.*outcome="([a-z_]+)".*\} (\S+)$`)

// badInputGen makes the corpus's bodies and signatures; every id it hands
// out is unique within the test.
type badInputGen struct {
	t   *testing.T
	now time.Time
	n   int
}

func (g *badInputGen) next() int { g.n++; return g.n }

func (g *badInputGen) ts() string { return g.now.UTC().Format(time.RFC3339) }

// conv is a processable body of paystream's convention (standardwebhooks,
// hmac) with a fresh payment id; amount is the JSON text of data.amount.
func (g *badInputGen) conv(amount string) []byte {
	return fmt.Appendf(nil, `{"type":"payment.paid","timestamp":%q,"data":{"payment_id":"pay_bi_%d","amount":%s,"currency":"BRL"}}`,
		g.ts(), g.next(), amount)
}

// stripeBody is a payment_intent event with a fresh id; amount is the JSON
// text of amount_received.
func (g *badInputGen) stripeBody(typ, amount string) []byte {
	n := g.next()
	return fmt.Appendf(nil, `{"id":"evt_bi_%d","object":"event","created":%d,"type":%q,"data":{"object":{"id":"pi_bi_%d","object":"payment_intent","amount":1050,"amount_received":%s,"currency":"brl","status":"succeeded"}}}`,
		n, g.now.Unix(), typ, n, amount)
}

// pagarmeBody is a charge.paid hook with a fresh id; paidAmount is the JSON
// text of data.paid_amount.
func (g *badInputGen) pagarmeBody(paidAmount string) []byte {
	n := g.next()
	return fmt.Appendf(nil, `{"id":"hook_bi_%d","type":"charge.paid","created_at":%q,"data":{"id":"ch_bi_%d","amount":1050,"paid_amount":%s,"status":"paid","currency":"BRL","payment_method":"pix"}}`,
		n, g.ts(), n, paidAmount)
}

// asaasBody is an Asaas event with a fresh id; paymentID is the JSON text
// of payment.id (a fresh one when empty), value that of payment.value.
func (g *badInputGen) asaasBody(event, paymentID, value string) []byte {
	n := g.next()
	if paymentID == "" {
		paymentID = fmt.Sprintf(`"pay_bi_%d"`, n)
	}
	return fmt.Appendf(nil, `{"id":"evt_bi_%d","event":%q,"dateCreated":"2026-01-02 10:00:00","payment":{"object":"payment","id":%s,"value":%s,"billingType":"PIX","status":"CONFIRMED"}}`,
		n, event, paymentID, value)
}

// pagbankBody is a paid PagBank charge with a fresh id; paid is the JSON
// text of amount.summary.paid, the amount of a paid charge.
func (g *badInputGen) pagbankBody(paid string) []byte {
	return fmt.Appendf(nil, `{"id":"CHAR_BI-%d","status":"PAID","created_at":%q,"paid_at":%q,"amount":{"value":1050,"currency":"BRL","summary":{"total":1050,"paid":%s,"refunded":0}},"payment_method":{"type":"PIX"}}`,
		g.next(), g.ts(), g.ts(), paid)
}

// mpBody is a Mercado Pago notification about payment pid.
func (g *badInputGen) mpBody(typ, pid string) []byte {
	return fmt.Appendf(nil, `{"action":"payment.updated","api_version":"v1","data":{"id":%q},"date_created":"2026-01-02T10:00:00.000Z","id":%d,"live_mode":false,"type":%q,"user_id":"0"}`,
		pid, 30000000000+g.next(), typ)
}

// mpID is a fresh Mercado Pago payment id (digits).
func (g *badInputGen) mpID() string { return fmt.Sprintf("9%08d", g.next()) }

// signed returns a request carrying body to source, signed at `at` the way
// the source's gateway signs, with the source's secret.
func (g *badInputGen) signed(source string, body []byte, at time.Time) badRequest {
	return g.signedWith(source, badInputSecrets[source], body, at)
}

// signedWith is signed with another secret. For mercadopago, whose
// signature covers the query's data.id and not the body, data.id is the
// body's data.id.
func (g *badInputGen) signedWith(source, secret string, body []byte, at time.Time) badRequest {
	g.t.Helper()
	h := http.Header{"Content-Type": {"application/json"}, "User-Agent": {"paystream-badinput"}}
	r := badRequest{source: source, header: h, body: body}
	switch source {
	case "sw":
		id := fmt.Sprintf("msg_bi_%d", g.next())
		sig, err := standardwebhooks.Sign(secret, id, at, body)
		if err != nil {
			g.t.Fatal(err)
		}
		h.Set(standardwebhooks.HeaderID, id)
		h.Set(standardwebhooks.HeaderTimestamp, strconv.FormatInt(at.Unix(), 10))
		h.Set(standardwebhooks.HeaderSignature, sig)
	case "st":
		h.Set(stripe.HeaderSignature, stripe.Sign(secret, at, body))
	case "hm":
		sig, err := hmac.Sign(secret, "sha256", "sha256=", "hex", body)
		if err != nil {
			g.t.Fatal(err)
		}
		h.Set(badInputHMACHeader, sig)
		h.Set(badInputHMACIDHeader, fmt.Sprintf("bi-delivery-%d", g.next()))
	case "pm":
		h.Set(pagarme.HeaderSignature, pagarme.Sign(secret, body))
	case "as":
		h.Set(asaas.HeaderToken, asaas.Sign(secret))
	case "pb":
		h.Set(pagbank.HeaderSignature, pagbank.Sign(secret, body))
	case "mp":
		var n struct {
			Data struct {
				ID string `json:"id"`
			} `json:"data"`
		}
		_ = json.Unmarshal(body, &n) // a malformed body: data.id stays empty, set the query yourself
		r.query = url.Values{mercadopago.QueryDataID: {n.Data.ID}, "type": {"payment"}}
		reqID := fmt.Sprintf("bi-request-%d", g.next())
		h.Set(mercadopago.HeaderRequestID, reqID)
		h.Set(mercadopago.HeaderSignature, mercadopago.Sign(secret, n.Data.ID, reqID, at))
	default:
		g.t.Fatalf("no source %q in the corpus", source)
	}
	return r
}

// mpSignedFor is a Mercado Pago request whose query (the signed part)
// names pid, whatever the body says.
func (g *badInputGen) mpSignedFor(pid string, body []byte, at time.Time) badRequest {
	r := g.signed("mp", body, at)
	reqID := r.header.Get(mercadopago.HeaderRequestID)
	r.query.Set(mercadopago.QueryDataID, pid)
	r.header.Set(mercadopago.HeaderSignature, mercadopago.Sign(badInputSecrets["mp"], pid, reqID, at))
	return r
}

// with returns r changed by f (on a copy of its header).
func with(r badRequest, f func(r *badRequest)) badRequest {
	r.header = r.header.Clone()
	f(&r)
	return r
}

// rawHTTP is a request as written on the wire: the request line, the
// headers given and Host, then body as is.
func rawHTTP(path string, headers []string, body []byte) []byte {
	var b bytes.Buffer
	fmt.Fprintf(&b, "POST %s HTTP/1.1\r\nHost: ingest\r\n", path)
	for _, h := range headers {
		b.WriteString(h + "\r\n")
	}
	b.WriteString("\r\n")
	b.Write(body)
	return b.Bytes()
}

// nested is n '[' then n ']'.
func nested(n int) string { return strings.Repeat("[", n) + strings.Repeat("]", n) }

// badInputCases is the corpus. Expected answers follow README's "HTTP
// answers": 200 + DLQ for authentic but unprocessable bodies, 200 kept
// nowhere for authentic bodies asserting no payment fact, 401 for anything
// not authentic, 404 for an unknown source, 413 over max_body_bytes, and
// net/http's own answers below the handler (405, 431, 400, 501).
func badInputCases(g *badInputGen) []badCase {
	now := g.now
	old, future := now.Add(-10*time.Minute), now.Add(10*time.Minute)
	dlq := func(driver, name string, r badRequest, reason string) badCase {
		return badCase{name: name, driver: driver, req: r, status: http.StatusOK, fate: onDLQ, reason: reason}
	}
	reject := func(driver, name string, r badRequest, status int) badCase {
		return badCase{name: name, driver: driver, req: r, status: status, fate: nowhere}
	}
	accept := func(driver, name string, r badRequest) badCase {
		return badCase{name: name, driver: driver, req: r, status: http.StatusOK, fate: onRaw}
	}
	sw := func(body []byte) badRequest { return g.signed("sw", body, now) }
	const (
		SW, ST, HM, PM, AS, PB, MP = "standardwebhooks", "stripe", "hmac", "pagarme", "asaas", "pagbank", "mercadopago"
		tooDeep                    = "nested too deep"
		dup                        = "duplicate key"
		badAmount                  = "bad amount"
	)
	truncated := g.conv("1050")
	truncated = truncated[:len(truncated)-9]
	zeros := base64.StdEncoding.EncodeToString(make([]byte, 32))
	validSW := sw(g.conv("1050"))
	seventeen := with(validSW, func(r *badRequest) {
		r.header.Set(standardwebhooks.HeaderSignature, strings.Repeat("v1,"+zeros+" ", 16)+r.header.Get(standardwebhooks.HeaderSignature))
	})
	pad := func(n int, b byte) []byte { return bytes.Repeat([]byte{b}, n) }
	manyHeaders := with(sw(g.conv("1050")), func(r *badRequest) {
		for i := range 300 {
			r.header.Set(fmt.Sprintf("X-Pad-%03d", i), "some-value-of-an-ordinary-length")
		}
	})
	var flood []string
	for i := range 2000 {
		flood = append(flood, fmt.Sprintf("X-Flood-%04d: %s", i, strings.Repeat("f", 30)))
	}
	stBody := g.stripeBody("payment_intent.succeeded", "1050")
	pbBody := g.pagbankBody("1050")
	pbUnhyphenated := sha256.Sum256(append([]byte(badInputSecrets["pb"]), pbBody...))
	mpNUL := g.mpID()

	return []badCase{
		// standardwebhooks: authentic but unprocessable bodies → 200 + DLQ.
		dlq(SW, "truncated JSON", sw(truncated), "truncated JSON"),
		dlq(SW, "duplicate top-level key type (paid, refunded)", sw(fmt.Appendf(nil,
			`{"type":"payment.paid","type":"payment.refunded","timestamp":%q,"data":{"payment_id":"pay_bi_%d","amount":1050,"currency":"BRL"}}`, g.ts(), g.next())), dup),
		dlq(SW, "duplicate nested key data.amount (1, 999999)", sw(fmt.Appendf(nil,
			`{"type":"payment.paid","timestamp":%q,"data":{"payment_id":"pay_bi_%d","amount":1,"amount":999999,"currency":"BRL"}}`, g.ts(), g.next())), dup),
		dlq(SW, "invalid UTF-8 in payment_id", sw(fmt.Appendf(nil,
			"{\"type\":\"payment.paid\",\"timestamp\":%q,\"data\":{\"payment_id\":\"pay_bi_%d_\xff\xfe\",\"amount\":1050,\"currency\":\"BRL\"}}", g.ts(), g.next())), "not valid UTF-8"),
		dlq(SW, `escaped NUL \u0000 in payment_id`, sw(fmt.Appendf(nil,
			`{"type":"payment.paid","timestamp":%q,"data":{"payment_id":"pay_bi_%d\u0000x","amount":1050,"currency":"BRL"}}`, g.ts(), g.next())), "control characters"),
		dlq(SW, "raw NUL byte inside a JSON string", sw(fmt.Appendf(nil,
			"{\"type\":\"payment.paid\",\"timestamp\":%q,\"data\":{\"payment_id\":\"pay_bi_%d\x00\",\"amount\":1050,\"currency\":\"BRL\"}}", g.ts(), g.next())), "malformed JSON"),
		dlq(SW, "amount 2^53 (above the largest fact amount)", sw(g.conv("9007199254740992")), badAmount),
		dlq(SW, "amount 1e400", sw(g.conv("1e400")), badAmount),
		dlq(SW, "amount 2^63 (overflows int64)", sw(g.conv("9223372036854775808")), badAmount),
		dlq(SW, "negative amount -1050", sw(g.conv("-1050")), badAmount),
		dlq(SW, "amount -0", sw(g.conv("-0")), badAmount),
		dlq(SW, "fractional amount 10.5 (minor units are integers)", sw(g.conv("10.5")), badAmount),
		accept(SW, "31 nested arrays in an extra field (32 levels: the limit)", sw(fmt.Appendf(nil,
			`{"type":"payment.paid","timestamp":%q,"meta":%s,"data":{"payment_id":"pay_bi_%d","amount":1050,"currency":"BRL"}}`, g.ts(), nested(31), g.next()))),
		dlq(SW, "32 nested arrays in an extra field (33 levels)", sw(fmt.Appendf(nil,
			`{"type":"payment.paid","timestamp":%q,"meta":%s,"data":{"payment_id":"pay_bi_%d","amount":1050,"currency":"BRL"}}`, g.ts(), nested(32), g.next())), tooDeep),
		dlq(SW, "empty body", sw(nil), "empty body"),
		dlq(SW, "body null", sw([]byte("null")), "not a JSON object"),
		// standardwebhooks: not authentic → 401.
		reject(SW, "timestamp 10 min old (replay)", g.signed("sw", g.conv("1050"), old), http.StatusUnauthorized),
		reject(SW, "timestamp 10 min in the future", g.signed("sw", g.conv("1050"), future), http.StatusUnauthorized),
		reject(SW, "valid signature over another body", with(sw(g.conv("1050")), func(r *badRequest) { r.body = g.conv("999999") }), http.StatusUnauthorized),
		reject(SW, "webhook-id changed after signing", with(sw(g.conv("1050")), func(r *badRequest) { r.header.Set(standardwebhooks.HeaderID, "msg_other") }), http.StatusUnauthorized),
		reject(SW, "signed with another secret", g.signedWith("sw", "whsec_"+zeros, g.conv("1050"), now), http.StatusUnauthorized),
		reject(SW, "no webhook-signature", with(sw(g.conv("1050")), func(r *badRequest) { r.header.Del(standardwebhooks.HeaderSignature) }), http.StatusUnauthorized),
		reject(SW, "garbled webhook-signature", with(sw(g.conv("1050")), func(r *badRequest) { r.header.Set(standardwebhooks.HeaderSignature, "v1,!!not*base64 ,,, v1") }), http.StatusUnauthorized),
		reject(SW, "non-numeric webhook-timestamp", with(sw(g.conv("1050")), func(r *badRequest) { r.header.Set(standardwebhooks.HeaderTimestamp, "1e9") }), http.StatusUnauthorized),
		reject(SW, "valid signature 17th of 17 (16 looked at)", seventeen, http.StatusUnauthorized),
		// standardwebhooks: sizes and framing.
		accept(SW, "300 extra small headers (under the header limit)", manyHeaders),
		accept(SW, "request then shutdown(SHUT_WR), answer still read", with(sw(g.conv("1050")), func(r *badRequest) { r.halfClose = true })),
		reject(SW, "chunked body of 1 MiB + 1", badRequest{source: "sw", body: pad(badInputMaxBody+1, ' '), chunked: true}, http.StatusRequestEntityTooLarge),
		reject(SW, "Content-Length body of 1 MiB + 1", badRequest{source: "sw", body: pad(badInputMaxBody+1, 'x')}, http.StatusRequestEntityTooLarge),
		reject(SW, "GET /webhooks/sw", badRequest{source: "sw", method: http.MethodGet}, http.StatusMethodNotAllowed),
		reject(SW, "PUT /webhooks/sw with a signed body", with(sw(g.conv("1050")), func(r *badRequest) { r.method = http.MethodPut }), http.StatusMethodNotAllowed),

		// Source names: a signed, processable webhook to the wrong path.
		reject(SW, "source ..%2fsw (traversal)", with(sw(g.conv("1050")), func(r *badRequest) { r.path = "/webhooks/..%2fsw" }), http.StatusNotFound),
		reject(SW, "source ..%2f..%2fhealthz", with(sw(g.conv("1050")), func(r *badRequest) { r.path = "/webhooks/..%2f..%2fhealthz" }), http.StatusNotFound),
		reject(SW, "path /webhooks/../webhooks/sw (dot segments)", with(sw(g.conv("1050")), func(r *badRequest) { r.path = "/webhooks/../webhooks/sw" }), http.StatusNotFound),
		reject(SW, "source sw%00 (NUL)", with(sw(g.conv("1050")), func(r *badRequest) { r.path = "/webhooks/sw%00" }), http.StatusNotFound),
		reject(SW, "source ação (unicode)", with(sw(g.conv("1050")), func(r *badRequest) { r.path = "/webhooks/ação" }), http.StatusNotFound),
		reject(SW, "source SW (case)", with(sw(g.conv("1050")), func(r *badRequest) { r.path = "/webhooks/SW" }), http.StatusNotFound),
		reject(SW, "source of 5000 letters", with(sw(g.conv("1050")), func(r *badRequest) { r.path = "/webhooks/" + strings.Repeat("s", 5000) }), http.StatusNotFound),
		reject(SW, "empty source /webhooks/", with(sw(g.conv("1050")), func(r *badRequest) { r.path = "/webhooks/" }), http.StatusNotFound),
		reject(SW, "source sw/ (trailing slash)", with(sw(g.conv("1050")), func(r *badRequest) { r.path = "/webhooks/sw/" }), http.StatusNotFound),

		// stripe.
		dlq(ST, "unknown type customer.created", g.signed("st", g.stripeBody("customer.created", "1050"), now), "unknown"),
		dlq(ST, "duplicate key data.object.amount_received", g.signed("st", bytes.Replace(g.stripeBody("payment_intent.succeeded", "1050"),
			[]byte(`"amount_received":1050`), []byte(`"amount_received":1050,"amount_received":5`), 1), now), dup),
		dlq(ST, "amount_received 20 digits", g.signed("st", g.stripeBody("payment_intent.succeeded", "99999999999999999999"), now), badAmount),
		dlq(ST, "negative amount_received", g.signed("st", g.stripeBody("payment_intent.succeeded", "-1050"), now), badAmount),
		dlq(ST, "invalid UTF-8 in the event id", g.signed("st", bytes.Replace(g.stripeBody("payment_intent.succeeded", "1050"),
			[]byte(`"evt_bi_`), []byte("\"evt_\xc3\x28bi_"), 1), now), "not valid UTF-8"),
		reject(ST, "t= 10 min old (replay)", g.signed("st", g.stripeBody("payment_intent.succeeded", "1050"), old), http.StatusUnauthorized),
		reject(ST, "t= only, no v1", with(g.signed("st", stBody, now), func(r *badRequest) {
			r.header.Set(stripe.HeaderSignature, "t="+strconv.FormatInt(now.Unix(), 10))
		}), http.StatusUnauthorized),
		reject(ST, "valid signature over another body", with(g.signed("st", g.stripeBody("payment_intent.succeeded", "1050"), now), func(r *badRequest) {
			r.body = g.stripeBody("payment_intent.succeeded", "999999")
		}), http.StatusUnauthorized),
		reject(ST, "signed with another secret", g.signedWith("st", "whsec_other", g.stripeBody("payment_intent.succeeded", "1050"), now), http.StatusUnauthorized),
		reject(ST, "DELETE /webhooks/st", with(g.signed("st", g.stripeBody("payment_intent.succeeded", "1050"), now), func(r *badRequest) { r.method = http.MethodDelete }), http.StatusMethodNotAllowed),
		reject(ST, "Transfer-Encoding: gzip, chunked", badRequest{source: "st", raw: rawHTTP("/webhooks/st",
			[]string{"Transfer-Encoding: gzip, chunked"}, []byte("5\r\nhello\r\n0\r\n\r\n"))}, http.StatusNotImplemented),

		// hmac.
		dlq(HM, "100000 nested arrays (200 KB)", g.signed("hm", fmt.Appendf(nil,
			`{"type":"payment.paid","timestamp":%q,"data":{"payment_id":"pay_bi_%d","amount":1050,"currency":"BRL"},"x":%s}`, g.ts(), g.next(), nested(100000)), now), tooDeep),
		dlq(HM, "duplicate key data.payment_id", g.signed("hm", fmt.Appendf(nil,
			`{"type":"payment.paid","timestamp":%q,"data":{"payment_id":"pay_bi_%d","payment_id":"pay_other","amount":1050,"currency":"BRL"}}`, g.ts(), g.next()), now), dup),
		dlq(HM, "no timestamp (required without a timestamp header)", g.signed("hm", fmt.Appendf(nil,
			`{"type":"payment.paid","data":{"payment_id":"pay_bi_%d","amount":1050,"currency":"BRL"}}`, g.next()), now), "timestamp"),
		dlq(HM, "trailing data after the object", g.signed("hm", append(g.conv("1050"), []byte(`{"type":"payment.refunded"}`)...), now), "trailing data"),
		reject(HM, "no signature header", with(g.signed("hm", g.conv("1050"), now), func(r *badRequest) { r.header.Del(badInputHMACHeader) }), http.StatusUnauthorized),
		reject(HM, "base64 signature where hex is configured", with(g.signed("hm", g.conv("1050"), now), func(r *badRequest) {
			s, _ := hmac.Sign(badInputSecrets["hm"], "sha256", "sha256=", "base64", r.body)
			r.header.Set(badInputHMACHeader, s)
		}), http.StatusUnauthorized),
		reject(HM, "valid signature over another body", with(g.signed("hm", g.conv("1050"), now), func(r *badRequest) { r.body = g.conv("999999") }), http.StatusUnauthorized),
		reject(HM, "one 100 KiB header", badRequest{source: "hm", raw: rawHTTP("/webhooks/hm",
			[]string{"X-Big: " + strings.Repeat("b", 100<<10), "Content-Length: 2"}, []byte("{}"))}, http.StatusRequestHeaderFieldsTooLarge),
		reject(HM, "2000 headers (90 KB)", badRequest{source: "hm", raw: rawHTTP("/webhooks/hm",
			append(flood, "Content-Length: 2"), []byte("{}"))}, http.StatusRequestHeaderFieldsTooLarge),
		reject(HM, "NUL byte in a header value", badRequest{source: "hm", raw: rawHTTP("/webhooks/hm",
			[]string{badInputHMACHeader + ": sha256=00\x00ff", "Content-Length: 2"}, []byte("{}"))}, http.StatusBadRequest),

		// pagarme.
		dlq(PM, "truncated JSON", g.signed("pm", func() []byte { b := g.pagarmeBody("1050"); return b[:len(b)/2] }(), now), "truncated JSON"),
		dlq(PM, "negative paid_amount", g.signed("pm", g.pagarmeBody("-1"), now), badAmount),
		dlq(PM, "paid_amount of 10000 digits", g.signed("pm", g.pagarmeBody(strings.Repeat("9", 10000)), now), badAmount),
		dlq(PM, "body is a JSON array", g.signed("pm", fmt.Appendf(nil, `[%s]`, g.pagarmeBody("1050")), now), "not a JSON object"),
		reject(PM, "no X-Hub-Signature", with(g.signed("pm", g.pagarmeBody("1050"), now), func(r *badRequest) { r.header.Del(pagarme.HeaderSignature) }), http.StatusUnauthorized),
		reject(PM, "sha256= signature where sha1= is expected", with(g.signed("pm", g.pagarmeBody("1050"), now), func(r *badRequest) {
			s, _ := hmac.Sign(badInputSecrets["pm"], "sha256", "sha256=", "hex", r.body)
			r.header.Set(pagarme.HeaderSignature, s)
		}), http.StatusUnauthorized),
		reject(PM, "valid signature over another body", with(g.signed("pm", g.pagarmeBody("1050"), now), func(r *badRequest) { r.body = g.pagarmeBody("999999") }), http.StatusUnauthorized),
		reject(PM, "PATCH /webhooks/pm", with(g.signed("pm", g.pagarmeBody("1050"), now), func(r *badRequest) { r.method = http.MethodPatch }), http.StatusMethodNotAllowed),

		// asaas: a static token; the body is not signed.
		dlq(AS, "value 10.505 (finer than centavos)", g.signed("as", g.asaasBody("PAYMENT_CONFIRMED", "", "10.505"), now), badAmount),
		dlq(AS, "negative value", g.signed("as", g.asaasBody("PAYMENT_CONFIRMED", "", "-10.50"), now), badAmount),
		dlq(AS, `escaped NUL \u0000 in payment.id`, g.signed("as", g.asaasBody("PAYMENT_CONFIRMED", fmt.Sprintf(`"pay_bi_%d\u0000"`, g.next()), "10.50"), now), "control characters"),
		dlq(AS, "duplicate key payment.value", g.signed("as", bytes.Replace(g.asaasBody("PAYMENT_CONFIRMED", "", "10.50"),
			[]byte(`"value":10.50`), []byte(`"value":10.50,"value":0.01`), 1), now), dup),
		badCase{name: "PAYMENT_UPDATED (no payment fact)", driver: AS, req: g.signed("as", g.asaasBody("PAYMENT_UPDATED", "", "10.50"), now),
			status: http.StatusOK, fate: nowhere},
		reject(AS, "no asaas-access-token", with(g.signed("as", g.asaasBody("PAYMENT_CONFIRMED", "", "10.50"), now), func(r *badRequest) { r.header.Del(asaas.HeaderToken) }), http.StatusUnauthorized),
		reject(AS, "wrong token", g.signedWith("as", "not-the-token", g.asaasBody("PAYMENT_CONFIRMED", "", "10.50"), now), http.StatusUnauthorized),
		accept(AS, "right token, any body (the token does not cover it)", with(g.signed("as", g.asaasBody("PAYMENT_CONFIRMED", "", "10.50"), now), func(r *badRequest) {
			r.body = g.asaasBody("PAYMENT_CONFIRMED", "", "9999.99")
		})),
		reject(AS, "Content-Length: abc", badRequest{source: "as", raw: rawHTTP("/webhooks/as", []string{"Content-Length: abc"}, []byte("{}"))}, http.StatusBadRequest),

		// pagbank.
		dlq(PB, "amount.summary.paid 2^63", g.signed("pb", g.pagbankBody("9223372036854775808"), now), badAmount),
		dlq(PB, "invalid UTF-8 (lone continuation byte)", g.signed("pb", bytes.Replace(g.pagbankBody("1050"), []byte(`"PIX"`), []byte("\"PIX\x80\""), 1), now), "not valid UTF-8"),
		dlq(PB, "duplicate key status (PAID, CANCELED)", g.signed("pb", bytes.Replace(g.pagbankBody("1050"),
			[]byte(`"status":"PAID"`), []byte(`"status":"PAID","status":"CANCELED"`), 1), now), dup),
		reject(PB, "no x-authenticity-token", with(g.signed("pb", g.pagbankBody("1050"), now), func(r *badRequest) { r.header.Del(pagbank.HeaderSignature) }), http.StatusUnauthorized),
		reject(PB, "SHA-256 of token+body without the hyphen", with(g.signed("pb", pbBody, now), func(r *badRequest) {
			r.header.Set(pagbank.HeaderSignature, hex.EncodeToString(pbUnhyphenated[:]))
		}), http.StatusUnauthorized),
		reject(PB, "valid signature over another body", with(g.signed("pb", g.pagbankBody("1050"), now), func(r *badRequest) { r.body = g.pagbankBody("999999") }), http.StatusUnauthorized),
		accept(PB, "chunked body within the limit", with(g.signed("pb", g.pagbankBody("1050"), now), func(r *badRequest) { r.chunked = true })),
		reject(PB, "two different Content-Lengths", badRequest{source: "pb", raw: rawHTTP("/webhooks/pb",
			[]string{"Content-Length: 2", "Content-Length: 40"}, []byte("{}"))}, http.StatusBadRequest),

		// mercadopago: the signature covers the query's data.id, not the body.
		dlq(MP, "truncated JSON", g.mpSignedFor(g.mpID(), []byte(`{"action":"payment.updated","data":{"id":"1`), now), "truncated JSON"),
		dlq(MP, "duplicate key action", g.signed("mp", bytes.Replace(g.mpBody("payment", g.mpID()),
			[]byte(`"action":"payment.updated"`), []byte(`"action":"payment.updated","action":"payment.created"`), 1), now), dup),
		dlq(MP, "NUL in the signed query data.id", g.mpSignedFor(mpNUL+"\x00", g.mpBody("payment", mpNUL), now), "control characters"),
		badCase{name: "merchant_order (no payment fact)", driver: MP, req: g.signed("mp", g.mpBody("merchant_order", g.mpID()), now),
			status: http.StatusOK, fate: nowhere},
		reject(MP, "no x-signature", with(g.signed("mp", g.mpBody("payment", g.mpID()), now), func(r *badRequest) { r.header.Del(mercadopago.HeaderSignature) }), http.StatusUnauthorized),
		reject(MP, "ts 10 min old (replay)", g.signed("mp", g.mpBody("payment", g.mpID()), old), http.StatusUnauthorized),
		reject(MP, "signature for another data.id", with(g.signed("mp", g.mpBody("payment", g.mpID()), now), func(r *badRequest) {
			r.query.Set(mercadopago.QueryDataID, g.mpID())
		}), http.StatusUnauthorized),
		accept(MP, "valid signature, another body (body unsigned: refetched)", with(g.signed("mp", g.mpBody("payment", g.mpID()), now), func(r *badRequest) {
			r.body = g.mpBody("payment", r.query.Get(mercadopago.QueryDataID)+"1")
		})),
	}
}

// checkUniqueBodies fails the test when two POSTs of the corpus carry the
// same source and body: where each landed is found by body.
func checkUniqueBodies(t *testing.T, cases []badCase) {
	t.Helper()
	seen := map[string]string{}
	for _, c := range cases {
		if c.req.raw != nil || c.req.method != "" && c.req.method != http.MethodPost {
			continue
		}
		k := recordKey(c.req.source, c.req.body)
		if other, ok := seen[k]; ok {
			t.Fatalf("cases %q and %q send the same body to %s: the corpus cannot tell where each landed", other, c.name, c.req.source)
		}
		seen[k] = c.name
	}
}

func recordKey(source string, body []byte) string { return source + "\x00" + string(body) }

func describeFate(raw, dlq []envelope.Raw) string {
	switch {
	case len(raw) == 0 && len(dlq) == 0:
		return "nowhere"
	case len(raw) == 1 && len(dlq) == 0:
		return "raw"
	case len(raw) == 0 && len(dlq) == 1:
		return fmt.Sprintf("DLQ (%s)", dlq[0].Reason)
	}
	return fmt.Sprintf("raw ×%d, DLQ ×%d", len(raw), len(dlq))
}

// sendBad sends r and returns the answer's status and, when something is
// wrong beyond the status (a transport error, a 200 whose body is not
// {"received":true}, a 405 without "Allow: POST"), what.
func sendBad(client *http.Client, base, addr string, r badRequest) (int, string) {
	if r.raw != nil {
		code, _, err := rawExchange(addr, r.raw, false)
		if err != nil {
			return code, " (" + err.Error() + ")"
		}
		return code, ""
	}
	req, err := r.httpRequest(base)
	if err != nil {
		return 0, " (" + err.Error() + ")"
	}
	if r.halfClose {
		var wire bytes.Buffer
		if err := req.Write(&wire); err != nil {
			return 0, " (" + err.Error() + ")"
		}
		code, answer, err := rawExchange(addr, wire.Bytes(), true)
		if err != nil {
			return code, " (" + err.Error() + ")"
		}
		if code == http.StatusOK && strings.TrimSpace(answer) != `{"received":true}` {
			return code, fmt.Sprintf(" (body %q)", answer)
		}
		return code, ""
	}
	resp, err := client.Do(req)
	if err != nil {
		return 0, " (" + err.Error() + ")"
	}
	defer resp.Body.Close()
	answer, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<10))
	if resp.StatusCode == http.StatusOK && strings.TrimSpace(string(answer)) != `{"received":true}` {
		return resp.StatusCode, fmt.Sprintf(" (body %q)", answer)
	}
	if resp.StatusCode == http.StatusMethodNotAllowed && resp.Header.Get("Allow") != http.MethodPost {
		return resp.StatusCode, fmt.Sprintf(" (Allow %q, want POST)", resp.Header.Get("Allow"))
	}
	return resp.StatusCode, ""
}

// httpRequest is r as an *http.Request to the ingest at base.
func (r badRequest) httpRequest(base string) (*http.Request, error) {
	method, path := r.method, r.path
	if method == "" {
		method = http.MethodPost
	}
	if path == "" {
		path = "/webhooks/" + r.source
	}
	u, err := url.Parse(base + path)
	if err != nil {
		return nil, err
	}
	u.RawQuery = r.query.Encode()
	var body io.Reader = bytes.NewReader(r.body)
	if r.chunked {
		body = io.MultiReader(body) // no length known: sent chunked
	}
	req, err := http.NewRequest(method, u.String(), body)
	if err != nil {
		return nil, err
	}
	if r.header != nil {
		req.Header = r.header.Clone()
	}
	if r.chunked {
		req.ContentLength, req.TransferEncoding = -1, []string{"chunked"}
	}
	return req, nil
}

// rawExchange writes req on a new connection, then closes the
// connection's write side if closeWrite, and returns the answer's status
// and (the start of its) body. It writes from another goroutine, so that an
// answer sent before the server read everything (431) is still read.
func rawExchange(addr string, req []byte, closeWrite bool) (int, string, error) {
	conn, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		return 0, "", err
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(20 * time.Second))
	go func() {
		if _, err := conn.Write(req); err == nil && closeWrite {
			_ = conn.(*net.TCPConn).CloseWrite()
		}
	}()
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		return 0, "", fmt.Errorf("no answer: %w", err)
	}
	defer resp.Body.Close()
	answer, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<10))
	return resp.StatusCode, string(answer), nil
}

func getStatus(client *http.Client, u string) (int, error) {
	resp, err := client.Get(u)
	if err != nil {
		return 0, err
	}
	resp.Body.Close()
	return resp.StatusCode, nil
}

// slowClient is a connection that sends head at once, then one byte every
// 200ms until the server ends the connection or the test gives up.
type slowClient struct {
	name string
	done chan struct{}

	// Set before done closes.
	ended  bool          // the server closed the connection (with or without an answer)
	status int           // the answer's status, 0 without one
	answer string        // the start of the answer's body
	after  time.Duration // from the first byte sent to the end
}

func startSlowClient(addr, name, head string, drip byte) *slowClient {
	s := &slowClient{name: name, done: make(chan struct{})}
	conn, err := net.Dial("tcp", addr)
	if err != nil {
		close(s.done)
		return s
	}
	start := time.Now()
	stop := make(chan struct{})
	go func() {
		defer close(s.done)
		defer conn.Close()
		defer close(stop)
		_ = conn.SetReadDeadline(start.Add(45 * time.Second))
		resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
		s.after = time.Since(start)
		var ne net.Error
		switch {
		case err == nil:
			s.ended, s.status = true, resp.StatusCode
			b, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<10))
			s.answer = string(b)
		case errors.As(err, &ne) && ne.Timeout():
		default:
			s.ended = true // closed without an answer
		}
	}()
	go func() {
		if _, err := io.WriteString(conn, head); err != nil {
			return
		}
		tick := time.NewTicker(200 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-stop:
				return
			case <-tick.C:
				if _, err := conn.Write([]byte{drip}); err != nil {
					return
				}
			}
		}
	}()
	return s
}

// wait waits for the slow client to end, at most bound more.
func (s *slowClient) wait(bound time.Duration) {
	select {
	case <-s.done:
	case <-time.After(bound):
	}
}

// canaries posts valid webhooks (built by the load generator's builders,
// each with the driver package's Sign) and remembers them.
type canaries struct {
	builders map[string]*loadgen.Builder
	now      time.Time
	next     int
	sent     []canary
}

type canary struct {
	source, after string
	body          []byte
}

func newCanaries(t *testing.T, g *badInputGen) *canaries {
	t.Helper()
	srcs, err := loadgen.ParseSources([]byte(badInputSourcesYAML()))
	if err != nil {
		t.Fatal(err)
	}
	c := &canaries{builders: map[string]*loadgen.Builder{}, now: g.now}
	for _, s := range srcs {
		b, err := loadgen.NewBuilder(s, "bicanary", 424242)
		if err != nil {
			t.Fatal(err)
		}
		c.builders[s.Name] = b
	}
	return c
}

// post sends a new valid, processable webhook (a payment becoming paid)
// to source.
func (c *canaries) post(client *http.Client, base, source, after string) (int, error) {
	c.next++
	req, err := c.builders[source].Build(loadgen.Event{Seq: uint64(c.next), Payment: c.next, Step: 1, OccurredAt: c.now}, time.Now())
	if err != nil {
		return 0, err
	}
	c.sent = append(c.sent, canary{source: source, after: after, body: req.Body})
	hr, err := req.HTTPRequest(context.Background(), base)
	if err != nil {
		return 0, err
	}
	resp, err := client.Do(hr)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, resp.Body)
	return resp.StatusCode, nil
}

// readTopicBodies reads every record of topic, validates each against the
// JSON schema named, and returns the envelopes by source and body.
func readTopicBodies(t *testing.T, brokers []string, topic, schema string) map[string][]envelope.Raw {
	t.Helper()
	n := int(testenv.EndOffsetSum(t, brokers, topic))
	recs := testenv.ReadCommitted(t, brokers, topic)
	if len(recs) != n {
		t.Fatalf("%s: read %d records of %d", topic, len(recs), n)
	}
	out := map[string][]envelope.Raw{}
	for _, r := range recs {
		if err := schemas.Validate(schema, r.Value); err != nil {
			t.Errorf("%s/%d@%d does not validate against %s: %v", topic, r.Partition, r.Offset, schema, err)
		}
		for name, secret := range badInputSecrets {
			if bytes.Contains(r.Value, []byte(secret)) {
				t.Errorf("%s/%d@%d contains source %s's secret", topic, r.Partition, r.Offset, name)
			}
		}
		var env envelope.Raw
		if err := json.Unmarshal(r.Value, &env); err != nil {
			t.Fatalf("%s/%d@%d: %v", topic, r.Partition, r.Offset, err)
		}
		if string(r.Key) != env.PaymentKey {
			t.Errorf("%s/%d@%d: key %q, payment_key %q", topic, r.Partition, r.Offset, r.Key, env.PaymentKey)
		}
		k := recordKey(env.Source, env.Body)
		out[k] = append(out[k], env)
	}
	return out
}

// badInputIngest is a running `paystream ingest`.
type badInputIngest struct {
	*testenv.Process
	addr, base string
}

// startBadInputIngest runs the paystream binary's ingest on the corpus's
// sources and the test's topics, and waits until it is ready.
func startBadInputIngest(t *testing.T, brokers []string, raw, dlq, server string) *badInputIngest {
	t.Helper()
	sources := filepath.Join(t.TempDir(), "sources.yaml")
	if err := os.WriteFile(sources, []byte(badInputSourcesYAML()), 0o600); err != nil {
		t.Fatal(err)
	}
	addr := testenv.FreeAddr(t)
	cmd := exec.Command(binary, "ingest", "--kafka-brokers", strings.Join(brokers, ","), "--raw-topic", raw, "--dlq-topic", dlq,
		"--sources", sources, "--http-addr", addr, "--shutdown-grace", "0s", "--log-format", "json", "--log-level", "debug",
		"--http-server", server, "--metrics-addr", "", "--metrics-on-http-addr") // requestOutcomes scrapes the webhook address
	cmd.Env = testenv.Environ()
	ing := &badInputIngest{Process: testenv.StartProcess(t, "paystream ingest", cmd, 0), addr: addr, base: "http://" + addr}
	ing.LogTail = 8 << 10
	ing.WaitHTTP(t, ing.base+"/readyz", time.Minute)
	return ing
}
