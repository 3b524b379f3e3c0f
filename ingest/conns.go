package ingest

import (
	"container/list"
	"net"
	"strconv"
	"sync"
	"syscall"
	"time"
)

// connLimiter is the listener Serve runs either HTTP server on: it keeps at
// most max connections open. Those not serving a request — new ones still
// waiting for their first byte and idle keep-alive ones — are kept in the
// order they became so; at the cap, a new connection closes the oldest of
// them and takes its place, and when every connection is busy with a
// request it is answered 503 with Retry-After and closed.
//
// Closing the longest-idle connection rather than refusing the new one
// keeps connections that merely wait (a client holding thousands open, a
// gateway's pool) from locking out a gateway that has a webhook to send
// now; the closed one's client reconnects when it needs to. A request that
// raced onto a connection being closed fails on the client's side
// unanswered, which a gateway retries.
type connLimiter struct {
	net.Listener
	max int
	m   *metrics
	// refusal is the whole answer to a refused connection.
	refusal []byte

	mu   sync.Mutex
	open int
	// waiting are the open connections not serving a request, oldest
	// first; each trackedConn's elem is its element while it waits.
	waiting list.List
}

func newConnLimiter(ln net.Listener, max int, m *metrics, retryAfter string) *connLimiter {
	return &connLimiter{Listener: ln, max: max, m: m, refusal: []byte("HTTP/1.1 503 Service Unavailable\r\n" +
		"Content-Type: application/json\r\nRetry-After: " + retryAfter + "\r\nConnection: close\r\n" +
		"Content-Length: " + strconv.Itoa(len(answerTooManyConns)) + "\r\n\r\n" + string(answerTooManyConns))}
}

// answerTooManyConns is the body of the answer to a refused connection.
var answerTooManyConns = []byte(`{"error":"too many connections, retry later"}` + "\n")

// Accept returns the next connection admitted under the cap: it closes the
// longest-waiting connection to admit one at the cap, and refuses (and
// counts) those it cannot admit without returning them.
func (l *connLimiter) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		l.mu.Lock()
		var victim *trackedConn
		if l.open >= l.max {
			if e := l.waiting.Front(); e != nil {
				victim = e.Value.(*trackedConn)
				l.forgetLocked(victim)
			}
		}
		if l.open >= l.max && victim == nil {
			l.mu.Unlock()
			l.refuse(c)
			continue
		}
		tc := &trackedConn{Conn: c, l: l}
		l.open++
		tc.elem = l.waiting.PushBack(tc)
		l.mu.Unlock()
		l.m.connsOpen.Inc()
		if victim != nil {
			l.m.connsAtLimit[connClosedIdle].Inc()
			_ = victim.Conn.Close() // its server sees the read fail and closes it through trackedConn.Close
		}
		return tc, nil
	}
}

// refuse answers c 503 and closes it, without reading its request: at most
// a fresh socket's first write, which does not block.
func (l *connLimiter) refuse(c net.Conn) {
	l.m.connsAtLimit[connRefused].Inc()
	_ = c.SetWriteDeadline(time.Now().Add(100 * time.Millisecond))
	_, _ = c.Write(l.refusal)
	_ = c.Close()
}

// forgetLocked counts c closed: it no longer holds a place under the cap.
func (l *connLimiter) forgetLocked(c *trackedConn) {
	if c.closed {
		return
	}
	c.closed = true
	l.open--
	l.m.connsOpen.Dec()
	if c.elem != nil {
		l.waiting.Remove(c.elem)
		c.elem = nil
	}
}

// setWaiting records that c started (false) or finished (true) serving a
// request: the servers' connection-state hooks call it.
func (l *connLimiter) setWaiting(nc net.Conn, waiting bool) {
	c, ok := nc.(*trackedConn)
	if !ok {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if c.closed {
		return
	}
	if c.elem != nil {
		l.waiting.Remove(c.elem)
		c.elem = nil
	}
	if waiting {
		c.elem = l.waiting.PushBack(c)
	}
}

// trackedConn is a connection counted by its connLimiter until it closes.
type trackedConn struct {
	net.Conn
	l *connLimiter
	// Guarded by l.mu.
	closed bool
	elem   *list.Element // in l.waiting while the connection waits for a request
}

func (c *trackedConn) Close() error {
	c.l.mu.Lock()
	c.l.forgetLocked(c)
	c.l.mu.Unlock()
	return c.Conn.Close()
}

// SyscallConn is the underlying connection's, so connGone can peek at it.
func (c *trackedConn) SyscallConn() (syscall.RawConn, error) {
	sc, ok := c.Conn.(syscall.Conn)
	if !ok {
		return nil, syscall.EINVAL
	}
	return sc.SyscallConn()
}
