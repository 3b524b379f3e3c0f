package zoop

import (
	"encoding/base64"
	"errors"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/paystream/paystream/internal/payment"
	"github.com/paystream/paystream/internal/provider"
	"github.com/paystream/paystream/internal/provider/providertest"
)

const (
	marketplace = "3249465a7753536b62545a6a684b0000"
	oldSecret   = "paystream:old-webhook-password-5d2c"
	newSecret   = "paystream:new-webhook-password-8e1f"
	wrongSecret = "paystream:bad-webhook-password-0000"
	txID        = "32df0dd9c57143ef8cc46924f4ba9e98"
)

// succeededEvent is a transaction.succeeded delivery shaped as Zoop sends
// it: the event resource with the whole transaction in payload.object.
const succeededEvent = `{
	"id": "cf4679634d4e4b6dbc9fa8990c8f01f9",
	"type": "transaction.succeeded",
	"resource": "event",
	"payload": {
		"object": {
			"id": "32df0dd9c57143ef8cc46924f4ba9e98",
			"resource": "transaction",
			"status": "succeeded",
			"amount": "1484.34",
			"original_amount": "1484.34",
			"currency": "BRL",
			"description": "venda e-commerce",
			"payment_type": "credit",
			"on_behalf_of": "de9bddee5f9f436d909e7bafaa43af24",
			"refunded": false,
			"voided": false,
			"captured": true,
			"fees": "65.16",
			"uri": "/v1/marketplaces/3249465a7753536b62545a6a684b0000/transactions/32df0dd9c57143ef8cc46924f4ba9e98",
			"metadata": {"order_id": "10293"},
			"created_at": "2020-07-06T14:01:48+00:00",
			"updated_at": "2020-07-06T14:01:51+00:00",
			"history": [
				{"id": "55c74c53e21a461b9fc5a30af31b124f", "transaction": "32df0dd9c57143ef8cc46924f4ba9e98", "amount": "1484.34", "operation_type": "created", "status": "succeeded", "created_at": "2020-07-06 14:01:48"},
				{"id": "61a04f44a3f7451da0356e20488f1ade", "transaction": "32df0dd9c57143ef8cc46924f4ba9e98", "amount": "1484.34", "operation_type": "authorization", "status": "succeeded", "response_code": "00", "authorizer": "cielo", "created_at": "2020-07-06 14:01:51"}
			]
		}
	},
	"source": null,
	"name": null,
	"uri": "/v1/marketplaces/3249465a7753536b62545a6a684b0000/events/cf4679634d4e4b6dbc9fa8990c8f01f9",
	"created_at": "2020-07-06T14:01:51+0000",
	"updated_at": "2020-07-06T14:01:51+0000"
}`

// webhook builds a compact event of type typ about transaction id.
func webhook(eventID, typ, id, createdAt string) []byte {
	return []byte(`{"id":"` + eventID + `","type":"` + typ + `","resource":"event","payload":{"object":{"id":"` + id +
		`","resource":"transaction","status":"succeeded","amount":"10.00","currency":"BRL"}},"created_at":"` + createdAt + `"}`)
}

var eventAt = time.Date(2020, 7, 6, 14, 1, 51, 0, time.UTC)

func want(eventID, typ string, s payment.Status) *provider.Event {
	return &provider.Event{EventID: eventID, DedupKey: eventID, PaymentID: txID, Type: typ, NeedsRefetch: true,
		Fact: payment.Fact{Status: s, OccurredAt: eventAt}}
}

var fixtures = []providertest.Fixture{
	{Name: "transaction.succeeded", Body: []byte(succeededEvent), Want: want("cf4679634d4e4b6dbc9fa8990c8f01f9", "transaction.succeeded", payment.StatusPaid)},
	{Name: "transaction.pre_authorized", Body: webhook("e1", "transaction.pre_authorized", txID, "2020-07-06T14:01:51+0000"),
		Want: want("e1", "transaction.pre_authorized", payment.StatusAuthorized)},
	{Name: "transaction.created", Body: webhook("e2", "transaction.created", txID, "2020-07-06T14:01:51+00:00"),
		Want: want("e2", "transaction.created", payment.StatusPending)},
	{Name: "transaction.canceled: the refetch decides", Body: webhook("e3", "transaction.canceled", txID, "2020-07-06T14:01:51Z"),
		Want: want("e3", "transaction.canceled", "")},
	{Name: "transaction.charged_back", Body: webhook("e4", "transaction.charged_back", txID, "2020-07-06 14:01:51"),
		Want: want("e4", "transaction.charged_back", payment.StatusDisputeLost)},
	{Name: "resource without payload wrapper, no event id: derived key",
		Body: []byte(`{"type":"transaction.pre_authorization.succeeded","resource":"transaction","description":"A $14.99 transaction has successfully pre-authorized","created_at":"2020-07-06T14:01:51+00:00","object":{"id":"` + txID + `","resource":"transaction","status":"pre_authorized","amount":"14.99"}}`),
		Want: &provider.Event{
			DedupKey: provider.BusinessKey(txID, "transaction.pre_authorization.succeeded", payment.StatusAuthorized, eventAt), PaymentID: txID,
			Type: "transaction.pre_authorization.succeeded", NeedsRefetch: true, Fact: payment.Fact{Status: payment.StatusAuthorized, OccurredAt: eventAt}}},
	{Name: "seller event", Body: []byte(`{"id":"e5","type":"seller.activated","resource":"event","payload":{"object":{"id":"de9bddee5f9f436d909e7bafaa43af24","resource":"seller"}}}`), Irrelevant: true},
	{Name: "buyer-scoped transaction event", Body: webhook("e6", "buyer.transaction.succeeded", txID, "2020-07-06T14:01:51+0000"), Irrelevant: true},
	{Name: "commission", Body: webhook("e7", "transaction.commission.succeeded", txID, "2020-07-06T14:01:51+0000"), Irrelevant: true},
	{Name: "unknown transaction event", Body: webhook("e8", "transaction.exploded", txID, "2020-07-06T14:01:51+0000")},
	{Name: "missing type", Body: []byte(`{"id":"e9","payload":{"object":{"id":"` + txID + `"}}}`)},
	{Name: "missing payload.object", Body: []byte(`{"id":"e10","type":"transaction.succeeded","payload":{}}`)},
	{Name: "transaction id that could steer a path", Body: webhook("e11", "transaction.succeeded", "..%2f..%2fsellers", "2020-07-06T14:01:51+0000")},
	{Name: "object is not a transaction", Body: []byte(`{"id":"e12","type":"transaction.succeeded","payload":{"object":{"id":"` + txID + `","resource":"seller"}}}`)},
	{Name: "another marketplace", Body: []byte(`{"id":"e13","type":"transaction.succeeded","uri":"/v1/marketplaces/ffff465a7753536b62545a6a684b0000/events/e13","payload":{"object":{"id":"` + txID + `"}}}`)},
	{Name: "id as a number", Body: []byte(`{"id":13,"type":"transaction.succeeded","payload":{"object":{"id":"` + txID + `"}}}`)},
	{Name: "bad created_at", Body: webhook("e14", "transaction.succeeded", txID, "06/07/2020")},
	{Name: "neither id nor created_at", Body: []byte(`{"type":"transaction.succeeded","payload":{"object":{"id":"` + txID + `"}}}`)},
}

func config() provider.Config {
	return provider.Config{Options: map[string]string{OptionMarketplaceID: marketplace}}
}

func harness() providertest.Harness {
	return providertest.Harness{
		New:         New,
		Config:      config(),
		OldSecret:   oldSecret,
		NewSecret:   newSecret,
		WrongSecret: wrongSecret,
		Sign: func(t testing.TB, secret string, body []byte, ts time.Time) *provider.Request {
			r := &provider.Request{Header: http.Header{}, Query: url.Values{}, Body: body, Now: ts}
			r.Header.Set(HeaderAuthorization, Sign(secret))
			r.Header.Set("Content-Type", "application/json")
			return r
		},
		RequiredHeaders: []string{HeaderAuthorization},
		BodyUnsigned:    true,
		RefetchAll:      true,
		Tampers: map[string]func(*provider.Request){
			"other user": func(r *provider.Request) {
				r.Header.Set(HeaderAuthorization, Sign("someone:old-webhook-password-5d2c"))
			},
			"password one byte off": func(r *provider.Request) {
				r.Header.Set(HeaderAuthorization, Sign("paystream:old-webhook-password-5d2d"))
			},
			"password prefix only": func(r *provider.Request) {
				r.Header.Set(HeaderAuthorization, Sign("paystream:old-webhook-password-5d2"))
			},
			"bearer scheme":        func(r *provider.Request) { r.Header.Set(HeaderAuthorization, "Bearer "+oldSecret) },
			"credential unencoded": func(r *provider.Request) { r.Header.Set(HeaderAuthorization, "Basic "+oldSecret) },
			"no colon": func(r *provider.Request) {
				r.Header.Set(HeaderAuthorization, Sign("paystreamold-webhook-password-5d2c"))
			},
			"second header": func(r *provider.Request) { r.Header.Add(HeaderAuthorization, Sign(wrongSecret)) },
			"credential in query": func(r *provider.Request) {
				r.Header.Del(HeaderAuthorization)
				r.Query.Set(DefaultQueryParam, oldSecret)
			},
			"url-safe base64": func(r *provider.Request) {
				r.Header.Set(HeaderAuthorization, "Basic "+base64.RawURLEncoding.EncodeToString([]byte(oldSecret+"\xff")))
			},
			"trailing byte appended": func(r *provider.Request) { r.Header.Set(HeaderAuthorization, Sign(oldSecret+" ")) },
		},
		Fixtures: fixtures,
	}
}

func TestConformance(t *testing.T) { providertest.Conformance(t, harness()) }

// TestKnownAnswer checks Sign against RFC 7617's example, and that Verify
// accepts exactly what net/http's SetBasicAuth sends for the configured
// credential, whatever the case of the scheme.
func TestKnownAnswer(t *testing.T) {
	t.Parallel()
	if got, want := Sign("Aladdin:open sesame"), "Basic QWxhZGRpbjpvcGVuIHNlc2FtZQ=="; got != want {
		t.Fatalf("Sign = %q, want %q (RFC 7617 section 2)", got, want)
	}
	d, err := New(provider.Config{Secrets: []string{"Aladdin:open sesame, 16 bytes+"}, Account: marketplace})
	if err != nil {
		t.Fatal(err)
	}
	req, _ := http.NewRequest(http.MethodPost, "http://127.0.0.1/webhooks/zoop", nil)
	req.SetBasicAuth("Aladdin", "open sesame, 16 bytes+")
	r := &provider.Request{Header: req.Header, Query: url.Values{}}
	if err := d.Verify(r); err != nil {
		t.Fatalf("Verify(SetBasicAuth): %v", err)
	}
	r.Header.Set(HeaderAuthorization, "bAsIc "+strings.TrimPrefix(req.Header.Get(HeaderAuthorization), "Basic "))
	if err := d.Verify(r); err != nil {
		t.Fatalf("Verify with the scheme in mixed case: %v", err)
	}
}

// TestQueryAuth: with auth query, the token is read from the configured
// query parameter, once, compared in full; the Authorization header plays
// no part.
func TestQueryAuth(t *testing.T) {
	t.Parallel()
	token := "q-token-0123456789abcdef"
	d, err := New(provider.Config{Secrets: []string{token, "q-token-rotated-000000"}, Options: map[string]string{
		OptionAuth: AuthQuery, OptionQueryParam: "paystream_token", OptionMarketplaceID: marketplace}})
	if err != nil {
		t.Fatal(err)
	}
	verify := func(q url.Values, h http.Header) error {
		if h == nil {
			h = http.Header{}
		}
		return d.Verify(&provider.Request{Header: h, Query: q, Body: []byte(succeededEvent)})
	}
	if err := verify(url.Values{"paystream_token": {token}}, nil); err != nil {
		t.Fatalf("right token: %v", err)
	}
	if err := verify(url.Values{"paystream_token": {"q-token-rotated-000000"}}, nil); err != nil {
		t.Fatalf("rotated token: %v", err)
	}
	for name, tc := range map[string]struct {
		q      url.Values
		h      http.Header
		reason string
	}{
		"absent":              {url.Values{}, nil, provider.ReasonMissingHeader},
		"empty":               {url.Values{"paystream_token": {""}}, nil, provider.ReasonMissingHeader},
		"other parameter":     {url.Values{"token": {token}}, nil, provider.ReasonMissingHeader},
		"basic auth instead":  {url.Values{}, http.Header{HeaderAuthorization: {Sign("u:" + token)}}, provider.ReasonMissingHeader},
		"twice":               {url.Values{"paystream_token": {token, token}}, nil, provider.ReasonMalformedHeader},
		"wrong":               {url.Values{"paystream_token": {"q-token-0123456789abcdeF"}}, nil, provider.ReasonBadSignature},
		"prefix of the token": {url.Values{"paystream_token": {token[:len(token)-1]}}, nil, provider.ReasonBadSignature},
	} {
		var ve *provider.VerifyError
		if err := verify(tc.q, tc.h); !errors.As(err, &ve) || ve.Reason != tc.reason {
			t.Errorf("%s: Verify = %v, want reason %s", name, err, tc.reason)
		}
	}
}

// TestNew: the marketplace comes from the option or the account; bad
// options and weak or malformed secrets are refused, naming the field and
// never quoting the secret.
func TestNew(t *testing.T) {
	t.Parallel()
	d, err := New(provider.Config{Secrets: []string{oldSecret}, Account: "acct_mkt"})
	if err != nil {
		t.Fatal(err)
	}
	if got := d.(*Driver).Marketplace(); got != "acct_mkt" {
		t.Fatalf("marketplace from the account = %q", got)
	}
	d, err = New(provider.Config{Secrets: []string{oldSecret}, Account: "scope", Options: map[string]string{OptionMarketplaceID: marketplace}})
	if err != nil {
		t.Fatal(err)
	}
	if got := d.(*Driver).Marketplace(); got != marketplace {
		t.Fatalf("marketplace option = %q", got)
	}
	if mode, param := d.(*Driver).Auth(); mode != AuthBasic || param != "" {
		t.Fatalf("default auth = %q, %q", mode, param)
	}
	secret := "s3cr3t-value-that-must-not-leak"
	for name, cfg := range map[string]provider.Config{
		"no secrets":               {Account: marketplace},
		"no marketplace":           {Secrets: []string{oldSecret}},
		"marketplace with a slash": {Secrets: []string{oldSecret}, Account: "a/b"},
		"unknown option":           {Secrets: []string{oldSecret}, Account: marketplace, Options: map[string]string{"header": "X"}},
		"unknown auth":             {Secrets: []string{oldSecret}, Account: marketplace, Options: map[string]string{OptionAuth: "hmac"}},
		"query_param with basic":   {Secrets: []string{oldSecret}, Account: marketplace, Options: map[string]string{OptionQueryParam: "t"}},
		"no colon":                 {Secrets: []string{secret}, Account: marketplace},
		"empty user":               {Secrets: []string{":" + secret}, Account: marketplace},
		"short password":           {Secrets: []string{"user:short-" + secret[:3]}, Account: marketplace},
		"control character":        {Secrets: []string{"user:" + secret + "\n"}, Account: marketplace},
		"short token":              {Secrets: []string{secret[:8]}, Account: marketplace, Options: map[string]string{OptionAuth: AuthQuery}},
		"second secret empty":      {Secrets: []string{oldSecret, ""}, Account: marketplace},
	} {
		if _, err := New(cfg); err == nil {
			t.Errorf("%s: New accepted it", name)
		} else if strings.Contains(err.Error(), secret[:8]) {
			t.Errorf("%s: error %q quotes the secret", name, err)
		}
	}
}

// TestParseIgnoresTheBody: what the body says about status and money is
// never read (it is not signed): two bodies that differ only there give the
// same event.
func TestParseIgnoresTheBody(t *testing.T) {
	t.Parallel()
	d, err := New(provider.Config{Secrets: []string{oldSecret}, Options: config().Options})
	if err != nil {
		t.Fatal(err)
	}
	forged := strings.NewReplacer(`"amount": "1484.34"`, `"amount": "1.00"`, `"status": "succeeded"`, `"status": "charged_back"`).Replace(succeededEvent)
	a, err := d.Parse(&provider.Request{Body: []byte(succeededEvent)})
	if err != nil {
		t.Fatal(err)
	}
	b, err := d.Parse(&provider.Request{Body: []byte(forged)})
	if err != nil {
		t.Fatal(err)
	}
	if a != b || a.Fact.AmountMinor != 0 || !a.NeedsRefetch {
		t.Fatalf("events differ or carry an amount: %+v / %+v", a, b)
	}
}

// signedBy is FuzzVerify's oracle, independent of the driver: net/http's
// reading of the Authorization header names the credential.
func signedBy(r *provider.Request, credential string) bool {
	user, pass, ok := (&http.Request{Header: r.Header}).BasicAuth()
	return ok && user+":"+pass == credential
}

func FuzzVerify(f *testing.F) { harness().FuzzVerify(f, signedBy) }

func FuzzParse(f *testing.F) { harness().FuzzParse(f) }
