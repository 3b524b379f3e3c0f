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

// Zoop's fake API defaults.
const (
	// DefaultZoopAPIKey is the API key NewZoop expects as the basic-auth
	// user.
	DefaultZoopAPIKey = "zpk_test_gatewaytest0123456789"
	// DefaultZoopMarketplace is the marketplace NewZoop serves.
	DefaultZoopMarketplace = "3249465a7753536b62545a6a684b0000"
)

// Zoop is a real HTTP server playing Zoop's API for the zoop driver's
// refetch tests. It answers
//
//	GET /v1/marketplaces/{marketplace_id}/transactions/{id}
//
// with the body a test set for that transaction, after checking HTTP basic
// auth: the API key as the user and an empty password, as Zoop's API
// expects. Answers:
//
//   - 401 when the credential is not "{api key}:";
//   - 404 for another marketplace, an id without a transaction, or any
//     other path;
//   - 200 with the transaction's body, Content-Type application/json.
//
// Like Gateway it can fail the next requests (FailNext), slow every answer
// (Delay) and count requests. To play an API that lies about the id, set a
// body whose id is another transaction's. Its methods are safe for
// concurrent use. Build it with NewZoop or NewZoopWith, closed when the
// test ends, or with ServeZoop outside a test.
type Zoop struct {
	t           testing.TB // nil when started by ServeZoop
	srv         *httptest.Server
	apiKey      string
	marketplace string
	done        chan struct{}
	closeOnce   sync.Once

	mu           sync.Mutex
	transactions map[string][]byte
	failLeft     int
	failStatus   int
	delay        time.Duration
	requests     int
	perID        map[string]int
}

// NewZoop starts a fake Zoop API for DefaultZoopMarketplace expecting
// DefaultZoopAPIKey, closed by t.Cleanup.
func NewZoop(t testing.TB) *Zoop {
	t.Helper()
	return NewZoopWith(t, DefaultZoopAPIKey, DefaultZoopMarketplace)
}

// NewZoopWith starts a fake Zoop API for marketplaceID expecting apiKey,
// closed by t.Cleanup.
func NewZoopWith(t testing.TB, apiKey, marketplaceID string) *Zoop {
	t.Helper()
	z, err := newZoop(t, apiKey, marketplaceID)
	if err != nil {
		t.Fatal(err)
	}
	z.srv = httptest.NewServer(z.handler())
	t.Cleanup(z.Close)
	return z
}

// ServeZoop starts a fake Zoop API for marketplaceID expecting apiKey on
// ln, outside a test (a simulator driving the pipeline); Close stops it.
// Without a test to fail, SetTransaction panics on a body it cannot
// encode.
func ServeZoop(ln net.Listener, apiKey, marketplaceID string) (*Zoop, error) {
	z, err := newZoop(nil, apiKey, marketplaceID)
	if err != nil {
		return nil, err
	}
	z.srv = httptest.NewUnstartedServer(z.handler())
	z.srv.Listener.Close()
	z.srv.Listener = ln
	z.srv.Start()
	return z, nil
}

func newZoop(t testing.TB, apiKey, marketplaceID string) (*Zoop, error) {
	if apiKey == "" || marketplaceID == "" || strings.Contains(marketplaceID, "/") {
		return nil, errors.New("gatewaytest: a Zoop API needs an API key and a marketplace id without '/'")
	}
	return &Zoop{
		t:            t,
		apiKey:       apiKey,
		marketplace:  marketplaceID,
		done:         make(chan struct{}),
		transactions: map[string][]byte{},
		perID:        map[string]int{},
	}, nil
}

func (z *Zoop) handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /v1/marketplaces/{marketplace}/transactions/{id}", z.transaction)
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, http.StatusNotFound, zoopError("Not Found", "resource_not_found", "Resource not found", http.StatusNotFound))
	})
	return z.front(mux)
}

// Close stops the API, dropping the connections it serves. NewZoop's and
// NewZoopWith's are closed when their test ends.
func (z *Zoop) Close() {
	z.closeOnce.Do(func() {
		close(z.done)
		z.srv.CloseClientConnections()
		z.srv.Close()
	})
}

// URL is the API's base URL (http://127.0.0.1:port, no trailing slash): the
// api_base_url of a zoop source under test.
func (z *Zoop) URL() string { return z.srv.URL }

// APIKey is the key the API expects as the basic-auth user.
func (z *Zoop) APIKey() string { return z.apiKey }

// MarketplaceID is the marketplace the API serves.
func (z *Zoop) MarketplaceID() string { return z.marketplace }

// Client returns an HTTP client for the API (the httptest server's).
func (z *Zoop) Client() *http.Client { return z.srv.Client() }

// SetTransaction sets (or replaces) what the API answers for transaction
// id. body is sent verbatim when it is a []byte, string or json.RawMessage,
// else as its JSON encoding (ZoopTransaction, a map…). Call it from the
// test's goroutine: it fails the test (panics, under ServeZoop) when body
// cannot be encoded.
func (z *Zoop) SetTransaction(id string, body any) {
	if z.t != nil {
		z.t.Helper()
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
			if z.t == nil {
				panic(fmt.Sprintf("gatewaytest: SetTransaction(%q): %v", id, err))
			}
			z.t.Fatalf("gatewaytest: SetTransaction(%q): %v", id, err)
		}
	}
	z.mu.Lock()
	defer z.mu.Unlock()
	z.transactions[id] = b
}

// DeleteTransaction makes the API answer 404 for transaction id.
func (z *Zoop) DeleteTransaction(id string) {
	z.mu.Lock()
	defer z.mu.Unlock()
	delete(z.transactions, id)
}

// FailNext makes the next n requests fail with HTTP status, as
// Gateway.FailNext does (0 drops the connection; 503 and 429 carry
// Retry-After).
func (z *Zoop) FailNext(n int, status int) {
	z.mu.Lock()
	defer z.mu.Unlock()
	z.failLeft, z.failStatus = max(n, 0), status
}

// Delay makes every answer (failures included) wait d; zero removes it.
func (z *Zoop) Delay(d time.Duration) {
	z.mu.Lock()
	defer z.mu.Unlock()
	z.delay = d
}

// Requests counts the requests the API received, whatever their answer.
func (z *Zoop) Requests() int {
	z.mu.Lock()
	defer z.mu.Unlock()
	return z.requests
}

// RequestsFor counts the requests for transaction id (of any marketplace),
// whatever their answer.
func (z *Zoop) RequestsFor(id string) int {
	z.mu.Lock()
	defer z.mu.Unlock()
	return z.perID[id]
}

func (z *Zoop) front(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		z.mu.Lock()
		z.requests++
		if id, ok := zoopTransactionID(r.URL.EscapedPath()); ok {
			z.perID[id]++
		}
		delay := z.delay
		fail, status := z.failLeft > 0, z.failStatus
		if fail {
			z.failLeft--
		}
		z.mu.Unlock()

		if delay > 0 {
			timer := time.NewTimer(delay)
			select {
			case <-timer.C:
			case <-r.Context().Done():
				timer.Stop()
				return
			case <-z.done:
				timer.Stop()
				return
			}
		}
		if fail {
			failWith(w, status)
			return
		}
		if user, pass, ok := r.BasicAuth(); !ok || user != z.apiKey || pass != "" {
			w.Header().Set("WWW-Authenticate", `Basic realm="zoop"`)
			writeJSON(w, http.StatusUnauthorized, zoopError("Unauthorized", "unauthorized", "Invalid API key", http.StatusUnauthorized))
			return
		}
		next.ServeHTTP(w, r)
	})
}

func (z *Zoop) transaction(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	z.mu.Lock()
	body, ok := z.transactions[id]
	z.mu.Unlock()
	if !ok || r.PathValue("marketplace") != z.marketplace {
		writeJSON(w, http.StatusNotFound, zoopError("Not Found", "resource_not_found", "Transaction not found", http.StatusNotFound))
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusOK)
	_, _ = w.Write(body)
}

// zoopTransactionID extracts {id}, unescaped, from the escaped path
// /v1/marketplaces/{marketplace}/transactions/{id}.
func zoopTransactionID(escaped string) (string, bool) {
	rest, ok := strings.CutPrefix(escaped, "/v1/marketplaces/")
	if !ok {
		return "", false
	}
	_, rest, ok = strings.Cut(rest, "/transactions/")
	if !ok || rest == "" || strings.Contains(rest, "/") {
		return "", false
	}
	id, err := url.PathUnescape(rest)
	return id, err == nil
}

// zoopError is an error body in the shape of Zoop's API errors.
func zoopError(status, category, message string, code int) map[string]any {
	return map[string]any{"error": map[string]any{
		"status": status, "status_code": code, "type": "invalid_request_error",
		"category": category, "message": message,
	}}
}

// ZoopTransaction is the part of Zoop's transaction resource
// (GET /v1/marketplaces/{marketplace_id}/transactions/{id}) the zoop driver
// reads, plus a few fields every real answer has. Amounts are decimal
// strings in reais ("1484.34"; money.Format gives them from centavos);
// times are in Zoop's formats (ZoopTime, ZoopHistoryTime).
type ZoopTransaction struct {
	ID          string            `json:"id"`
	Resource    string            `json:"resource"`
	Status      string            `json:"status"`
	Amount      string            `json:"amount"`
	Currency    string            `json:"currency"`
	PaymentType string            `json:"payment_type"`
	OnBehalfOf  string            `json:"on_behalf_of,omitempty"`
	Captured    bool              `json:"captured"`
	Voided      bool              `json:"voided"`
	Refunded    bool              `json:"refunded"`
	Metadata    map[string]string `json:"metadata"`
	URI         string            `json:"uri,omitempty"`
	CreatedAt   string            `json:"created_at"`
	UpdatedAt   string            `json:"updated_at,omitempty"`
	VoidedAt    string            `json:"voided_at,omitempty"`
	History     []ZoopHistory     `json:"history"`
}

// ZoopHistory is one entry of a ZoopTransaction's history.
type ZoopHistory struct {
	ID            string `json:"id"`
	Transaction   string `json:"transaction"`
	Amount        string `json:"amount"`
	OperationType string `json:"operation_type"`
	Status        string `json:"status"`
	CreatedAt     string `json:"created_at"`
}

// ZoopTime formats t as Zoop's resources do: "2020-07-06T14:01:48+00:00".
func ZoopTime(t time.Time) string { return t.UTC().Format("2006-01-02T15:04:05+00:00") }

// ZoopHistoryTime formats t as Zoop's history entries do, zone-less UTC:
// "2020-07-06 14:01:48".
func ZoopHistoryTime(t time.Time) string { return t.UTC().Format(time.DateTime) }
