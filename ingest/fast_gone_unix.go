//go:build unix

package ingest

import (
	"errors"
	"net"
	"syscall"
)

// connGone reports whether the client of conn hung up (closed the
// connection or its sending side), without reading anything: it peeks.
// fasthttp has no request context that ends with the connection, as
// net/http's does; this stands in for it on the rare path that asks.
func connGone(conn net.Conn) bool {
	sc, ok := conn.(syscall.Conn)
	if !ok {
		return false
	}
	raw, err := sc.SyscallConn()
	if err != nil {
		return false
	}
	gone := false
	var b [1]byte
	_ = raw.Read(func(fd uintptr) bool {
		n, _, err := syscall.Recvfrom(int(fd), b[:], syscall.MSG_PEEK|syscall.MSG_DONTWAIT)
		gone = n == 0 && err == nil || err != nil && !errors.Is(err, syscall.EAGAIN) && !errors.Is(err, syscall.EINTR)
		return true // never wait
	})
	return gone
}
