package main

import (
	"context"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/paystream/paystream/internal/testenv"
)

// TestConsoleRefusesToServeOpen: without --auth-file or --auth-header the
// console exits at once, naming both, before it connects to anything.
func TestConsoleRefusesToServeOpen(t *testing.T) {
	t.Parallel()
	r := paystream.Run(t, nil, "console", "--database-url=postgres://127.0.0.1:1/none")
	if r.Code == 0 || !strings.Contains(r.Stderr, "--auth-file") || !strings.Contains(r.Stderr, "--auth-header") {
		t.Errorf("console without auth: exit %d, stderr %q; want a failure naming --auth-file and --auth-header", r.Code, r.Stderr)
	}
}

// TestConsoleServes runs `paystream console` on a migrated schema with a
// basic auth file: a payment's page for the right password, 401 for none.
func TestConsoleServes(t *testing.T) {
	t.Parallel()
	db := testenv.NewDB(t)
	if _, err := db.Pool.Exec(t.Context(), `INSERT INTO payments (payment_key, source, payment_id, status, version, amount_minor, currency, state)
		VALUES ('acme:pay_1', 'acme', 'pay_1', 'paid', 1, 1050, 'BRL', '{}')`); err != nil {
		t.Fatal(err)
	}
	users := filepath.Join(t.TempDir(), "users")
	if err := os.WriteFile(users, []byte("ops:s3cret\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	addr := testenv.FreeAddr(t)
	ctx, cancel := context.WithCancel(t.Context())
	cmd := paystream.Command(ctx, []string{"PAYSTREAM_DATABASE_URL=" + db.URL, "PAYSTREAM_CONSOLE_AUTH_FILE=" + users},
		"console", "--addr", addr)
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cancel(); _ = cmd.Wait() })

	get := func(user, pass string) (int, string) {
		req, err := http.NewRequestWithContext(t.Context(), http.MethodGet, "http://"+addr+"/payment?key=acme:pay_1", nil)
		if err != nil {
			t.Fatal(err)
		}
		if user != "" {
			req.SetBasicAuth(user, pass)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return 0, err.Error()
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(body)
	}
	var code int
	var body string
	testenv.Eventually(t, 30*time.Second, func() bool {
		code, body = get("ops", "s3cret")
		return code != 0
	}, "the console answers on %s", addr)
	if code != http.StatusOK || !strings.Contains(body, "10.50 BRL") {
		t.Errorf("payment page: %d\n%s", code, body)
	}
	if code, _ := get("", ""); code != http.StatusUnauthorized {
		t.Errorf("no credentials: %d, want 401", code)
	}
}
