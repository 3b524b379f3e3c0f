package console

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/go-chi/chi/v5"

	"github.com/paystream/paystream/internal/store"
)

// searchLimit is the most payments a search lists.
const searchLimit = 20

type searchPage struct {
	Query string
	Hits  []store.SearchHit
}

// search finds the payment a payment key, gateway id or event id names:
// one hit goes straight to its page.
func (s *Server) search(r *http.Request) (any, error) {
	q := strings.TrimSpace(r.URL.Query().Get("q"))
	p := searchPage{Query: q}
	if q == "" {
		return p, nil
	}
	hits, err := store.Search(r.Context(), s.pool, q, searchLimit)
	if err != nil {
		return nil, err
	}
	if len(hits) == 1 {
		return nil, &redirectTo{url: paymentURL(hits[0].PaymentKey)}
	}
	p.Hits = hits
	return p, nil
}

type paymentPage struct {
	Payment     store.PaymentSummary
	Transitions []store.Transition
	Movements   []store.Movement
	Deliveries  []store.ConsoleDelivery
	// After is the id the deliveries start after (0: the first page);
	// Next, when not 0, the cursor of the next page.
	After, Next int64
	ShowBodies  bool
	Now         time.Time
}

func (p paymentPage) title() string { return "Payment " + p.Payment.PaymentKey }

func (s *Server) payment(r *http.Request) (any, error) {
	key := r.URL.Query().Get("key")
	if key == "" {
		return nil, &httpError{code: http.StatusBadRequest, msg: "no payment key: search for one on the search page"}
	}
	after, err := int64Param(r, "after")
	if err != nil {
		return nil, err
	}
	ctx := r.Context()
	p := paymentPage{After: after, ShowBodies: s.cfg.ShowBodies, Now: s.cfg.Now()}
	if p.Payment, err = store.LoadPaymentSummary(ctx, s.pool, key); err != nil {
		if errors.Is(err, store.ErrNotFound) {
			return nil, &httpError{code: http.StatusNotFound, msg: fmt.Sprintf("paystream has no payment %q", key)}
		}
		return nil, err
	}
	if p.Transitions, err = store.LoadTransitions(ctx, s.pool, key); err != nil {
		return nil, err
	}
	if p.Movements, err = store.LoadMovements(ctx, s.pool, key); err != nil {
		return nil, err
	}
	d, err := store.PaymentDeliveries(ctx, s.pool, key, after, s.cfg.PageSize+1, s.cfg.ShowBodies)
	if err != nil {
		return nil, err
	}
	p.Deliveries, p.Next = pageOf(d, s.cfg.PageSize, func(d store.ConsoleDelivery) int64 { return d.ID })
	return p, nil
}

// pageOf cuts rows, read with one row more than a page, to the page and
// returns the cursor of the next page (the zero value when none).
func pageOf[T, C any](rows []T, size int, cursor func(T) C) ([]T, C) {
	var next C
	if len(rows) > size {
		rows = rows[:size]
		next = cursor(rows[size-1])
	}
	return rows, next
}

func int64Param(r *http.Request, name string) (int64, error) {
	v := r.URL.Query().Get(name)
	if v == "" {
		return 0, nil
	}
	n, err := strconv.ParseInt(v, 10, 64)
	if err != nil || n < 0 {
		return 0, &httpError{code: http.StatusBadRequest, msg: fmt.Sprintf("bad %s: %q", name, v)}
	}
	return n, nil
}

// A stuck list is one of these.
const (
	listHeld        = "held"
	listQuarantined = "quarantined"
	listDeferred    = "deferred"
	listDLQ         = "dlq"
)

type stuckPage struct {
	// List is the one list shown, "" for all of them (their first pages).
	List        string
	Reason      string
	Held        []store.HeldRow
	HeldNext    string
	Quarantined []store.ConsoleDelivery
	QuarNext    string
	Deferred    []store.ConsoleDelivery
	DefNext     string
	DLQ         dlqSection
	Now         time.Time
}

func (s *Server) stuck(r *http.Request) (any, error) {
	p := &stuckPage{Now: s.cfg.Now()}
	for _, list := range []string{listHeld, listQuarantined, listDeferred, listDLQ} {
		if err := s.fillStuck(r.Context(), p, list, "", ""); err != nil {
			return nil, err
		}
	}
	return p, nil
}

func (s *Server) stuckList(r *http.Request) (any, error) {
	list := chi.URLParam(r, "list")
	p := &stuckPage{List: list, Reason: r.URL.Query().Get("reason"), Now: s.cfg.Now()}
	switch list {
	case listHeld, listQuarantined, listDeferred, listDLQ:
	default:
		return nil, &httpError{code: http.StatusNotFound, msg: fmt.Sprintf("no list %q: held, quarantined, deferred or dlq", list)}
	}
	if err := s.fillStuck(r.Context(), p, list, r.URL.Query().Get("after"), p.Reason); err != nil {
		return nil, err
	}
	return p, nil
}

// fillStuck reads one page of list, after the cursor after (its encoding
// in the page's links).
func (s *Server) fillStuck(ctx context.Context, p *stuckPage, list, after, reason string) error {
	n := s.cfg.PageSize
	switch list {
	case listHeld:
		var c store.HeldCursor
		if after != "" {
			at, key, err := parseCursor(after)
			if err != nil {
				return err
			}
			c = store.HeldCursor{Since: at, PaymentKey: key}
		}
		rows, err := store.HeldPayments(ctx, s.pool, c, n+1)
		if err != nil {
			return err
		}
		var next store.HeldCursor
		p.Held, next = pageOf(rows, n, func(h store.HeldRow) store.HeldCursor {
			return store.HeldCursor{Since: h.Since, PaymentKey: h.PaymentKey}
		})
		if next.PaymentKey != "" {
			p.HeldNext = formatCursor(next.Since, next.PaymentKey)
		}
	case listQuarantined, listDeferred:
		var c store.WaitCursor
		if after != "" {
			at, id, err := parseCursor(after)
			if err != nil {
				return err
			}
			if c.ID, err = strconv.ParseInt(id, 10, 64); err != nil {
				return &httpError{code: http.StatusBadRequest, msg: "bad cursor"}
			}
			c.ReceivedAt = at
		}
		if list == listQuarantined {
			reason = ""
		}
		rows, err := store.WaitingDeliveries(ctx, s.pool, list, reason, c, n+1)
		if err != nil {
			return err
		}
		page, next := pageOf(rows, n, func(d store.ConsoleDelivery) store.WaitCursor {
			return store.WaitCursor{ReceivedAt: d.ReceivedAt, ID: d.ID}
		})
		var nextCursor string
		if next.ID != 0 {
			nextCursor = formatCursor(next.ReceivedAt, strconv.FormatInt(next.ID, 10))
		}
		if list == listQuarantined {
			p.Quarantined, p.QuarNext = page, nextCursor
		} else {
			p.Deferred, p.DefNext = page, nextCursor
		}
	case listDLQ:
		p.DLQ = s.readDLQ(ctx)
	}
	return nil
}

// formatCursor encodes a keyset cursor: a time and a tie-breaker.
func formatCursor(t time.Time, tie string) string {
	return t.UTC().Format(time.RFC3339Nano) + "," + tie
}

func parseCursor(s string) (time.Time, string, error) {
	ts, tie, ok := strings.Cut(s, ",")
	t, err := time.Parse(time.RFC3339Nano, ts)
	if !ok || err != nil {
		return time.Time{}, "", &httpError{code: http.StatusBadRequest, msg: "bad cursor"}
	}
	return t, tie, nil
}

// cursorURL is the link to the page of list after cursor.
func cursorURL(list, cursor, reason string) string {
	v := url.Values{"after": {cursor}}
	if reason != "" {
		v.Set("reason", reason)
	}
	return "/stuck/" + list + "?" + v.Encode()
}
