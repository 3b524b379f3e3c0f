package loadgen

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/valyala/fasthttp"
)

// Sender sends one request to the target and returns the answer's status
// code, having read the whole answer. It is called from many goroutines at
// once.
type Sender interface {
	Send(ctx context.Context, r *Request) (status int, err error)
}

// HTTPSender sends with net/http: any URL net/http takes (https, HTTP/2),
// a context per request. It is what Run and RunSchedule use unless told
// otherwise.
type HTTPSender struct {
	// BaseURL is the target, e.g. http://127.0.0.1:8080.
	BaseURL string
	Client  *http.Client
}

// Send implements Sender.
func (s *HTTPSender) Send(ctx context.Context, r *Request) (int, error) {
	hreq, err := r.HTTPRequest(ctx, s.BaseURL)
	if err != nil {
		return 0, fmt.Errorf("%w: %w", errBuild, err)
	}
	resp, err := s.Client.Do(hreq)
	if err != nil {
		return 0, err
	}
	_, err = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp.StatusCode, err
}

// errBuild marks a request that could not be built: the run's error, not
// a failed request.
var errBuild = errors.New("build request")

// FastSender sends with fasthttp's HTTP/1.1 client over keep-alive
// connections. Per request it costs the sending machine a fraction of
// net/http's client (no goroutines per connection, no allocations per
// request), which matters when the load generator shares the CPUs with
// what it measures, as bench-e2e's does: bombardier and plow use the same
// client for the same reason. It takes http and https URLs; the context
// is not watched (the timeout bounds each request).
type FastSender struct {
	prefix  string // scheme://host/path-prefix/webhooks/
	client  *fasthttp.HostClient
	timeout time.Duration
}

// NewFastSender returns a FastSender to baseURL with up to conns
// connections and timeout per request.
func NewFastSender(baseURL string, conns int, timeout time.Duration) (*FastSender, error) {
	u, err := url.Parse(baseURL)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, fmt.Errorf("loadgen: target %q: want http://host:port or https://host:port", baseURL)
	}
	addr := u.Host
	if u.Port() == "" {
		addr += map[string]string{"http": ":80", "https": ":443"}[u.Scheme]
	}
	return &FastSender{
		prefix: strings.TrimRight(baseURL, "/") + "/webhooks/",
		client: &fasthttp.HostClient{
			Addr:                          addr,
			IsTLS:                         u.Scheme == "https",
			MaxConns:                      max(conns, 1),
			MaxIdleConnDuration:           90 * time.Second,
			NoDefaultUserAgentHeader:      true,
			DisableHeaderNamesNormalizing: true, // Header's names are canonical already
		},
		timeout: timeout,
	}, nil
}

// Send implements Sender.
func (s *FastSender) Send(_ context.Context, r *Request) (int, error) {
	req, resp := fasthttp.AcquireRequest(), fasthttp.AcquireResponse()
	defer fasthttp.ReleaseRequest(req)
	defer fasthttp.ReleaseResponse(resp)
	uri := s.prefix + r.Source
	if r.RawQuery != "" {
		uri += "?" + r.RawQuery
	}
	req.SetRequestURI(uri)
	req.Header.SetMethod(http.MethodPost)
	for k, vs := range r.Header {
		for _, v := range vs {
			req.Header.Add(k, v)
		}
	}
	req.SetBodyRaw(r.Body)
	if err := s.client.DoTimeout(req, resp, s.timeout); err != nil {
		return 0, err
	}
	return resp.StatusCode(), nil
}
