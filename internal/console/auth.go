package console

import (
	"bufio"
	"bytes"
	"crypto/sha256"
	"crypto/subtle"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"os"
	"strings"
	"sync"
	"time"

	"golang.org/x/crypto/bcrypt"
)

// Auth says who may read the console. Exactly one of BasicFile and Header
// is set: the console refuses to start open.
type Auth struct {
	// BasicFile is the path of a secrets file of "user:password" lines
	// (blank lines and lines starting with # are skipped). The password is
	// a bcrypt hash ($2a$, $2b$, $2y$: `htpasswd -nbBC 10 user secret`
	// prints such a line) or, not recommended, the password itself. The
	// file is read again when its modification time changes (a rotated
	// Kubernetes secret). Requests carry HTTP basic auth.
	BasicFile string
	// Header is the name of a header an authenticating proxy in front of
	// the console sets to the signed-in user (oauth2-proxy's
	// X-Forwarded-User, X-Auth-Request-User, ...). Requests without it, or
	// from an address outside TrustedProxies, are refused.
	Header string
	// TrustedProxies are the addresses requests carrying Header must come
	// from. Defaults to loopback (a sidecar proxy).
	TrustedProxies []netip.Prefix
}

// ErrNoAuth is New's error when neither way of authenticating is set.
var ErrNoAuth = errors.New("console: no authentication: set Auth.BasicFile or Auth.Header")

func (a *Auth) validate() error {
	switch {
	case a.BasicFile == "" && a.Header == "":
		return ErrNoAuth
	case a.BasicFile != "" && a.Header != "":
		return errors.New("console: Auth.BasicFile and Auth.Header are both set: choose one")
	case a.BasicFile != "":
		if _, err := readUsers(a.BasicFile); err != nil {
			return err
		}
	}
	if len(a.TrustedProxies) == 0 {
		a.TrustedProxies = []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8"), netip.MustParsePrefix("::1/128")}
	}
	return nil
}

// users are the lines of a basic auth file, by user name.
type users map[string][]byte

func readUsers(path string) (users, error) {
	raw, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("console: read basic auth file: %w", err)
	}
	out := users{}
	sc := bufio.NewScanner(bytes.NewReader(raw))
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		user, pass, ok := strings.Cut(line, ":")
		if !ok || user == "" || pass == "" {
			// The line is not printed: it may hold a password.
			return nil, fmt.Errorf("console: basic auth file %s, line %d: want user:password", path, n)
		}
		out[user] = []byte(pass)
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("console: basic auth file %s has no user", path)
	}
	return out, nil
}

// authenticator checks requests against an Auth.
type authenticator struct {
	auth Auth

	mu      sync.Mutex
	modTime time.Time
	users   users
	// verified holds the SHA-256 of user:password pairs a bcrypt check
	// accepted, so a page's requests do not each cost a bcrypt; emptied
	// when the file changes.
	verified map[[32]byte]bool
}

// user returns who r is, or "" and why it is refused.
func (a *authenticator) user(r *http.Request) (string, string) {
	if a.auth.Header != "" {
		host, _, err := net.SplitHostPort(r.RemoteAddr)
		if err != nil {
			host = r.RemoteAddr
		}
		addr, err := netip.ParseAddr(host)
		if err != nil || !a.trusted(addr.Unmap()) {
			return "", "request not from a trusted proxy"
		}
		u := r.Header.Get(a.auth.Header)
		if u == "" {
			return "", "no " + a.auth.Header + " header"
		}
		return u, ""
	}
	user, pass, ok := r.BasicAuth()
	if !ok {
		return "", "no credentials"
	}
	if !a.check(user, pass) {
		return "", "wrong user or password"
	}
	return user, ""
}

func (a *authenticator) trusted(addr netip.Addr) bool {
	for _, p := range a.auth.TrustedProxies {
		if p.Contains(addr) {
			return true
		}
	}
	return false
}

// check reports whether user and pass match a line of the basic auth file.
func (a *authenticator) check(user, pass string) bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	if fi, err := os.Stat(a.auth.BasicFile); err == nil && !fi.ModTime().Equal(a.modTime) {
		if u, err := readUsers(a.auth.BasicFile); err == nil {
			a.users, a.modTime, a.verified = u, fi.ModTime(), map[[32]byte]bool{}
		}
	}
	want, ok := a.users[user]
	if !ok {
		// Spend about the time a known user costs, so timing does not
		// tell which users exist.
		_ = bcrypt.CompareHashAndPassword(dummyHash, []byte(pass))
		return false
	}
	if !isBcrypt(want) {
		w, g := sha256.Sum256(want), sha256.Sum256([]byte(pass))
		return subtle.ConstantTimeCompare(w[:], g[:]) == 1
	}
	sum := sha256.Sum256([]byte(user + "\x00" + pass))
	if a.verified[sum] {
		return true
	}
	if bcrypt.CompareHashAndPassword(want, []byte(pass)) != nil {
		return false
	}
	a.verified[sum] = true
	return true
}

func isBcrypt(b []byte) bool {
	return bytes.HasPrefix(b, []byte("$2a$")) || bytes.HasPrefix(b, []byte("$2b$")) || bytes.HasPrefix(b, []byte("$2y$"))
}

// dummyHash is the bcrypt hash (cost 10) of a password nobody has.
var dummyHash, _ = bcrypt.GenerateFromPassword([]byte("no user has this password"), bcrypt.DefaultCost)
