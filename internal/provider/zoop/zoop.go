// Package zoop is the provider driver for Zoop (Brazilian marketplace
// payments: card, boleto, Pix, wallet; sellers under a marketplace).
//
// Zoop signs nothing: its webhooks, configured per marketplace and event
// type, are a POST of the event with the whole resource, and neither the
// body nor any header is covered by a signature or a timestamp. What
// authenticates a delivery is a secret the operator chooses and puts in the
// webhook's URL when registering it with Zoop:
//
//   - auth "basic" (the default): HTTP basic auth, the credential
//     "user:password" (https://user:password@host/webhooks/{source}, or the
//     webhook's authorization setting) sent as "Authorization: Basic …";
//   - auth "query": a token in a query parameter
//     (https://host/webhooks/{source}?token=…), for senders that drop
//     credentials from URLs.
//
// The secret is compared in constant time (both sides hashed with SHA-256
// first, so nothing leaks its length). It proves the request came from
// someone who knows the URL — Zoop, or anyone the URL leaked to — not what
// the body says, so nothing in the body is trusted: every event is marked
// NeedsRefetch, and money moves only on what Zoop's API answers for the
// transaction (GET /v1/marketplaces/{marketplace_id}/transactions/{id},
// see RefetchRequest and ParseRefetch).
package zoop

import (
	"encoding/base64"
	"errors"
	"fmt"
	"strings"
	"unicode"

	"github.com/paystream/paystream/internal/provider"
)

// HeaderAuthorization carries the basic-auth credential.
const HeaderAuthorization = "Authorization"

// Driver options (Config.Options).
const (
	// OptionAuth selects how deliveries authenticate: AuthBasic (default)
	// or AuthQuery.
	OptionAuth = "auth"
	// OptionQueryParam names the query parameter carrying the token with
	// AuthQuery (default DefaultQueryParam).
	OptionQueryParam = "query_param"
	// OptionMarketplaceID is the Zoop marketplace whose webhooks this
	// source receives and whose API the refetch reads. Defaults to the
	// source's account.
	OptionMarketplaceID = "marketplace_id"
)

// Authentication modes (OptionAuth).
const (
	AuthBasic = "basic"
	AuthQuery = "query"
)

// DefaultQueryParam is the query parameter AuthQuery reads by default.
const DefaultQueryParam = "token"

// MinSecretLen is the shortest password (AuthBasic) or token (AuthQuery)
// New accepts. A forged event cannot move money (it is refetched), but
// whoever guesses the secret can make paystream call Zoop's API at will,
// spending the source's refetch rate: it must not be guessable.
const MinSecretLen = 16

// maxCredentialLen bounds the decoded basic-auth credential looked at.
const maxCredentialLen = 1024

// Driver verifies and parses Zoop webhooks and refetches Zoop transactions.
// Build it with New.
type Driver struct {
	auth        string
	param       string
	secrets     []provider.TokenDigest
	account     string
	marketplace string
}

var _ provider.Driver = (*Driver)(nil)

// New builds a Driver. cfg.Secrets are the operator-chosen credentials
// ("user:password" with AuthBasic, tokens with AuthQuery), at least
// MinSecretLen bytes of password or token each; several allow rotation.
// The marketplace is Options["marketplace_id"], else cfg.Account; one of
// them is required, made of letters, digits, '-' and '_' (Zoop's ids are 32
// hexadecimal digits). Zoop's scheme carries no timestamp, so
// cfg.Tolerance is unused; every event is refetched, whatever cfg.Refetch.
func New(cfg provider.Config) (provider.Driver, error) {
	for k := range cfg.Options {
		switch k {
		case OptionAuth, OptionQueryParam, OptionMarketplaceID:
		default:
			known := []string{OptionAuth, OptionMarketplaceID, OptionQueryParam}
			return nil, fmt.Errorf("zoop: Options: unknown option %q (known: %s)", k, strings.Join(known, ", "))
		}
	}
	d := &Driver{auth: cfg.Options[OptionAuth], param: cfg.Options[OptionQueryParam], account: cfg.Account}
	switch d.auth {
	case "":
		d.auth = AuthBasic
	case AuthBasic, AuthQuery:
	default:
		return nil, fmt.Errorf("zoop: Options: %s must be %q or %q", OptionAuth, AuthBasic, AuthQuery)
	}
	if d.param != "" && d.auth != AuthQuery {
		return nil, fmt.Errorf("zoop: Options: %s only applies with %s: %s", OptionQueryParam, OptionAuth, AuthQuery)
	}
	if d.auth == AuthQuery && d.param == "" {
		d.param = DefaultQueryParam
	}
	d.marketplace = cfg.Options[OptionMarketplaceID]
	if d.marketplace == "" {
		d.marketplace = cfg.Account
	}
	if d.marketplace == "" {
		return nil, errors.New("zoop: Options: marketplace_id (or the source's account) is required: the Zoop marketplace id")
	}
	if !validID(d.marketplace) {
		return nil, errors.New("zoop: Options: marketplace_id must be 1 to 64 letters, digits, '-' or '_'")
	}
	if len(cfg.Secrets) == 0 {
		return nil, errors.New("zoop: Secrets: at least one webhook credential is required (Zoop signs nothing)")
	}
	for i, s := range cfg.Secrets {
		if err := d.checkSecret(s); err != nil {
			return nil, fmt.Errorf("zoop: Secrets[%d]: %w", i, err)
		}
		d.secrets = append(d.secrets, provider.DigestToken(s))
	}
	return d, nil
}

// checkSecret validates one configured secret. Errors never quote it.
func (d *Driver) checkSecret(s string) error {
	if strings.IndexFunc(s, unicode.IsControl) >= 0 {
		return errors.New("contains control characters")
	}
	if d.auth == AuthQuery {
		if len(s) < MinSecretLen {
			return fmt.Errorf("token shorter than %d bytes", MinSecretLen)
		}
		return nil
	}
	user, password, ok := strings.Cut(s, ":")
	switch {
	case !ok:
		return errors.New(`want "user:password" (auth basic)`)
	case user == "":
		return errors.New("empty user")
	case len(password) < MinSecretLen:
		return fmt.Errorf("password shorter than %d bytes", MinSecretLen)
	}
	return nil
}

// Verify checks the delivery's credential against every configured secret
// in constant time. With AuthBasic a missing Authorization header is
// ReasonMissingHeader, one that is not a single "Basic {base64}" is
// ReasonMalformedHeader; with AuthQuery the same holds for the query
// parameter. A credential matching no secret (whatever its shape) is
// ReasonBadSignature. There is no timestamp: replays cannot be rejected by
// age, and need not be — an event only triggers a refetch.
func (d *Driver) Verify(r *provider.Request) error {
	var cred string
	if d.auth == AuthQuery {
		vals := r.Query[d.param]
		switch {
		case len(vals) == 0 || vals[0] == "":
			return provider.Unauthentic(provider.ReasonMissingHeader, "query parameter "+d.param)
		case len(vals) > 1:
			return provider.Unauthentic(provider.ReasonMalformedHeader, "query parameter "+d.param+" given several times")
		}
		cred = vals[0]
	} else {
		vals := r.Header.Values(HeaderAuthorization)
		switch {
		case len(vals) == 0 || vals[0] == "":
			return provider.Unauthentic(provider.ReasonMissingHeader, HeaderAuthorization)
		case len(vals) > 1:
			return provider.Unauthentic(provider.ReasonMalformedHeader, "several "+HeaderAuthorization+" headers")
		}
		// Read as net/http's Request.BasicAuth reads it.
		const prefix = "Basic "
		v := vals[0]
		if len(v) < len(prefix) || !asciiEqualFold(v[:len(prefix)], prefix) {
			return provider.Unauthentic(provider.ReasonMalformedHeader, HeaderAuthorization+" is not Basic")
		}
		encoded := v[len(prefix):]
		if len(encoded) > base64.StdEncoding.EncodedLen(maxCredentialLen) {
			return provider.Unauthentic(provider.ReasonMalformedHeader, HeaderAuthorization+" too long")
		}
		raw, err := base64.StdEncoding.DecodeString(encoded)
		if err != nil {
			return provider.Unauthentic(provider.ReasonMalformedHeader, HeaderAuthorization+" is not base64")
		}
		cred = string(raw)
	}
	if !provider.MatchToken(d.secrets, cred) {
		return provider.Unauthentic(provider.ReasonBadSignature, "credential does not match")
	}
	return nil
}

// Sign returns the Authorization header value a delivery to a URL carrying
// the basic-auth credential ("user:password") has. With AuthQuery the
// token itself goes in the query parameter. Tests and the load generator
// use it.
func Sign(credential string) string {
	return "Basic " + base64.StdEncoding.EncodeToString([]byte(credential))
}

// Marketplace returns the Zoop marketplace id the driver was built for.
func (d *Driver) Marketplace() string { return d.marketplace }

// Auth returns the authentication mode (AuthBasic or AuthQuery) and, for
// AuthQuery, the query parameter.
func (d *Driver) Auth() (mode, queryParam string) { return d.auth, d.param }

// validID reports whether id is usable in an API path: 1 to 64 ASCII
// letters, digits, '-' or '_'. Zoop's ids are 32 hexadecimal digits.
func validID(id string) bool {
	if id == "" || len(id) > 64 {
		return false
	}
	for i := 0; i < len(id); i++ {
		c := id[i]
		if !('0' <= c && c <= '9' || 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || c == '-' || c == '_') {
			return false
		}
	}
	return true
}

// asciiEqualFold is strings.EqualFold for ASCII only, as net/http compares
// the scheme: no Unicode folding ("ſ" is not "s").
func asciiEqualFold(a, b string) bool {
	if len(a) != len(b) {
		return false
	}
	for i := 0; i < len(a); i++ {
		x, y := a[i], b[i]
		if 'A' <= x && x <= 'Z' {
			x += 'a' - 'A'
		}
		if 'A' <= y && y <= 'Z' {
			y += 'a' - 'A'
		}
		if x != y {
			return false
		}
	}
	return true
}
