package gatewaytest_test

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net"
	"net/http"
	"testing"
	"time"

	"github.com/paystream/paystream/internal/provider/gatewaytest"
)

// zoopGet requests path from z with basic auth user:pass (none when user is
// empty) and returns the status and body.
func zoopGet(t *testing.T, z *gatewaytest.Zoop, ctx context.Context, path, user, pass string) (int, string, error) {
	t.Helper()
	return zoopGetWith(t, z.Client(), z, ctx, path, user, pass)
}

func zoopGetWith(t *testing.T, client *http.Client, z *gatewaytest.Zoop, ctx context.Context, path, user, pass string) (int, string, error) {
	t.Helper()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, z.URL()+path, nil)
	if err != nil {
		t.Fatal(err)
	}
	if user != "" {
		req.SetBasicAuth(user, pass)
	}
	resp, err := client.Do(req)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, string(b), nil
}

// TestZoopServesTransactionsWithBasicAuth: the transaction is served at its
// marketplace's path to the API key with an empty password; anything else
// is 401 or 404 with a JSON body, and every request counts.
func TestZoopServesTransactionsWithBasicAuth(t *testing.T) {
	t.Parallel()
	z := gatewaytest.NewZoop(t)
	at := time.Date(2020, 7, 6, 14, 1, 48, 0, time.UTC)
	id := "32df0dd9c57143ef8cc46924f4ba9e98"
	z.SetTransaction(id, gatewaytest.ZoopTransaction{
		ID: id, Resource: "transaction", Status: "succeeded", Amount: "1484.34", Currency: "BRL", PaymentType: "credit",
		Captured: true, URI: "/v1/marketplaces/" + z.MarketplaceID() + "/transactions/" + id, CreatedAt: gatewaytest.ZoopTime(at),
		History: []gatewaytest.ZoopHistory{{ID: "h1", Transaction: id, Amount: "1484.34", OperationType: "authorization", Status: "succeeded", CreatedAt: gatewaytest.ZoopHistoryTime(at)}},
	})
	path := "/v1/marketplaces/" + z.MarketplaceID() + "/transactions/" + id
	ctx := context.Background()

	status, body, err := zoopGet(t, z, ctx, path, z.APIKey(), "")
	if err != nil || status != http.StatusOK {
		t.Fatalf("GET = %d, %v", status, err)
	}
	var got map[string]any
	if err := json.Unmarshal([]byte(body), &got); err != nil {
		t.Fatal(err)
	}
	if got["amount"] != "1484.34" || got["created_at"] != "2020-07-06T14:01:48+00:00" {
		t.Fatalf("body %s", body)
	}
	if h := got["history"].([]any)[0].(map[string]any); h["created_at"] != "2020-07-06 14:01:48" {
		t.Fatalf("history time %v", h["created_at"])
	}

	for _, c := range []struct{ user, pass string }{{"", ""}, {"wrong", ""}, {z.APIKey(), "x"}} {
		if status, body, _ := zoopGet(t, z, ctx, path, c.user, c.pass); status != http.StatusUnauthorized || !json.Valid([]byte(body)) {
			t.Errorf("credential %q:%q: %d %q, want 401 with JSON", c.user, c.pass, status, body)
		}
	}
	for _, p := range []string{
		"/v1/marketplaces/other/transactions/" + id,
		"/v1/marketplaces/" + z.MarketplaceID() + "/transactions/unknown",
		"/v1/payments/" + id,
	} {
		if status, body, _ := zoopGet(t, z, ctx, p, z.APIKey(), ""); status != http.StatusNotFound || !json.Valid([]byte(body)) {
			t.Errorf("GET %s = %d %q, want 404 with JSON", p, status, body)
		}
	}
	if z.Requests() != 7 || z.RequestsFor(id) != 5 {
		t.Fatalf("Requests = %d, RequestsFor = %d; want 7, 5", z.Requests(), z.RequestsFor(id))
	}
	z.SetTransaction(id, "not json")
	if _, body, _ := zoopGet(t, z, ctx, path, z.APIKey(), ""); body != "not json" {
		t.Fatalf("verbatim body %q", body)
	}
	z.DeleteTransaction(id)
	if status, _, _ := zoopGet(t, z, ctx, path, z.APIKey(), ""); status != http.StatusNotFound {
		t.Fatalf("deleted: %d", status)
	}
}

// TestZoopFailuresAndDelay: FailNext fails exactly the next n requests
// (dropping the connection for status 0), and a delay longer than the
// client's deadline leaves the client with its deadline error.
func TestZoopFailuresAndDelay(t *testing.T) {
	t.Parallel()
	z := gatewaytest.NewZoopWith(t, "zpk_test_other", "mkt_1")
	z.SetTransaction("t1", `{}`)
	path := "/v1/marketplaces/mkt_1/transactions/t1"
	ctx := context.Background()
	z.FailNext(1, http.StatusServiceUnavailable)
	if status, _, _ := zoopGet(t, z, ctx, path, "zpk_test_other", ""); status != http.StatusServiceUnavailable {
		t.Fatalf("first: %d, want 503", status)
	}
	z.FailNext(1, 0)
	// Without keep-alives, so the transport does not retry the request on
	// a fresh connection.
	noReuse := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}}
	if _, _, err := zoopGetWith(t, noReuse, z, ctx, path, "zpk_test_other", ""); err == nil {
		t.Fatal("dropped connection: no error")
	}
	if status, _, err := zoopGet(t, z, ctx, path, "zpk_test_other", ""); status != http.StatusOK {
		t.Fatalf("after the failures: %d, %v", status, err)
	}
	z.Delay(time.Minute)
	short, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
	defer cancel()
	if _, _, err := zoopGet(t, z, short, path, "zpk_test_other", ""); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("slow answer: %v, want the client's deadline", err)
	}
}

// TestServeZoop: outside a test's lifetime the API serves on the listener
// it is given until Close.
func TestServeZoop(t *testing.T) {
	t.Parallel()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	z, err := gatewaytest.ServeZoop(ln, "zpk_test_serve", "mkt_serve")
	if err != nil {
		t.Fatal(err)
	}
	z.SetTransaction("t1", `{"id":"t1"}`)
	if status, body, err := zoopGet(t, z, context.Background(), "/v1/marketplaces/mkt_serve/transactions/t1", "zpk_test_serve", ""); err != nil || status != http.StatusOK || body != `{"id":"t1"}` {
		t.Fatalf("GET = %d %q, %v", status, body, err)
	}
	z.Close()
	z.Close() // idempotent
	if _, _, err := zoopGetWith(t, &http.Client{}, z, context.Background(), "/v1/marketplaces/mkt_serve/transactions/t1", "zpk_test_serve", ""); err == nil {
		t.Fatal("closed API still answers")
	}
	if _, err := gatewaytest.ServeZoop(ln, "", "mkt"); err == nil {
		t.Fatal("ServeZoop accepted an empty API key")
	}
}
