package ingest

import "errors"

// Admission: what a webhook holds while it is handled, and what slow
// clients can take from gateways.
//
// A signature can only be checked once the whole body is in, so nothing
// about a request still arriving tells a gateway's from an attacker's; a
// reservation keyed on the source would not either (an attacker posts to
// the source the gateway uses, its name being in the gateway's URL). What
// ingest can do is make sure a request still arriving holds nothing a
// gateway's webhook needs:
//
//   - Its connection: at most MaxConns are open, and a new one closes the
//     longest-idle one to get in (connLimiter). A request still arriving is
//     bounded by ReadHeaderTimeout and ReadTimeout.
//   - The first bodyAllowance bytes of its body: part of what a connection
//     may cost (as fasthttp's 8 KiB read-ahead already was), not charged
//     to anything shared. Most webhooks are smaller: they need nothing else.
//   - Beyond that, its body's buffer, which grows with the bytes that
//     arrived (doubling, up to the announced length), each growth charged
//     to MaxBufferedBodyBytes before it is made. A client announcing a
//     megabyte and sending a byte a second holds nothing shared; filling
//     the cap takes sending that many bytes and holding them.
//   - A place among MaxInFlight only once its body is in: for verifying,
//     encoding and waiting for the broker, which is what the cap bounds.
//     A slow body never holds one.
//
// What is left to an attacker: bodies over bodyAllowance compete for
// MaxBufferedBodyBytes with those who send and hold that many bytes, and
// connections for ReadTimeout with MaxConns slow requests; rate limits in
// front of ingest (per client address) are the answer to those.

// bodyAllowance is how much of each body is not charged to
// MaxBufferedBodyBytes: the pooled buffer every request starts with.
const bodyAllowance = 8 << 10

// errBodyBytes is a body whose next bytes would pass MaxBufferedBodyBytes.
var errBodyBytes = errors.New("buffered body bytes cap reached")

// admit takes a place in flight for a webhook whose body is in. It returns
// the limit reached when it cannot; an admitted webhook gives its place
// back with s.inFlight.Add(-1).
func (s *Server) admit() (limit string) {
	if s.inFlight.Add(1) > int64(s.cfg.MaxInFlight) {
		s.inFlight.Add(-1)
		return limitInFlight
	}
	return ""
}

// bodyBuf is one webhook's body buffer, and what it holds of s's
// MaxBufferedBodyBytes. It is pooled (getBody, putBody), charge and all: a
// request allocates neither.
type bodyBuf struct {
	b []byte
	s *Server
	n int64 // bytes charged
}

// charge charges n more bytes, or fails with errBodyBytes when the cap
// would be passed.
func (c *bodyBuf) charge(n int64) error {
	if n == 0 {
		return nil
	}
	if c.s.bodyBytes.Add(n) > c.s.cfg.MaxBufferedBodyBytes {
		c.s.bodyBytes.Add(-n)
		return errBodyBytes
	}
	c.n += n
	return nil
}

// release gives every charged byte back.
func (c *bodyBuf) release() {
	c.s.bodyBytes.Add(-c.n)
	c.n = 0
}
