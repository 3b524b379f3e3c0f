package console_test

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/cdproto/fetch"
	"github.com/chromedp/cdproto/network"
	"github.com/chromedp/chromedp"
	"go.uber.org/goleak"

	"github.com/paystream/paystream/internal/console"
	"github.com/paystream/paystream/internal/dlq/dlqtest"
	"github.com/paystream/paystream/internal/testenv"
)

// The browser tests drive a real headless Chromium (Debian's chromium
// package) against a console served on loopback. Where no Chromium is
// installed they skip, saying how to get one. PAYSTREAM_CHROMIUM names the
// binary; PAYSTREAM_CONSOLE_SCREENSHOTS, a directory, makes the tests that
// show a main page save it there as PNG (docs/console/ has them).

// chromiumPath finds the Chromium to drive, or "".
func chromiumPath() string {
	if p := os.Getenv("PAYSTREAM_CHROMIUM"); p != "" {
		return p
	}
	for _, name := range []string{"chromium", "chromium-browser", "google-chrome", "headless-shell"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	return ""
}

// credentials answer the browser's basic auth challenges.
type credentials struct{ user, password string }

// browser is one headless Chromium tab for t, answering basic auth
// challenges with creds the way a person types them in the dialog: a second
// challenge for the same request (the credentials were refused) is
// cancelled, and the tab shows the 401 page. statuses records each
// document's HTTP status.
type browser struct {
	ctx context.Context

	mu       sync.Mutex
	statuses []int64
}

// chromium is the one Chromium the package's tests share, started by the
// first test that needs it; each test gets a tab of its own (newBrowser)
// and TestMain stops it.
var chromium struct {
	once   sync.Once
	ctx    context.Context
	cancel context.CancelFunc
	dir    string
	err    error
}

// TestMain runs the tests and stops the shared Chromium, then fails the
// package when a goroutine outlives them (a server, a tab or a pool a
// test left running).
func TestMain(m *testing.M) {
	code := testenv.Wrap(m).Run()
	if chromium.cancel != nil {
		chromium.cancel()
		_ = os.RemoveAll(chromium.dir)
	}
	if code == 0 {
		if err := goleak.Find(); err != nil {
			fmt.Fprintln(os.Stderr, "goleak: goroutines outlived the tests:", err)
			code = 1
		}
	}
	os.Exit(code)
}

// startChromium starts the shared Chromium at path, headless, with a
// fresh profile.
func startChromium(path string) error {
	chromium.once.Do(func() {
		if chromium.dir, chromium.err = os.MkdirTemp("", "paystream-console-chromium-"); chromium.err != nil {
			return
		}
		opts := append(chromedp.DefaultExecAllocatorOptions[:],
			chromedp.ExecPath(path),
			chromedp.NoSandbox, // root in CI
			chromedp.DisableGPU,
			chromedp.UserDataDir(chromium.dir),
			chromedp.WindowSize(1280, 900),
			// The network is closed here: a browser that phones home hangs.
			chromedp.Flag("disable-background-networking", true),
			chromedp.Flag("disable-component-update", true),
			chromedp.Flag("disable-sync", true),
			chromedp.Flag("no-first-run", true),
		)
		actx, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
		ctx, cancel := chromedp.NewContext(actx)
		chromium.ctx, chromium.cancel = ctx, func() { cancel(); cancelAlloc() }
		// The first run starts the browser and must not have a deadline
		// (it would stop the browser): bound it from outside.
		started := make(chan error, 1)
		go func() { started <- chromedp.Do(ctx) }()
		select {
		case chromium.err = <-started:
		case <-time.After(time.Minute):
			chromium.err = fmt.Errorf("chromium %s did not start within a minute", path)
		}
		if chromium.err != nil {
			chromium.cancel()
			chromium.cancel = nil
			_ = os.RemoveAll(chromium.dir)
		}
	})
	return chromium.err
}

func newBrowser(t testing.TB, creds credentials) *browser {
	t.Helper()
	path := chromiumPath()
	if path == "" {
		t.Skip("no Chromium: the browser tests need Debian's chromium package (apt-get install chromium) or PAYSTREAM_CHROMIUM")
	}
	if err := startChromium(path); err != nil {
		t.Fatalf("start Chromium: %v", err)
	}
	ctx, cancel := chromedp.NewContext(chromium.ctx) // a new tab
	t.Cleanup(cancel)
	b := &browser{ctx: ctx}
	// Paused requests and auth challenges are answered from a goroutine:
	// Listen's callback must not send commands.
	answers := make(chan any, 64)
	challenged := map[fetch.RequestID]bool{}
	go func() {
		for {
			select {
			case <-ctx.Done():
				return
			case ev := <-answers:
				switch ev := ev.(type) {
				case *fetch.EventRequestPaused:
					_, _ = chromedp.Call(ctx, fetch.ContinueRequest, fetch.ContinueRequestParams{RequestID: ev.RequestID})
				case *fetch.EventAuthRequired:
					resp := &fetch.AuthChallengeResponse{Response: fetch.AuthChallengeResponseResponseProvideCredentials,
						Username: creds.user, Password: creds.password}
					if challenged[ev.RequestID] {
						resp = &fetch.AuthChallengeResponse{Response: fetch.AuthChallengeResponseResponseCancelAuth}
					}
					challenged[ev.RequestID] = true
					_, _ = chromedp.Call(ctx, fetch.ContinueWithAuth, fetch.ContinueWithAuthParams{RequestID: ev.RequestID, AuthChallengeResponse: resp})
				}
			}
		}
	}()
	sctx, scancel := context.WithTimeout(ctx, 30*time.Second)
	defer scancel()
	err := chromedp.Listen(ctx, func(ev any) {
		switch ev := ev.(type) {
		case *fetch.EventRequestPaused, *fetch.EventAuthRequired:
			answers <- ev
		case *network.EventResponseReceived:
			if ev.Type == network.ResourceTypeDocument {
				b.mu.Lock()
				b.statuses = append(b.statuses, ev.Response.Status)
				b.mu.Unlock()
			}
		}
	})
	if err != nil {
		t.Fatalf("open a tab: %v", err)
	}
	handleAuth := true
	if _, err := chromedp.Call(sctx, network.Enable, network.EnableParams{}); err != nil {
		t.Fatalf("enable the network domain: %v", err)
	}
	if _, err := chromedp.Call(sctx, fetch.Enable, fetch.EnableParams{HandleAuthRequests: &handleAuth}); err != nil {
		t.Fatalf("enable auth handling: %v", err)
	}
	return b
}

// run runs steps within 30 seconds.
func (b *browser) run(t testing.TB, steps ...chromedp.Action[chromedp.Void]) {
	t.Helper()
	ctx, cancel := context.WithTimeout(b.ctx, 30*time.Second)
	defer cancel()
	if err := chromedp.Do(ctx, steps...); err != nil {
		t.Fatal(err)
	}
}

// get runs a after steps and returns its value, all within 30 seconds.
func get[T any](t testing.TB, b *browser, a chromedp.Action[T]) T {
	t.Helper()
	ctx, cancel := context.WithTimeout(b.ctx, 30*time.Second)
	defer cancel()
	v, err := chromedp.Run(ctx, a)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

func (b *browser) lastStatus() int64 {
	b.mu.Lock()
	defer b.mu.Unlock()
	if len(b.statuses) == 0 {
		return 0
	}
	return b.statuses[len(b.statuses)-1]
}

// texts reads the text of every node sel matches.
func texts(sel string) chromedp.Action[[]string] {
	return chromedp.Evaluate[[]string](`Array.from(document.querySelectorAll(` + quoteJS(sel) + `)).map(e => e.innerText.trim())`)
}

func quoteJS(s string) string { return "'" + strings.ReplaceAll(s, "'", `\'`) + "'" }

// screenshot saves the page as name.png in PAYSTREAM_CONSOLE_SCREENSHOTS,
// when set.
func (b *browser) screenshot(t testing.TB, name string) {
	t.Helper()
	dir := os.Getenv("PAYSTREAM_CONSOLE_SCREENSHOTS")
	if dir == "" {
		return
	}
	png := get(t, b, chromedp.FullScreenshot(100))
	if err := os.WriteFile(filepath.Join(dir, name+".png"), png, 0o644); err != nil {
		t.Fatal(err)
	}
}

var rightCredentials = credentials{testUser, testPassword}

func TestBrowserSearchShowsTheFourTransitionsInOrder(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{readOnly: true})
	b.seedPaidAndRefunded(t)
	b.seedHeld(t)
	br := newBrowser(t, rightCredentials)
	br.run(t,
		chromedp.Navigate(b.ts.URL+"/"),
		chromedp.WaitVisible(chromedp.ID("q")),
		chromedp.SendKeys(chromedp.ID("q"), "pay_1"),
		chromedp.Click(chromedp.ID("search")),
		chromedp.WaitVisible(chromedp.ID("transitions")),
	)
	url := get(t, br, chromedp.Location())
	changes := get(t, br, texts("#transitions tr.transition td.change"))
	eventIDs := get(t, br, texts("#transitions tr.transition td.event-id"))
	if !strings.HasSuffix(url, "/payment?key=acme%3Apay_1") {
		t.Errorf("search for the gateway id landed on %s", url)
	}
	want := []string{"(new) → pending", "pending → authorized", "authorized → paid", "paid → partially_refunded"}
	if !slices.Equal(changes, want) {
		t.Errorf("transitions in the browser: %q, want %q", changes, want)
	}
	if want := []string{"acme:pay_1:1", "acme:pay_1:2", "acme:pay_1:3", "acme:pay_1:4"}; !slices.Equal(eventIDs, want) {
		t.Errorf("state event ids: %q, want %q", eventIDs, want)
	}
	br.screenshot(t, "payment")
}

func TestBrowserQuarantinedDeliveryShowsItsReason(t *testing.T) {
	t.Parallel()
	brokers := testenv.Kafka(t)
	raw, dlqTopic := testenv.Topic(t, "console-raw", 1), testenv.Topic(t, "console-dlq", 1)
	dlqtest.Start(t, brokers, raw, dlqTopic).PostStandard(t, "msg_settled", dlqtest.PaidBody("payment.settled", "pay_42", 1050))
	b := setup(t, setupOpts{readOnly: true, cfg: func(c *console.Config) { c.Brokers, c.RawTopic, c.DLQTopic = brokers, raw, dlqTopic }})
	b.now = time.Now()
	b.seedPaidAndRefunded(t)
	b.seedHeld(t)
	b.seedDeliveries(t, delivery{payment: "acme:pay_3", eventID: "evt_3_refund", typ: "payment.refunded", status: "deferred",
		reason: "needs_predecessor", received: at.Add(-5 * time.Minute)})
	br := newBrowser(t, rightCredentials)
	br.run(t, chromedp.Navigate(b.ts.URL+"/stuck"), chromedp.WaitVisible(chromedp.ID("quarantined")))
	reasons := get(t, br, texts("#quarantined tr.delivery td.reason"))
	if !slices.Equal(reasons, []string{"currency_mismatch"}) {
		t.Errorf("quarantined reasons on /stuck: %q, want [currency_mismatch]", reasons)
	}
	if cmds := get(t, br, texts("#dlq code.replay")); len(cmds) != 1 || !strings.HasPrefix(cmds[0], "paystream dlq replay 0/0 ") {
		t.Errorf("DLQ replay commands on /stuck: %q", cmds)
	}
	br.screenshot(t, "stuck")
	br.run(t, chromedp.Click(chromedp.CSS("#quarantined a")), chromedp.WaitVisible(chromedp.ID("held")))
	held := get(t, br, chromedp.Text(chromedp.ID("held")))
	if !strings.Contains(held, "currency_mismatch") || !strings.Contains(held, "paystream replay --payment-key acme:pay_held") {
		t.Errorf("held payment's page says %q", held)
	}
}

func TestBrowserWrongPasswordIsRefused(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{})
	b.seedHeld(t)
	br := newBrowser(t, credentials{testUser, "not the password"})
	br.run(t, chromedp.Navigate(b.ts.URL+"/stuck"), chromedp.WaitReady(chromedp.CSS("body")))
	body := get(t, br, chromedp.Text(chromedp.CSS("body")))
	if got := br.lastStatus(); got != 401 {
		t.Errorf("status with a wrong password: %d, want 401", got)
	}
	if !strings.Contains(body, "unauthorized") || strings.Contains(body, "pay_held") {
		t.Errorf("page with a wrong password shows %q", body)
	}
}

func TestBrowserHealthShowsLagPerPartition(t *testing.T) {
	t.Parallel()
	b, _ := setupHealth(t)
	b.now = time.Now() // the real days, for the retention section
	b.exec(t, `UPDATE consumer_offsets SET updated_at = now() - interval '90 seconds'`)
	br := newBrowser(t, rightCredentials)
	br.run(t, chromedp.Navigate(b.ts.URL+"/health"), chromedp.WaitVisible(chromedp.ID("partitions")))
	lags := get(t, br, texts("#partitions td.lag"))
	total := get(t, br, chromedp.Text(chromedp.ID("total-lag")))
	if !slices.Equal(lags, []string{"1", "3"}) || total != "4" {
		t.Errorf("lag per partition %q, total %q; want [1 3], 4", lags, total)
	}
	br.screenshot(t, "health")
}
