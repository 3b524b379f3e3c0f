package gatewaytest

import (
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/paystream/paystream/internal/money"
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
	*server     // bodies by transaction id
	apiKey      string
	marketplace string
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
	z.start(nil, z.handler())
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
	z.start(ln, z.handler())
	return z, nil
}

func newZoop(t testing.TB, apiKey, marketplaceID string) (*Zoop, error) {
	if apiKey == "" || marketplaceID == "" || strings.Contains(marketplaceID, "/") {
		return nil, errors.New("gatewaytest: a Zoop API needs an API key and a marketplace id without '/'")
	}
	return &Zoop{server: newServer(t, zoopTransactionID), apiKey: apiKey, marketplace: marketplaceID}, nil
}

// handler checks basic auth, then routes.
func (z *Zoop) handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /v1/marketplaces/{marketplace}/transactions/{id}", z.transaction)
	return guard(mux, func(w http.ResponseWriter, r *http.Request) bool {
		if user, pass, ok := r.BasicAuth(); !ok || user != z.apiKey || pass != "" {
			w.Header().Set("WWW-Authenticate", `Basic realm="zoop"`)
			writeJSON(w, http.StatusUnauthorized, zoopError("Unauthorized", "unauthorized", "Invalid API key", http.StatusUnauthorized))
			return false
		}
		return true
	}, zoopError("Not Found", "resource_not_found", "Resource not found", http.StatusNotFound))
}

// APIKey is the key the API expects as the basic-auth user.
func (z *Zoop) APIKey() string { return z.apiKey }

// MarketplaceID is the marketplace the API serves.
func (z *Zoop) MarketplaceID() string { return z.marketplace }

// SourcesYAML is a sources file whose one source, zoop, takes webhooks
// authenticated with secret and refetches from this API: its marketplace
// as the account, its URL and API key, refetch_rate 1000 (no waiting in
// tests) and refetch_timeout timeout ("2s").
func (z *Zoop) SourcesYAML(secret, timeout string) string {
	return fmt.Sprintf(`
sources:
  - name: zoop
    driver: zoop
    account: %s
    secrets: [%q]
    api_base_url: %s
    api_token: %s
    refetch_rate: 1000
    refetch_timeout: %s
`, z.marketplace, secret, z.URL(), z.apiKey, timeout)
}

// SetTransaction sets (or replaces) what the API answers for transaction
// id. body is sent verbatim when it is a []byte, string or json.RawMessage,
// else as its JSON encoding (ZoopTransaction, a map…). Call it from the
// test's goroutine: it fails the test (panics, under ServeZoop) when body
// cannot be encoded.
func (z *Zoop) SetTransaction(id string, body any) {
	if z.t != nil {
		z.t.Helper()
	}
	z.set("SetTransaction", id, body)
}

// DeleteTransaction makes the API answer 404 for transaction id.
func (z *Zoop) DeleteTransaction(id string) { z.remove(id) }

func (z *Zoop) transaction(w http.ResponseWriter, r *http.Request) {
	z.answer(w, r.PathValue("id"), r.PathValue("marketplace") == z.marketplace,
		zoopError("Not Found", "resource_not_found", "Transaction not found", http.StatusNotFound))
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

// ZoopCardLifecycle is a card transaction of BRL 250.00 of marketplace as
// Zoop's API shows it at a stage of its life: 0 pre-authorized, 1
// captured, 2 partially voided (50.00), 3 voided in full (canceled). Its
// history ids derive from id; times start on 2 November 2026, 10:00 UTC.
func ZoopCardLifecycle(marketplace, id string, stage int) ZoopTransaction {
	t0 := time.Date(2026, 11, 2, 10, 0, 0, 0, time.UTC)
	h := func(hid, opType string, amount int64, at time.Time) ZoopHistory {
		return ZoopHistory{ID: hid, Transaction: id, Amount: money.Format(amount, "BRL"), OperationType: opType, Status: "succeeded", CreatedAt: ZoopHistoryTime(at)}
	}
	tx := ZoopTransaction{
		ID: id, Resource: "transaction", Status: "pre_authorized", Amount: "250.00", Currency: "BRL", PaymentType: "credit",
		OnBehalfOf: "de9bddee5f9f436d909e7bafaa43af24", Metadata: map[string]string{"order_id": "10293"},
		URI: "/v1/marketplaces/" + marketplace + "/transactions/" + id, CreatedAt: ZoopTime(t0),
		History: []ZoopHistory{h(id[:8]+"h0", "created", 25000, t0), h(id[:8]+"h1", "pre_authorization", 25000, t0.Add(time.Second))},
	}
	tx.UpdatedAt = ZoopTime(t0.Add(time.Second))
	if stage >= 1 {
		tx.Status, tx.Captured = "succeeded", true
		tx.History = append(tx.History, h(id[:8]+"h2", "capture", 25000, t0.Add(time.Hour)))
		tx.UpdatedAt = ZoopTime(t0.Add(time.Hour))
	}
	if stage >= 2 {
		tx.History = append(tx.History, h(id[:8]+"v1", "void", 5000, t0.Add(24*time.Hour)))
		tx.UpdatedAt = ZoopTime(t0.Add(24 * time.Hour))
	}
	if stage >= 3 {
		tx.Status, tx.Voided = "canceled", true
		tx.History = append(tx.History, h(id[:8]+"v2", "void", 20000, t0.Add(48*time.Hour)))
		tx.UpdatedAt = ZoopTime(t0.Add(48 * time.Hour))
		tx.VoidedAt = tx.UpdatedAt
	}
	return tx
}
