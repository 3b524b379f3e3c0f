package provider

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"time"
	"unicode"

	"github.com/paystream/paystream/internal/payment"
)

// What Refetchers share: the checked GET request to a gateway's API and
// the order of the refunds its answer lists.

// NewRefetchRequest builds the GET request of a driver's RefetchRequest:
// {baseURL}{path} with "Accept: application/json"; the driver adds its
// credential. baseURL is required (a driver with a default gateway puts
// it in first) and must be an absolute http(s) URL without credentials,
// query or fragment; a trailing slash is dropped. Errors read
// "{driver}: refetch: …" and never echo baseURL (it could carry
// credentials); sentAs, how the driver sends its credential instead
// ("the token is sent as a Bearer header"), ends the one refusing
// credentials in the URL.
func NewRefetchRequest(ctx context.Context, driver, baseURL, path, sentAs string) (*http.Request, error) {
	fail := func(reason string) error { return errors.New(driver + ": refetch: base URL " + reason) }
	u, err := url.Parse(baseURL)
	switch {
	case baseURL == "":
		return nil, fail("is required")
	case err != nil:
		return nil, fail("does not parse")
	case u.Scheme != "http" && u.Scheme != "https":
		return nil, fail("must be http:// or https://")
	case u.Host == "":
		return nil, fail("has no host")
	case u.User != nil:
		return nil, fail("must not carry credentials (" + sentAs + ")")
	case u.RawQuery != "" || u.ForceQuery || u.Fragment != "":
		return nil, fail("must not have a query or fragment")
	}
	base := strings.TrimRight(u.String(), "/")
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, base+path, nil)
	if err != nil {
		return nil, fmt.Errorf("%s: refetch: build request: %w", driver, err)
	}
	req.Header.Set("Accept", "application/json")
	return req, nil
}

// NewBearerRefetchRequest is NewRefetchRequest for an API that takes its
// credential as "Authorization: Bearer {token}": it checks token first
// (CheckToken, what naming it in the errors), then builds the request and
// sets the header.
func NewBearerRefetchRequest(ctx context.Context, driver, what, token, baseURL, path string) (*http.Request, error) {
	if err := CheckToken(driver, what, token); err != nil {
		return nil, err
	}
	req, err := NewRefetchRequest(ctx, driver, baseURL, path, "the token is sent as a Bearer header")
	if err != nil {
		return nil, err
	}
	req.Header.Set("Authorization", "Bearer "+token)
	return req, nil
}

// OrderRefunds sorts the refund facts of a payment of amount (built
// StatusPartiallyRefunded) by OccurredAt, ties keeping their order, and
// marks StatusRefunded the one whose running total reaches amount. It
// returns the total. Refunds adding up to more than amount are
// unprocessable, for reason tooMuch ("refunds add up to more than the
// amount").
func OrderRefunds(refunds []payment.Fact, amount int64, tooMuch string) (int64, error) {
	slices.SortStableFunc(refunds, func(a, b payment.Fact) int { return a.OccurredAt.Compare(b.OccurredAt) })
	var total int64
	for i := range refunds {
		if refunds[i].AmountMinor > amount-total {
			return 0, Unprocessable(tooMuch)
		}
		total += refunds[i].AmountMinor
		if total == amount {
			refunds[i].Status = payment.StatusRefunded
		}
	}
	return total, nil
}

// Refund is one refund that moved money, as a driver read it from an API
// answer.
type Refund struct {
	ID          string
	AmountMinor int64
	At          time.Time
}

// RefundFacts turns the refunds of a payment of amount into refund facts in
// cur, ordered by OrderRefunds, and returns their total. A refund without
// id, a repeated id or a zero amount is unprocessable; what names the
// refunds in the reasons ("refund", "void"), tooMuch is OrderRefunds'.
func RefundFacts(in []Refund, cur string, amount int64, what, tooMuch string) ([]payment.Fact, int64, error) {
	out := make([]payment.Fact, 0, len(in))
	seen := make(map[string]bool, len(in))
	for _, r := range in {
		if err := CheckID(what+" id", r.ID); err != nil {
			return nil, 0, err
		}
		if seen[r.ID] {
			return nil, 0, Unprocessable("duplicate " + what + " id")
		}
		seen[r.ID] = true
		if r.AmountMinor == 0 {
			return nil, 0, Unprocessable(what + " amount is zero")
		}
		out = append(out, payment.Fact{
			Status: payment.StatusPartiallyRefunded, AmountMinor: r.AmountMinor, Currency: cur,
			RefundID: r.ID, OccurredAt: r.At,
		})
	}
	total, err := OrderRefunds(out, amount, tooMuch)
	if err != nil {
		return nil, 0, err
	}
	return out, total, nil
}

// RefetchTime reads an optional RFC 3339 time of an API answer ("" gives
// the zero time), in UTC; what names the field in the reason.
func RefetchTime(what, s string) (time.Time, error) {
	if s == "" {
		return time.Time{}, nil
	}
	t, err := time.Parse(time.RFC3339Nano, s)
	if err != nil {
		return time.Time{}, Unprocessable(what + " not RFC 3339")
	}
	if err := CheckTime(what, t); err != nil {
		return time.Time{}, err
	}
	return t.UTC(), nil
}

// RequiredRefetchTime is RefetchTime for a time the answer must carry: ""
// is unprocessable, "missing {what}".
func RequiredRefetchTime(what, s string) (time.Time, error) {
	if s == "" {
		return time.Time{}, Unprocessable("missing " + what)
	}
	return RefetchTime(what, s)
}

// CheckToken refuses an empty API credential or one that cannot be put in
// a header (spaces, control characters), naming driver and what it is;
// errors never include the token.
func CheckToken(driver, what, token string) error {
	if token == "" {
		return errors.New(driver + ": refetch: " + what + " is empty")
	}
	if strings.IndexFunc(token, func(r rune) bool { return unicode.IsControl(r) || r == ' ' }) >= 0 {
		return errors.New(driver + ": refetch: " + what + " contains spaces or control characters")
	}
	return nil
}
