package gatewaytest_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/paystream/paystream/internal/provider/gatewaytest"
)

// get requests path from gw with token (none when empty) and returns the
// status, body and Retry-After header.
func get(t *testing.T, gw *gatewaytest.Gateway, client *http.Client, path, token string) (int, string, string, error) {
	t.Helper()
	req, err := http.NewRequestWithContext(context.Background(), http.MethodGet, gw.URL()+path, nil)
	if err != nil {
		t.Fatal(err)
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := client.Do(req)
	if err != nil {
		return 0, "", "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, string(b), resp.Header.Get("Retry-After"), nil
}

func mustGet(t *testing.T, gw *gatewaytest.Gateway, path, token string) (int, string) {
	t.Helper()
	status, body, _, err := get(t, gw, gw.Client(), path, token)
	if err != nil {
		t.Fatalf("GET %s: %v", path, err)
	}
	return status, body
}

func TestServesBothShapesWithToken(t *testing.T) {
	t.Parallel()
	gw := gatewaytest.New(t)
	gw.SetPayment("123", []byte(`{"id":123,"status":"approved"}`))
	for _, path := range []string{"/v1/payments/123", "/payments/123"} {
		status, body := mustGet(t, gw, path, gw.Token())
		if status != http.StatusOK || body != `{"id":123,"status":"approved"}` {
			t.Fatalf("GET %s = %d %q", path, status, body)
		}
	}
	if got := gw.Requests(); got != 2 {
		t.Fatalf("Requests = %d, want 2", got)
	}
	if got := gw.RequestsFor("123"); got != 2 {
		t.Fatalf("RequestsFor(123) = %d, want 2", got)
	}
}

func TestSetPaymentEncodes(t *testing.T) {
	t.Parallel()
	gw := gatewaytest.New(t)
	at := time.Date(2024, 6, 12, 19, 45, 0, 0, time.UTC)
	gw.SetPayment("pay_1", gatewaytest.Payment{PaymentID: "pay_1", Status: "paid", Amount: 25990, Currency: "BRL", UpdatedAt: at})
	status, body := mustGet(t, gw, "/payments/pay_1", gw.Token())
	if status != http.StatusOK {
		t.Fatalf("status %d", status)
	}
	var got map[string]any
	if err := json.Unmarshal([]byte(body), &got); err != nil {
		t.Fatal(err)
	}
	if got["payment_id"] != "pay_1" || got["amount"] != float64(25990) || got["updated_at"] != "2024-06-12T19:45:00Z" {
		t.Fatalf("body %s", body)
	}
	gw.SetPayment("9", gatewaytest.MercadoPagoPayment{ID: 9, Status: "approved", CurrencyID: "BRL", TransactionAmount: "259.90", DateCreated: at, DateApproved: &at, DateLastUpdated: at})
	if _, body := mustGet(t, gw, "/v1/payments/9", gw.Token()); !json.Valid([]byte(body)) || !strings.Contains(body, `"transaction_amount":259.90`) {
		t.Fatalf("MP body %s", body)
	}
	gw.SetPayment("raw", "not json")
	if _, body := mustGet(t, gw, "/payments/raw", gw.Token()); body != "not json" {
		t.Fatalf("raw body %q", body)
	}
	gw.DeletePayment("raw")
	if status, _ := mustGet(t, gw, "/payments/raw", gw.Token()); status != http.StatusNotFound {
		t.Fatalf("deleted payment: status %d", status)
	}
}

func TestChecksBearerToken(t *testing.T) {
	t.Parallel()
	gw := gatewaytest.NewWithToken(t, "APP_USR-1234")
	gw.SetPayment("1", `{}`)
	for _, token := range []string{"", "wrong", "app_usr-1234"} {
		if status, _ := mustGet(t, gw, "/v1/payments/1", token); status != http.StatusUnauthorized {
			t.Errorf("token %q: status %d, want 401", token, status)
		}
	}
	if status, _ := mustGet(t, gw, "/v1/payments/1", "APP_USR-1234"); status != http.StatusOK {
		t.Fatalf("right token: status %d", status)
	}
	if gw.Requests() != 4 || gw.RequestsFor("1") != 4 {
		t.Fatalf("Requests = %d, RequestsFor = %d; want 4, 4 (rejected requests count)", gw.Requests(), gw.RequestsFor("1"))
	}
}

func TestNotFound(t *testing.T) {
	t.Parallel()
	gw := gatewaytest.New(t)
	for _, path := range []string{"/v1/payments/404", "/payments/404", "/v1/orders/1", "/"} {
		status, body := mustGet(t, gw, path, gw.Token())
		if status != http.StatusNotFound || !json.Valid([]byte(body)) {
			t.Errorf("GET %s = %d %q, want 404 with a JSON error", path, status, body)
		}
	}
}

func TestFailNext(t *testing.T) {
	t.Parallel()
	gw := gatewaytest.New(t)
	gw.SetPayment("1", `{"ok":true}`)
	gw.FailNext(2, http.StatusServiceUnavailable)
	for i := range 2 {
		status, _, retry, err := get(t, gw, gw.Client(), "/payments/1", gw.Token())
		if err != nil || status != http.StatusServiceUnavailable || retry != "1" {
			t.Fatalf("request %d: %d, Retry-After %q, %v; want 503 with Retry-After", i, status, retry, err)
		}
	}
	if status, _ := mustGet(t, gw, "/payments/1", gw.Token()); status != http.StatusOK {
		t.Fatalf("after the failures: status %d", status)
	}
	gw.FailNext(5, http.StatusInternalServerError)
	gw.FailNext(0, 0) // cancels
	if status, _ := mustGet(t, gw, "/payments/1", gw.Token()); status != http.StatusOK {
		t.Fatalf("after cancel: status %d", status)
	}
	if gw.Requests() != 4 {
		t.Fatalf("Requests = %d, want 4", gw.Requests())
	}
}

func TestFailNextDropsConnection(t *testing.T) {
	t.Parallel()
	gw := gatewaytest.New(t)
	gw.SetPayment("1", `{}`)
	gw.FailNext(1, 0)
	client := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}}
	if _, _, _, err := get(t, gw, client, "/payments/1", gw.Token()); err == nil {
		t.Fatal("dropped connection: no error")
	}
	if status, _, _, err := get(t, gw, client, "/payments/1", gw.Token()); err != nil || status != http.StatusOK {
		t.Fatalf("after the drop: %d, %v", status, err)
	}
}

func TestDelay(t *testing.T) {
	t.Parallel()
	gw := gatewaytest.New(t)
	gw.SetPayment("1", `{}`)
	gw.Delay(2 * time.Second)
	client := &http.Client{Timeout: 50 * time.Millisecond}
	start := time.Now()
	_, _, _, err := get(t, gw, client, "/payments/1", gw.Token())
	var ne interface{ Timeout() bool }
	if !errors.As(err, &ne) || !ne.Timeout() {
		t.Fatalf("slow answer: err = %v, want a timeout", err)
	}
	if elapsed := time.Since(start); elapsed > time.Second {
		t.Fatalf("client waited %v", elapsed)
	}
	gw.Delay(30 * time.Millisecond)
	start = time.Now()
	if status, _ := mustGet(t, gw, "/payments/1", gw.Token()); status != http.StatusOK {
		t.Fatalf("status %d", status)
	}
	if elapsed := time.Since(start); elapsed < 30*time.Millisecond {
		t.Fatalf("answer came after %v, want at least the 30ms delay", elapsed)
	}
	gw.Delay(0)
	if status, _ := mustGet(t, gw, "/payments/1", gw.Token()); status != http.StatusOK {
		t.Fatalf("status %d", status)
	}
}

// TestCloseWithSlowRequestInFlight checks a test ends promptly even when a
// delayed request is still being served.
func TestCloseWithSlowRequestInFlight(t *testing.T) {
	t.Parallel()
	var wg sync.WaitGroup
	answered := errors.New("no answer yet")
	t.Run("inner", func(t *testing.T) {
		gw := gatewaytest.New(t)
		gw.Delay(time.Hour)
		wg.Add(1)
		go func() {
			defer wg.Done()
			req, _ := http.NewRequest(http.MethodGet, gw.URL()+"/payments/1", nil)
			resp, err := http.DefaultClient.Do(req)
			if err == nil {
				resp.Body.Close()
				answered = fmt.Errorf("the delayed request was answered %d", resp.StatusCode)
			} else {
				answered = nil
			}
		}()
		for gw.Requests() == 0 {
			time.Sleep(time.Millisecond)
		}
	})
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("closing the gateway did not end the delayed request")
	}
	if answered != nil { // written before wg.Done, read after done
		t.Errorf("%v; want the connection dropped, as a gateway going away does", answered)
	}
}

func TestConcurrentUse(t *testing.T) {
	t.Parallel()
	gw := gatewaytest.New(t)
	gw.SetPayment("1", `{}`)
	var wg sync.WaitGroup
	for i := range 20 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			req, _ := http.NewRequest(http.MethodGet, gw.URL()+"/payments/1", nil)
			req.Header.Set("Authorization", "Bearer "+gw.Token())
			resp, err := gw.Client().Do(req)
			if err != nil {
				t.Errorf("request %d: %v", i, err)
				return
			}
			resp.Body.Close()
		}()
		if i%5 == 0 {
			gw.SetPayment("1", `{"v":1}`)
			gw.Delay(time.Millisecond)
			gw.FailNext(1, http.StatusInternalServerError)
		}
	}
	wg.Wait()
	if gw.Requests() != 20 {
		t.Fatalf("Requests = %d, want 20", gw.Requests())
	}
}
