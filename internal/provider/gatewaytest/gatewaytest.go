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
	"net"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"
)

// DefaultToken is the API token New expects.
const DefaultToken = "gatewaytest-access-token"

// Gateway is a running fake gateway API. Its methods are safe for concurrent
// use. Build it with New or NewWithToken, closed when the test ends, or
// with Serve outside a test.
type Gateway struct {
	*server // bodies by payment id
	token   string
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
	g.start(nil, g.handler())
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
	g.start(ln, g.handler())
	return g, nil
}

func newGateway(t testing.TB, token string) *Gateway {
	return &Gateway{server: newServer(t, paymentID), token: token}
}

// handler checks the token, then routes.
func (g *Gateway) handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /v1/payments/{id}", g.payment)
	mux.HandleFunc("GET /payments/{id}", g.payment)
	return guard(mux, func(w http.ResponseWriter, r *http.Request) bool {
		if r.Header.Get("Authorization") != "Bearer "+g.token {
			writeJSON(w, http.StatusUnauthorized, apiError("invalid token", "unauthorized", http.StatusUnauthorized))
			return false
		}
		return true
	}, apiError("resource not found", "not_found", http.StatusNotFound))
}

// Token is the API token the gateway expects as a Bearer token.
func (g *Gateway) Token() string { return g.token }

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
	g.set("SetPayment", id, body)
}

// DeletePayment makes the gateway answer 404 for payment id.
func (g *Gateway) DeletePayment(id string) { g.remove(id) }

func (g *Gateway) payment(w http.ResponseWriter, r *http.Request) {
	g.answer(w, r.PathValue("id"), true, apiError("Payment not found", "not_found", http.StatusNotFound))
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

// apiError is Mercado Pago's error body shape.
func apiError(message, code string, status int) map[string]any {
	return map[string]any{"message": message, "error": code, "status": status, "cause": []any{}}
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
