package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/paystream/paystream/internal/testenv"
)

// TestDevWalkingSkeleton runs `paystream dev` the way a newcomer does — no
// Kafka, no database configured, so it starts the embedded kfake and a
// private Postgres under --data-dir — and checks the walking skeleton's
// promises end to end through the binary: the banner's webhook URL and
// pasteable curl, a signed webhook becoming a paid payment with a balanced
// ledger, a late event ignored as stale, a redelivery ignored as a
// duplicate, `paystream inspect` in both forms, a clean SIGTERM exit, and
// the data (and a working pipeline) surviving a restart on the same dir.
func TestDevWalkingSkeleton(t *testing.T) {
	testenv.SkipIfShort(t)
	t.Parallel()
	dataDir, sources := devDirs(t)

	start := time.Now()
	dev := startDev(t, dataDir, sources)
	t.Logf("paystream dev ready in %s", time.Since(start).Round(time.Millisecond))

	// The banner names the webhook URL and carries a signed example that
	// works when pasted.
	banner := dev.waitBanner(t)
	if want := "webhook URL: " + dev.url + "/webhooks/acme"; !strings.Contains(banner, want) {
		t.Errorf("banner lacks %q:\n%s", want, banner)
	}
	ex := parseCurl(t, banner)
	if ex.url != dev.url+"/webhooks/acme" {
		t.Errorf("example curl posts to %q, want %q", ex.url, dev.url+"/webhooks/acme")
	}
	for _, h := range []string{"webhook-id", "webhook-timestamp", "webhook-signature"} {
		if ex.header.Get(h) == "" {
			t.Errorf("example curl lacks header %s: %v", h, ex.header)
		}
	}
	if code, body := ex.do(t); code != http.StatusOK || !strings.Contains(body, `"received":true`) {
		t.Fatalf("pasting the banner's curl: %d %s, want 200 {\"received\":true}", code, body)
	}
	demo := devWaitPayment(t, dataDir, "pay_demo_1", func(p inspectJSON) error {
		if p.Status != "paid" || len(p.Events) != 1 || p.Events[0].Outcome != "processed" {
			return fmt.Errorf("status %q, events %+v; want paid with one processed event", p.Status, p.Events)
		}
		return nil
	})
	if got := demo.Events[0].EventID; got != ex.header.Get("webhook-id") {
		t.Errorf("demo payment's event id = %q, want the example's webhook-id %q", got, ex.header.Get("webhook-id"))
	}
	// The banner's "Then:" command, pasted, shows that payment.
	then := regexp.MustCompile(`(?m)^Then: (.+)$`).FindStringSubmatch(banner)
	if then == nil {
		t.Fatalf("banner has no \"Then:\" command:\n%s", banner)
	}
	words, err := shellWords(then[1])
	if err != nil || len(words) < 2 || words[0] != binary {
		t.Fatalf("banner's \"Then:\" command %q (%v): want it to start with the binary as invoked, %s", then[1], err, binary)
	}
	if out, stderr, code := runPaystream(t, words[1:]...); code != 0 || !strings.Contains(out, "acme:pay_demo_1") || !strings.Contains(out, "status paid") {
		t.Errorf("banner's %q: exit %d, stdout %q, stderr %q; want pay_demo_1's timeline", then[1], code, out, stderr)
	}

	// A signed payment.paid is processed: paid, version 1, one balanced
	// capture in the ledger.
	now := time.Now().UTC().Truncate(time.Second)
	paid := fmt.Sprintf(`{"type":"payment.paid","timestamp":%q,"data":{"payment_id":"pay_x","amount":2599,"currency":"BRL"}}`,
		now.Add(-time.Minute).Format(time.RFC3339))
	if code := devPost(t, dev.url, "msg_paid_x", now, paid); code != http.StatusOK {
		t.Fatalf("post payment.paid: status %d, want 200", code)
	}
	p := devWaitPayment(t, dataDir, "pay_x", func(p inspectJSON) error {
		if len(p.Events) != 1 || p.Events[0].Outcome == "received" {
			return fmt.Errorf("events %+v, want one decided", p.Events)
		}
		return nil
	})
	if p.Status != "paid" || p.Version != 1 || p.AmountMinor != 2599 || p.Currency != "BRL" {
		t.Errorf("payment = status %q version %d amount %d %s, want paid v1 2599 BRL", p.Status, p.Version, p.AmountMinor, p.Currency)
	}
	checkCapture(t, p.Ledger, 2599, "BRL")
	if e := p.Events[0]; e.EventID != "msg_paid_x" || e.Type != "payment.paid" || e.Outcome != "processed" || e.Reason != "" {
		t.Errorf("event = %+v, want msg_paid_x payment.paid processed without reason", e)
	}

	// A late payment.created (it happened before the payment was paid) is
	// ignored as stale; a redelivery of payment.paid is ignored as a
	// duplicate. Neither changes anything.
	created := fmt.Sprintf(`{"type":"payment.created","timestamp":%q,"data":{"payment_id":"pay_x","amount":2599,"currency":"BRL"}}`,
		now.Add(-5*time.Minute).Format(time.RFC3339))
	if code := devPost(t, dev.url, "msg_created_x", now, created); code != http.StatusOK {
		t.Fatalf("post late payment.created: status %d, want 200", code)
	}
	if code := devPost(t, dev.url, "msg_paid_x", now, paid); code != http.StatusOK {
		t.Fatalf("post duplicate payment.paid: status %d, want 200", code)
	}
	p = devWaitPayment(t, dataDir, "pay_x", func(p inspectJSON) error {
		if len(p.Events) != 3 || p.Events[1].Outcome == "received" || p.Events[2].Outcome == "received" {
			return fmt.Errorf("events %+v, want three decided", p.Events)
		}
		return nil
	})
	checkPayXEvents(t, p.Events)
	if p.Status != "paid" || p.Version != 1 || len(p.Transitions) != 1 {
		t.Errorf("after late and duplicate events: status %q version %d, %d transitions; want paid v1, 1 transition",
			p.Status, p.Version, len(p.Transitions))
	}
	checkCapture(t, p.Ledger, 2599, "BRL")

	// The timeline names every delivery and what became of it.
	out, stderr, code := runPaystream(t, "inspect", "payment", "--data-dir", dataDir, "--source", "acme", "--id", "pay_x")
	if code != 0 {
		t.Fatalf("inspect (timeline): exit %d: %s", code, stderr)
	}
	for _, want := range []string{"status paid, version 1, amount 2599 BRL", "msg_paid_x", "msg_created_x",
		"payment.paid", "payment.created", "processed", "stale", "duplicate_event", "capture"} {
		if !strings.Contains(out, want) {
			t.Errorf("timeline lacks %q:\n%s", want, out)
		}
	}
	// An unknown payment is a clear, non-zero answer.
	if _, stderr, code := runPaystream(t, "inspect", "payment", "--data-dir", dataDir, "--source", "acme", "--id", "pay_nope"); code == 0 ||
		!strings.Contains(stderr, "pay_nope") {
		t.Errorf("inspect of an unknown payment: exit %d, stderr %q; want non-zero naming it", code, stderr)
	}

	// SIGTERM: a clean exit (status 0), in bounded time, stopping the
	// private Postgres.
	dev.stop(t)
	if _, err := os.Stat(filepath.Join(dataDir, "postgres", "postmaster.pid")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("private postgres still running after paystream dev exited (postmaster.pid: %v)", err)
	}
	// Inspecting a stopped dev instance says so.
	if _, stderr, code := runPaystream(t, "inspect", "payment", "--data-dir", dataDir, "--source", "acme", "--id", "pay_x"); code == 0 ||
		!strings.Contains(stderr, "is it running?") {
		t.Errorf("inspect with paystream dev stopped: exit %d, stderr %q; want a failure asking whether it runs", code, stderr)
	}

	// Started again on the same data dir, the payment is still there and
	// the pipeline still works: Kafka's log and Postgres's stored offsets
	// agree, so a new event is applied once, after the old ones.
	dev = startDev(t, dataDir, sources)
	p = devInspect(t, dataDir, "pay_x")
	if p.Status != "paid" || p.Version != 1 || len(p.Events) != 3 {
		t.Fatalf("after restart: status %q version %d, %d events; want paid v1 with 3 events (data kept)", p.Status, p.Version, len(p.Events))
	}
	refund := fmt.Sprintf(`{"type":"payment.partially_refunded","timestamp":%q,"data":{"payment_id":"pay_x","amount":599,"currency":"BRL","refund_id":"re_1"}}`,
		now.Format(time.RFC3339))
	later := time.Now().UTC()
	if code := devPost(t, dev.url, "msg_refund_x", later, refund); code != http.StatusOK {
		t.Fatalf("post refund after restart: status %d, want 200", code)
	}
	p = devWaitPayment(t, dataDir, "pay_x", func(p inspectJSON) error {
		if len(p.Events) != 4 || p.Events[3].Outcome == "received" {
			return fmt.Errorf("events %+v, want four decided", p.Events)
		}
		return nil
	})
	if p.Status != "partially_refunded" || p.Version != 2 || p.Events[3].Outcome != "processed" {
		t.Errorf("after refund: status %q version %d, last event %+v; want partially_refunded v2, processed", p.Status, p.Version, p.Events[3])
	}
	var sum int64
	for _, ps := range p.Ledger {
		sum += ps.AmountMinor
	}
	if sum != 0 || len(p.Ledger) != 4 {
		t.Errorf("ledger after refund: %d postings summing to %d, want 4 summing to 0: %+v", len(p.Ledger), sum, p.Ledger)
	}
	dev.stop(t)
}

// TestDevPortInUse: with its webhook port taken, paystream dev fails at
// once, saying which setting to change, without starting Kafka or Postgres
// or printing a banner that claims it runs.
func TestDevPortInUse(t *testing.T) {
	testenv.SkipIfShort(t)
	t.Parallel()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	dataDir, sources := devDirs(t)
	start := time.Now()
	_, stderr, code := runPaystream(t, "dev", "--data-dir", dataDir, "--sources", sources, "--http-addr", ln.Addr().String())
	if code == 0 || !strings.Contains(stderr, "--http-addr") || !strings.Contains(stderr, ln.Addr().String()) {
		t.Errorf("exit %d, stderr %q; want a failure naming --http-addr and %s", code, stderr, ln.Addr())
	}
	if strings.Contains(stderr, "is running") {
		t.Errorf("printed the banner although it could not listen:\n%s", stderr)
	}
	if _, err := os.Stat(filepath.Join(dataDir, "postgres")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("started postgres before finding the port taken (%v)", err)
	}
	if took := time.Since(start); took > 10*time.Second {
		t.Errorf("took %s to fail", took)
	}
}

// inspectJSON is the contract of `paystream inspect payment --json`, spelled
// out here so that a renamed field fails this test.
type inspectJSON struct {
	PaymentKey  string           `json:"payment_key"`
	Status      string           `json:"status"`
	Version     int64            `json:"version"`
	AmountMinor int64            `json:"amount_minor"`
	Currency    string           `json:"currency"`
	Ledger      []inspectPosting `json:"ledger"`
	Transitions []struct {
		Version int64  `json:"version"`
		To      string `json:"to"`
	} `json:"transitions"`
	Events []inspectEvent `json:"events"`
}

type inspectPosting struct {
	Version     int64  `json:"version"`
	Account     string `json:"account"`
	AmountMinor int64  `json:"amount_minor"`
	Currency    string `json:"currency"`
}

type inspectEvent struct {
	EventID string `json:"event_id"`
	Type    string `json:"type"`
	Outcome string `json:"outcome"`
	Reason  string `json:"reason"`
}

// checkCapture requires one balanced capture of amount: a debit and a
// credit on two accounts, at version 1.
func checkCapture(t *testing.T, ledger []inspectPosting, amount int64, currency string) {
	t.Helper()
	if len(ledger) != 2 {
		t.Fatalf("ledger has %d postings, want 2 (one debit, one credit): %+v", len(ledger), ledger)
	}
	var debit, credit bool
	for _, ps := range ledger {
		if ps.Account == "" || ps.Currency != currency || ps.Version != 1 {
			t.Errorf("posting %+v: want an account, currency %s, version 1", ps, currency)
		}
		debit = debit || ps.AmountMinor == amount
		credit = credit || ps.AmountMinor == -amount
	}
	if !debit || !credit || ledger[0].Account == ledger[1].Account {
		t.Errorf("ledger %+v: want +%d and -%d on two accounts", ledger, amount, amount)
	}
}

// checkPayXEvents requires pay_x's deliveries: processed, stale, duplicate.
func checkPayXEvents(t *testing.T, events []inspectEvent) {
	t.Helper()
	want := []struct{ id, typ, outcome, reason string }{
		{"msg_paid_x", "payment.paid", "processed", ""},
		{"msg_created_x", "payment.created", "ignored", "stale"},
		{"msg_paid_x", "payment.paid", "ignored", "duplicate_event"},
	}
	for i, w := range want {
		e := events[i]
		if e.EventID != w.id || e.Type != w.typ || e.Outcome != w.outcome || e.Reason != w.reason {
			t.Errorf("event %d = %+v, want %s %s %s %q", i, e, w.id, w.typ, w.outcome, w.reason)
		}
	}
}

// devProc is a running `paystream dev`.
type devProc struct {
	*testenv.Process
	url string // http://127.0.0.1:PORT
}

// acmeSources writes, in dir, a sources file with the one source the dev
// tests post to (acme, standardwebhooks, testSecret) and returns its path.
func acmeSources(t *testing.T, dir string) string {
	t.Helper()
	path := filepath.Join(dir, "sources.yaml")
	if err := os.WriteFile(path, []byte("sources:\n  - name: acme\n    driver: standardwebhooks\n    secrets: [\""+testSecret+"\"]\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// devDirs returns a fresh data dir for `paystream dev` (no cluster of an
// earlier run left on it) and an acme sources file beside it.
func devDirs(t *testing.T) (dataDir, sources string) {
	t.Helper()
	dir := t.TempDir()
	dataDir = filepath.Join(dir, "data")
	stopStrayPostgres(t, filepath.Join(dataDir, "postgres"))
	return dataDir, acmeSources(t, dir)
}

func startDev(t *testing.T, dataDir, sources string) *devProc {
	t.Helper()
	addr := testenv.FreeAddr(t)
	cmd := exec.Command(binary, "dev", "--data-dir", dataDir, "--sources", sources, "--http-addr", addr)
	cmd.Env = testenv.Environ()
	d := &devProc{Process: testenv.StartProcess(t, "paystream dev", cmd, 0), url: "http://" + addr}
	d.WaitHTTP(t, d.url+"/readyz", 2*time.Minute)
	return d
}

// waitBanner returns paystream dev's output once the banner is complete.
func (d *devProc) waitBanner(t *testing.T) string {
	t.Helper()
	testenv.Eventually(t, 10*time.Second, func() bool {
		return regexp.MustCompile(`(?m)^Then: .* inspect payment .*\n`).MatchString(d.Output.String())
	},
		"the banner with its example curl")
	return d.Output.String()
}

// stop sends SIGTERM and requires exit status 0 within a bound, with no
// data race, panic or error in the output.
func (d *devProc) stop(t *testing.T) {
	t.Helper()
	took := d.Terminate(t, 30*time.Second)
	for line := range strings.Lines(d.Output.String()) {
		if strings.Contains(line, "level=ERROR") {
			t.Errorf("paystream dev logged an error: %s", line)
		}
	}
	t.Logf("paystream dev exited 0 %s after SIGTERM", took.Round(time.Millisecond))
}

// stopStrayPostgres registers a cleanup that shuts down (SIGQUIT: immediate
// shutdown) a postmaster still running on pgData when the test ends, as it
// is when the test fails before paystream dev stopped it: the server runs
// in its own process group and outlives a killed paystream.
func stopStrayPostgres(t *testing.T, pgData string) {
	t.Cleanup(func() {
		b, err := os.ReadFile(filepath.Join(pgData, "postmaster.pid"))
		if err != nil {
			return
		}
		pid, err := strconv.Atoi(strings.TrimSpace(strings.SplitN(string(b), "\n", 2)[0]))
		if err != nil || pid <= 0 {
			return
		}
		// Only the postmaster of this data dir, not a process that reused the pid.
		cmdline, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
		if err != nil || !bytes.Contains(cmdline, []byte(pgData)) {
			return
		}
		t.Logf("stopping the private postgres (pid %d) left running on %s", pid, pgData)
		_ = syscall.Kill(pid, syscall.SIGQUIT)
		deadline := time.Now().Add(15 * time.Second)
		for time.Now().Before(deadline) && syscall.Kill(pid, 0) == nil {
			time.Sleep(50 * time.Millisecond)
		}
	})
}

// runPaystream runs the paystream binary with testenv.Environ() and returns its stdout,
// stderr and exit status.
func runPaystream(t *testing.T, args ...string) (stdout, stderr string, code int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, binary, args...)
	cmd.Env = testenv.Environ()
	var out, errOut bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errOut
	err := cmd.Run()
	var ee *exec.ExitError
	switch {
	case err == nil:
	case errors.As(err, &ee):
		code = ee.ExitCode()
	default:
		t.Fatalf("run paystream %s: %v", strings.Join(args, " "), err)
	}
	return out.String(), errOut.String(), code
}

// devInspect runs `paystream inspect payment --json` against the dev
// instance on dataDir.
func devInspect(t *testing.T, dataDir, id string) inspectJSON {
	t.Helper()
	p, err := devTryInspect(t, dataDir, id)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func devTryInspect(t *testing.T, dataDir, id string) (inspectJSON, error) {
	out, stderr, code := runPaystream(t, "inspect", "payment", "--data-dir", dataDir, "--source", "acme", "--id", id, "--json")
	if code != 0 {
		return inspectJSON{}, fmt.Errorf("inspect %s: exit %d: %s", id, code, strings.TrimSpace(stderr))
	}
	var p inspectJSON
	dec := json.NewDecoder(strings.NewReader(out))
	if err := dec.Decode(&p); err != nil {
		return inspectJSON{}, fmt.Errorf("inspect %s --json: %v:\n%s", id, err, out)
	}
	if dec.More() {
		return inspectJSON{}, fmt.Errorf("inspect %s --json printed more than one JSON value:\n%s", id, out)
	}
	if want := "acme:" + id; p.PaymentKey != want {
		return inspectJSON{}, fmt.Errorf("inspect %s: payment_key %q, want %q", id, p.PaymentKey, want)
	}
	return p, nil
}

// devWaitPayment polls inspect until the payment exists and cond accepts it.
func devWaitPayment(t *testing.T, dataDir, id string, cond func(inspectJSON) error) inspectJSON {
	t.Helper()
	var p inspectJSON
	testenv.WaitFor(t, 60*time.Second, func() error {
		var err error
		if p, err = devTryInspect(t, dataDir, id); err != nil {
			return err
		}
		return cond(p)
	})
	return p
}

// devPost posts a Standard Webhooks request signed with testSecret to the
// dev instance's acme source.
func devPost(t *testing.T, baseURL, id string, ts time.Time, body string) int {
	t.Helper()
	req, err := signedRequest(baseURL, "acme", id, ts, body)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := (&http.Client{Timeout: 30 * time.Second}).Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, resp.Body)
	return resp.StatusCode
}

// curlRequest is the request a curl command line describes.
type curlRequest struct {
	method string
	url    string
	header http.Header
	body   string
}

// parseCurl finds the curl command in the banner and reads it as a POSIX
// shell would (backslash-newline continuations, single and double quotes),
// then as curl would (-X, -H, -d, the URL), so the request sent is what a
// person pasting the banner into a terminal sends.
func parseCurl(t *testing.T, banner string) curlRequest {
	t.Helper()
	i := strings.Index(banner, "curl ")
	if i < 0 {
		t.Fatalf("banner has no curl example:\n%s", banner)
	}
	// The command ends at the first newline not escaped by a backslash.
	rest := banner[i:]
	end := len(rest)
	for j := 0; j < len(rest); j++ {
		if rest[j] == '\n' && (j == 0 || rest[j-1] != '\\') {
			end = j
			break
		}
	}
	words, err := shellWords(rest[:end])
	if err != nil {
		t.Fatalf("example curl does not parse as a shell command (%v):\n%s", err, rest[:end])
	}
	req := curlRequest{method: http.MethodGet, header: http.Header{}}
	for k := 1; k < len(words); k++ {
		w := words[k]
		arg := func() string {
			if k+1 >= len(words) {
				t.Fatalf("curl option %s lacks its argument: %q", w, words)
			}
			k++
			return words[k]
		}
		switch {
		case w == "-X" || w == "--request":
			req.method = arg()
		case w == "-H" || w == "--header":
			name, value, ok := strings.Cut(arg(), ":")
			if !ok {
				t.Fatalf("curl header %q has no colon", words[k])
			}
			req.header.Add(strings.TrimSpace(name), strings.TrimSpace(value))
		case w == "-d" || w == "--data" || w == "--data-raw" || w == "--data-binary":
			req.body = arg()
			if req.method == http.MethodGet {
				req.method = http.MethodPost
			}
		case strings.HasPrefix(w, "-"):
			if w != "-sS" && w != "-s" && w != "-S" {
				t.Fatalf("example curl uses option %s, which this test does not understand", w)
			}
		default:
			if req.url != "" {
				t.Fatalf("example curl has two URLs: %q and %q", req.url, w)
			}
			req.url = w
		}
	}
	if req.url == "" || req.body == "" {
		t.Fatalf("example curl lacks a URL or a body: %q", words)
	}
	return req
}

func (r curlRequest) do(t *testing.T) (int, string) {
	t.Helper()
	req, err := http.NewRequest(r.method, r.url, strings.NewReader(r.body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header = r.header.Clone()
	if req.Header.Get("Content-Type") == "" {
		// curl -d's default.
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	}
	resp, err := (&http.Client{Timeout: 30 * time.Second}).Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// shellWords splits s into words as a POSIX shell does for the subset a
// pasted command uses: blanks, backslash-newline, backslash escapes outside
// quotes, single quotes and double quotes (with \" \\ \$ \` escapes).
func shellWords(s string) ([]string, error) {
	var words []string
	var cur strings.Builder
	inWord := false
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c == '\\' && i+1 < len(s) && s[i+1] == '\n':
			i++ // line continuation
		case c == '\\' && i+1 < len(s):
			i++
			cur.WriteByte(s[i])
			inWord = true
		case c == '\'':
			j := strings.IndexByte(s[i+1:], '\'')
			if j < 0 {
				return nil, errors.New("unterminated single quote")
			}
			cur.WriteString(s[i+1 : i+1+j])
			i += j + 1
			inWord = true
		case c == '"':
			i++
			for ; i < len(s) && s[i] != '"'; i++ {
				if s[i] == '$' || s[i] == '`' {
					return nil, errors.New("double quotes with expansions")
				}
				if s[i] == '\\' && i+1 < len(s) && strings.IndexByte("\"\\$`", s[i+1]) >= 0 {
					i++
				}
				cur.WriteByte(s[i])
			}
			if i >= len(s) {
				return nil, errors.New("unterminated double quote")
			}
			inWord = true
		case c == ' ' || c == '\t' || c == '\n':
			if inWord {
				words = append(words, cur.String())
				cur.Reset()
				inWord = false
			}
		case strings.IndexByte("|&;<>()$`*?[", c) >= 0, !inWord && (c == '#' || c == '~'):
			return nil, fmt.Errorf("unquoted shell metacharacter %q", c)
		default:
			cur.WriteByte(c)
			inWord = true
		}
	}
	if inWord {
		words = append(words, cur.String())
	}
	return words, nil
}
