package provider

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"slices"
	"strings"

	"github.com/paystream/paystream/internal/payment"
)

// What Refetchers share: the checked GET request to a gateway's API and
// the order of the refunds its answer lists.

// NewRefetchRequest builds the GET request of a driver's RefetchRequest:
// {baseURL}{path} with "Accept: application/json"; the driver adds its
// credential. baseURL must be an absolute http(s) URL without credentials,
// query or fragment; a trailing slash is dropped. Errors read
// "{driver}: refetch: …" and never echo baseURL (it could carry
// credentials); sentAs, how the driver sends its credential instead
// ("the token is sent as a Bearer header"), ends the one refusing
// credentials in the URL.
func NewRefetchRequest(ctx context.Context, driver, baseURL, path, sentAs string) (*http.Request, error) {
	fail := func(reason string) error { return errors.New(driver + ": refetch: base URL " + reason) }
	u, err := url.Parse(baseURL)
	switch {
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
