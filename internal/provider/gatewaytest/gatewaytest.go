// Package gatewaytest is a real HTTP server (net/http/httptest) that plays a
// payment gateway's API in tests of the refetch path: it answers
//
//	GET /v1/payments/{id}   (Mercado Pago's payment resource)
//	GET /payments/{id}      (paystream's generic refetch convention)
//
// with the body a test set for that payment, after checking the request's
// "Authorization: Bearer {token}". A test can make the next requests fail
// (circuit-breaker tests), slow every answer down (timeouts) and count the
// requests it received (rate limiting, caching).
//
//	gw := gatewaytest.New(t)
//	gw.SetPayment("123", gatewaytest.MercadoPagoPayment{ID: 123, Status: "approved", …})
//	req, _ := driver.RefetchRequest(ctx, gw.URL(), gw.Token(), "123")
//
// Answers:
//
//   - 401 with {"message":"invalid token","error":"unauthorized","status":401}
//     when the Authorization header is not "Bearer {token}";
//   - 404 with {"message":"Payment not found","error":"not_found","status":404}
//     for an id without a payment, or any other path;
//   - 200 with the payment's body, Content-Type application/json.
//
// Every request counts in Requests, whatever its answer.
package gatewaytest

import (
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"
)

// DefaultToken is the API token New expects.
const DefaultToken = "gatewaytest-access-token"

// Gateway is a running fake gateway API. Its methods are safe for concurrent
// use. Build it with New or NewWithToken, closed when the test ends, or
// with Serve outside a test.
type Gateway struct {
	t         testing.TB // nil when started by Serve
	srv       *httptest.Server
	token     string
	done      chan struct{}
	closeOnce sync.Once

	mu         sync.Mutex
	payments   map[string][]byte
	failLeft   int
	failStatus int
	delay      time.Duration
	requests   int
	perID      map[string]int
}

// New starts a gateway expecting DefaultToken, closed by t.Cleanup.
func New(t testing.TB) *Gateway {
	t.Helper()
	return NewWithToken(t, DefaultToken)
}

// NewWithToken starts a gateway expecting token, closed by t.Cleanup.
func NewWithToken(t testing.TB, token string) *Gateway {
	t.Helper()
	if token == "" {
		t.Fatal("gatewaytest: empty token")
	}
	g := newGateway(t, token)
	g.srv = httptest.NewServer(g.handler())
	t.Cleanup(g.Close)
	return g
}

// Serve starts a gateway expecting token on ln, outside a test (paystream
// simulate serves one to the pipeline it drives); Close stops it. Without
// a test to fail, SetPayment panics on a body it cannot encode.
func Serve(ln net.Listener, token string) (*Gateway, error) {
	if token == "" {
		return nil, errors.New("gatewaytest: empty token")
	}
	g := newGateway(nil, token)
	g.srv = httptest.NewUnstartedServer(g.handler())
	g.srv.Listener.Close()
	g.srv.Listener = ln
	g.srv.Start()
	return g, nil
}

// Close stops the gateway, dropping the connections it serves. New and
// NewWithToken's gateways are closed when their test ends.
func (g *Gateway) Close() {
	g.closeOnce.Do(func() {
		close(g.done)
		g.srv.CloseClientConnections()
		g.srv.Close()
	})
}

func newGateway(t testing.TB, token string) *Gateway {
	return &Gateway{
		t:        t,
		token:    token,
		done:     make(chan struct{}),
		payments: map[string][]byte{},
		perID:    map[string]int{},
	}
}

func (g *Gateway) handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /v1/payments/{id}", g.payment)
	mux.HandleFunc("GET /payments/{id}", g.payment)
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, http.StatusNotFound, apiError("resource not found", "not_found", http.StatusNotFound))
	})
	return g.front(mux)
}

// URL is the gateway's base URL (http://127.0.0.1:port, no trailing
// slash): the api_base_url of a source under test.
func (g *Gateway) URL() string { return g.srv.URL }

// Token is the API token the gateway expects as a Bearer token.
func (g *Gateway) Token() string { return g.token }

// Client returns an HTTP client for the gateway (the httptest server's).
func (g *Gateway) Client() *http.Client { return g.srv.Client() }

// SetPayment sets (or replaces) what the gateway answers for payment id, at
// both /v1/payments/{id} and /payments/{id}. body is sent verbatim when it
// is a []byte, string or json.RawMessage (so tests can serve malformed or
// hostile JSON), else as its JSON encoding (MercadoPagoPayment, Payment, a
// map…). Call it from the test's goroutine: it fails the test when body
// cannot be encoded.
func (g *Gateway) SetPayment(id string, body any) {
	if g.t != nil {
		g.t.Helper()
	}
	var b []byte
	switch v := body.(type) {
	case []byte:
		b = append([]byte(nil), v...)
	case json.RawMessage:
		b = append([]byte(nil), v...)
	case string:
		b = []byte(v)
	default:
		var err error
		if b, err = json.Marshal(body); err != nil {
			if g.t == nil {
				panic(fmt.Sprintf("gatewaytest: SetPayment(%q): %v", id, err))
			}
			g.t.Fatalf("gatewaytest: SetPayment(%q): %v", id, err)
		}
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	g.payments[id] = b
}

// DeletePayment makes the gateway answer 404 for payment id.
func (g *Gateway) DeletePayment(id string) {
	g.mu.Lock()
	defer g.mu.Unlock()
	delete(g.payments, id)
}

// FailNext makes the next n requests, whatever their path or token, fail
// with HTTP status (for example 500, 503 or 429; 503 and 429 carry
// "Retry-After: 1"). Status 0 drops the connection without an answer, as a
// crashed gateway or a reset does. It replaces any failures still pending;
// n <= 0 cancels them.
func (g *Gateway) FailNext(n int, status int) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.failLeft, g.failStatus = max(n, 0), status
}

// Delay makes every answer (including failures) wait d before it is
// written; zero removes the delay. A request whose client gives up first
// (timeout, canceled context) gets no answer.
func (g *Gateway) Delay(d time.Duration) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.delay = d
}

// Requests counts the requests the gateway received, whatever their answer.
func (g *Gateway) Requests() int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.requests
}

// RequestsFor counts the requests for payment id, on either path, whatever
// their answer.
func (g *Gateway) RequestsFor(id string) int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.perID[id]
}

// front counts every request, then applies the delay and the failures
// before the mux sees the request.
func (g *Gateway) front(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		g.mu.Lock()
		g.requests++
		if id, ok := paymentID(r.URL.EscapedPath()); ok {
			g.perID[id]++
		}
		delay := g.delay
		fail, status := g.failLeft > 0, g.failStatus
		if fail {
			g.failLeft--
		}
		g.mu.Unlock()

		if delay > 0 {
			timer := time.NewTimer(delay)
			select {
			case <-timer.C:
			case <-r.Context().Done():
				timer.Stop()
				return
			case <-g.done:
				timer.Stop()
				return
			}
		}
		if fail {
			failWith(w, status)
			return
		}
		if r.Header.Get("Authorization") != "Bearer "+g.token {
			writeJSON(w, http.StatusUnauthorized, apiError("invalid token", "unauthorized", http.StatusUnauthorized))
			return
		}
		next.ServeHTTP(w, r)
	})
}

func (g *Gateway) payment(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	g.mu.Lock()
	body, ok := g.payments[id]
	g.mu.Unlock()
	if !ok {
		writeJSON(w, http.StatusNotFound, apiError("Payment not found", "not_found", http.StatusNotFound))
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusOK)
	_, _ = w.Write(body)
}

// paymentID extracts {id}, unescaped, from the escaped path
// /v1/payments/{id} or /payments/{id}, as the mux's pattern does.
func paymentID(escaped string) (string, bool) {
	for _, prefix := range []string{"/v1/payments/", "/payments/"} {
		if seg, ok := strings.CutPrefix(escaped, prefix); ok && seg != "" && !strings.Contains(seg, "/") {
			id, err := url.PathUnescape(seg)
			return id, err == nil
		}
	}
	return "", false
}

func failWith(w http.ResponseWriter, status int) {
	if status == 0 {
		if hj, ok := w.(http.Hijacker); ok {
			if conn, _, err := hj.Hijack(); err == nil {
				_ = conn.Close()
				return
			}
		}
		// No hijacking (HTTP/2): abort the handler, which resets the stream.
		panic(http.ErrAbortHandler)
	}
	if status == http.StatusServiceUnavailable || status == http.StatusTooManyRequests {
		w.Header().Set("Retry-After", "1")
	}
	writeJSON(w, status, apiError(http.StatusText(status), "gatewaytest_failure", status))
}

// apiError is Mercado Pago's error body shape.
func apiError(message, code string, status int) map[string]any {
	return map[string]any{"message": message, "error": code, "status": status, "cause": []any{}}
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	b, _ := json.Marshal(v)
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_, _ = w.Write(b)
}

// MercadoPagoPayment is the part of Mercado Pago's payment resource
// (GET /v1/payments/{id}) the mercadopago driver reads. Amounts are decimal
// text in major units of CurrencyID ("259.90"; money.Format gives it from
// minor units), as Mercado Pago sends them.
type MercadoPagoPayment struct {
	ID                        int64               `json:"id"`
	Status                    string              `json:"status"`
	StatusDetail              string              `json:"status_detail,omitempty"`
	CurrencyID                string              `json:"currency_id"`
	TransactionAmount         json.Number         `json:"transaction_amount"`
	TransactionAmountRefunded json.Number         `json:"transaction_amount_refunded,omitempty"`
	DateCreated               time.Time           `json:"date_created"`
	DateApproved              *time.Time          `json:"date_approved"`
	DateLastUpdated           time.Time           `json:"date_last_updated"`
	Refunds                   []MercadoPagoRefund `json:"refunds"`
}

// MercadoPagoRefund is one entry of a MercadoPagoPayment's refunds.
type MercadoPagoRefund struct {
	ID          int64       `json:"id"`
	PaymentID   int64       `json:"payment_id,omitempty"`
	Amount      json.Number `json:"amount"`
	Status      string      `json:"status,omitempty"`
	DateCreated time.Time   `json:"date_created"`
}

// Payment is the answer of paystream's generic refetch convention (see
// standardwebhooks.RefetchPayment). Amounts are minor units of Currency.
type Payment struct {
	PaymentID string     `json:"payment_id"`
	Status    string     `json:"status"`
	Amount    int64      `json:"amount,omitempty"`
	Currency  string     `json:"currency,omitempty"`
	PaidAt    *time.Time `json:"paid_at,omitempty"`
	UpdatedAt time.Time  `json:"updated_at"`
	Refunds   []Refund   `json:"refunds,omitempty"`
}

// Refund is one refund of a Payment.
type Refund struct {
	ID        string    `json:"id"`
	Amount    int64     `json:"amount"`
	CreatedAt time.Time `json:"created_at"`
}
