package gatewaytest

import (
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"
)

// server is what every fake gateway API shares: the HTTP server, the
// bodies a test set (by resource id), the faults a test injects (FailNext,
// Delay) and the request counts. A fake embeds it and adds its routes and
// authentication; the methods it exports are the fakes' own.
type server struct {
	t         testing.TB // nil when started outside a test
	srv       *httptest.Server
	done      chan struct{}
	closeOnce sync.Once
	// resourceID extracts the id a request is about from its escaped path,
	// for RequestsFor; ok is false for other paths.
	resourceID func(escapedPath string) (id string, ok bool)

	mu         sync.Mutex
	bodies     map[string][]byte
	failLeft   int
	failStatus int
	delay      time.Duration
	requests   int
	perID      map[string]int
}

func newServer(t testing.TB, resourceID func(escapedPath string) (string, bool)) *server {
	return &server{
		t:          t,
		done:       make(chan struct{}),
		resourceID: resourceID,
		bodies:     map[string][]byte{},
		perID:      map[string]int{},
	}
}

// start serves h behind front: on a new loopback listener when ln is nil,
// else on ln.
func (s *server) start(ln net.Listener, h http.Handler) {
	if ln == nil {
		s.srv = httptest.NewServer(s.front(h))
		return
	}
	s.srv = httptest.NewUnstartedServer(s.front(h))
	s.srv.Listener.Close()
	s.srv.Listener = ln
	s.srv.Start()
}

// Close stops the API once, dropping the connections it serves and ending
// the delays of requests in flight. The fakes built for a test (New,
// NewZoop…) are closed when their test ends.
func (s *server) Close() {
	s.closeOnce.Do(func() {
		// Connections first: a request waiting out a Delay then sees its
		// context end and the client a dropped connection, never an empty
		// 200 written because done woke the handler first.
		s.srv.CloseClientConnections()
		close(s.done)
		s.srv.Close()
	})
}

// set stores what the server answers for resource id: body as encodeBody
// gives it. setter, the exported method called, names the failure (the
// test's, or a panic without a test) when body cannot be encoded.
func (s *server) set(setter, id string, body any) {
	if s.t != nil {
		s.t.Helper()
	}
	b, err := encodeBody(body)
	if err != nil {
		msg := fmt.Sprintf("gatewaytest: %s(%q): %v", setter, id, err)
		if s.t == nil {
			panic(msg)
		}
		s.t.Fatal(msg)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.bodies[id] = b
}

// encodeBody is what a fake sends for body: body itself (copied) when it is
// a []byte, string or json.RawMessage, so tests can serve malformed or
// hostile JSON; else its JSON encoding.
func encodeBody(body any) ([]byte, error) {
	switch v := body.(type) {
	case []byte:
		return append([]byte(nil), v...), nil
	case json.RawMessage:
		return append([]byte(nil), v...), nil
	case string:
		return []byte(v), nil
	}
	return json.Marshal(body)
}

func (s *server) remove(id string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.bodies, id)
}

// body is what set stored for resource id.
func (s *server) body(id string) ([]byte, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	b, ok := s.bodies[id]
	return b, ok
}

// answer writes 200 and the body set for resource id when there is one and
// the request is one the fake serves (ok: its path names the fake's own
// marketplace, say), else 404 and notFound, the fake's error body.
func (s *server) answer(w http.ResponseWriter, id string, ok bool, notFound any) {
	body, found := s.body(id)
	if !found || !ok {
		writeJSON(w, http.StatusNotFound, notFound)
		return
	}
	writeBody(w, http.StatusOK, body)
}

// FailNext makes the next n requests, whatever their path or credential,
// fail with HTTP status (for example 500, 503 or 429; 503 and 429 carry
// "Retry-After: 1"). Status 0 drops the connection without an answer, as a
// crashed gateway or a reset does. It replaces any failures still pending;
// n <= 0 cancels them.
func (s *server) FailNext(n int, status int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.failLeft, s.failStatus = max(n, 0), status
}

// Delay makes every answer (failures included) wait d before it is
// written; zero removes the delay. A request whose client gives up first
// (timeout, canceled context) gets no answer.
func (s *server) Delay(d time.Duration) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.delay = d
}

// Requests counts the requests the API received, whatever their answer.
func (s *server) Requests() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.requests
}

// RequestsFor counts the requests for resource id (a payment, a
// transaction), on any of its paths, whatever their answer.
func (s *server) RequestsFor(id string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.perID[id]
}

// URL is the API's base URL (http://127.0.0.1:port, no trailing slash):
// the api_base_url of a source under test.
func (s *server) URL() string { return s.srv.URL }

// Client returns an HTTP client for the API (the httptest server's).
func (s *server) Client() *http.Client { return s.srv.Client() }

// front counts every request, then applies the delay and the failures
// before next (the fake's authentication and routes) sees the request.
func (s *server) front(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		s.mu.Lock()
		s.requests++
		if id, ok := s.resourceID(r.URL.EscapedPath()); ok {
			s.perID[id]++
		}
		delay := s.delay
		fail, status := s.failLeft > 0, s.failStatus
		if fail {
			s.failLeft--
		}
		s.mu.Unlock()

		if delay > 0 {
			timer := time.NewTimer(delay)
			select {
			case <-timer.C:
			case <-r.Context().Done():
				timer.Stop()
				return
			case <-s.done:
				timer.Stop()
				return
			}
		}
		if fail {
			failWith(w, status)
			return
		}
		next.ServeHTTP(w, r)
	})
}

// guard is a fake's handler: a request that authorized refuses (it writes
// the 401 itself) goes no further; any other goes to mux, which answers a
// path it does not route with 404 and notFound, the fake's error body.
func guard(mux *http.ServeMux, authorized func(http.ResponseWriter, *http.Request) bool, notFound any) http.Handler {
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, http.StatusNotFound, notFound)
	})
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if authorized(w, r) {
			mux.ServeHTTP(w, r)
		}
	})
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

func writeJSON(w http.ResponseWriter, status int, v any) {
	b, _ := json.Marshal(v)
	writeBody(w, status, b)
}

// writeBody answers status with body b, Content-Type application/json.
func writeBody(w http.ResponseWriter, status int, b []byte) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_, _ = w.Write(b)
}
