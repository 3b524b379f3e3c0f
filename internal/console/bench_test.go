package console_test

import (
	"fmt"
	"net/http"
	"net/url"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/paystream/paystream/internal/store"
)

// BenchmarkConsoleMillionDeliveries measures the console's pages on a
// schema holding 1,000,000 deliveries of 250,000 payments over 14 daily
// partitions (a 300-byte body each), 500,000 transitions, 1% of the
// deliveries deferred and 0.1% quarantined (their payments held): each
// page's handler (Postgres included), and each main page loaded in
// headless Chromium when one is installed. It reports times, asserts
// none. The fill takes about a minute; PAYSTREAM_BENCH_DELIVERIES sets
// another size.
//
//	go test -run '^$' -bench ConsoleMillionDeliveries -benchtime 20x ./internal/console/
func BenchmarkConsoleMillionDeliveries(b *testing.B) {
	n := 1_000_000
	if s := os.Getenv("PAYSTREAM_BENCH_DELIVERIES"); s != "" {
		var err error
		if n, err = strconv.Atoi(s); err != nil {
			b.Fatal(err)
		}
	}
	bb := setup(b, setupOpts{readOnly: true})
	bb.now = time.Now()
	fillStart := time.Now()
	fillMillion(b, bb, n)
	b.Logf("filled %d deliveries in %s", n, time.Since(fillStart).Round(time.Second))

	key := fmt.Sprintf("acme:pay_%d", n/8) // a payment in the middle
	id := strings.TrimPrefix(key, "acme:")
	pages := []struct{ name, path string }{
		{"payment", "/payment?key=" + url.QueryEscape(key)},
		{"stuck", "/stuck"},
		{"stuck_deferred_page_10", deferredPage(b, bb, 10)},
		{"health", "/health"},
		{"search_payment_key", "/?q=" + key},
		{"search_gateway_id", "/?q=" + id},
		{"search_state_event_id", "/?q=" + key + ":2"},
		// A webhook event id that is its dedup key: found through dedup_keys.
		{"search_webhook_event_id", fmt.Sprintf("/?q=evt_%d", n/2)},
		// Nothing has this id: every lookup misses, then the scans of
		// payments and deliveries run to the end.
		{"search_not_found_scan", "/?q=evt_nowhere"},
	}
	for _, p := range pages {
		b.Run("handler/"+p.name, func(b *testing.B) {
			for b.Loop() {
				code, _, body := bb.get(b, p.path)
				if code != http.StatusOK && code != http.StatusSeeOther {
					b.Fatalf("GET %s: %d\n%s", p.path, code, body)
				}
			}
		})
	}
	if chromiumPath() == "" {
		b.Log("no Chromium: browser page loads not measured")
		return
	}
	br := newBrowser(b, rightCredentials)
	for _, p := range []struct{ name, path, ready string }{
		{"payment", "/payment?key=" + url.QueryEscape(key), "transitions"},
		{"stuck", "/stuck", "dlq-error"},
		{"health", "/health", "partitions"},
	} {
		b.Run("browser/"+p.name, func(b *testing.B) {
			for b.Loop() {
				br.run(b, chromedp.Navigate(bb.ts.URL+p.path), chromedp.WaitVisible(chromedp.ID(p.ready)))
			}
		})
	}
}

// deferredPage returns the URL of the page-th page of deferred deliveries,
// following the links.
func deferredPage(b *testing.B, bb *bundle, page int) string {
	b.Helper()
	path := "/stuck/deferred"
	for range page {
		_, _, body := bb.get(b, path)
		_, after, ok := strings.Cut(body, `href="/stuck/deferred?after=`)
		if !ok {
			b.Fatalf("deferred list ends before page %d", page)
		}
		cursor, _, _ := strings.Cut(after, `"`)
		path = "/stuck/deferred?after=" + strings.ReplaceAll(cursor, "&amp;", "&")
	}
	return path
}

// fillMillion writes n deliveries of n/4 payments as described on
// BenchmarkConsoleMillionDeliveries.
func fillMillion(b *testing.B, bb *bundle, n int) {
	b.Helper()
	ctx := b.Context()
	for d := 1; d < 16; d++ { // today and the days ahead exist (migration 004)
		if _, err := store.CreatePartition(ctx, bb.db.Pool, store.PartitionOf(time.Now().AddDate(0, 0, -d))); err != nil {
			b.Fatal(err)
		}
	}
	payments := n / 4
	stmts := []string{
		fmt.Sprintf(`INSERT INTO payments (payment_key, source, payment_id, status, version, amount_minor, currency, state, held, held_reason, updated_at)
		 SELECT 'acme:pay_' || i, 'acme', 'pay_' || i, 'paid', 2, 1000 + i, 'BRL', '{}', i %% 1000 = 7, CASE WHEN i %% 1000 = 7 THEN 'currency_mismatch' END,
		        now() - (i %% 14) * interval '1 day'
		   FROM generate_series(1, %d) i`, payments),
		fmt.Sprintf(`INSERT INTO payment_transitions (payment_key, version, from_status, to_status, kind, amount_minor, currency, created_at)
		 SELECT 'acme:pay_' || i, v, CASE v WHEN 1 THEN '' ELSE 'pending' END, CASE v WHEN 1 THEN 'pending' ELSE 'paid' END,
		        CASE v WHEN 1 THEN 'create' ELSE 'capture' END, 1000 + i, 'BRL', now() - (i %% 14) * interval '1 day'
		   FROM generate_series(1, %d) i, generate_series(1, 2) v`, payments),
		fmt.Sprintf(`INSERT INTO ledger_movements (payment_key, version, movement, debit_account, credit_account, amount_minor, currency)
		 SELECT 'acme:pay_' || i, 2, 0, 'gateway_receivable', 'merchant_payable', 1000 + i, 'BRL' FROM generate_series(1, %d) i`, payments),
		// Delivery j belongs to payment j/4+1; every 100th is deferred,
		// and the first delivery of each held payment is quarantined.
		fmt.Sprintf(`INSERT INTO deliveries (id, recorded_at, source, dedup_key, event_id, event_type, payment_key, status, reason, body,
		                         topic, partition, kafka_offset, occurred_at, received_at)
		 SELECT j, now() - ((j / 4 + 1) %% 14) * interval '1 day' + j * interval '1 ms', 'acme', 'evt_' || j, 'evt_' || j, 'payment.paid',
		        'acme:pay_' || (j / 4 + 1),
		        CASE WHEN (j / 4 + 1) %% 1000 = 7 AND j %% 4 = 0 THEN 'quarantined' WHEN j %% 100 = 1 THEN 'deferred' ELSE 'processed' END,
		        CASE WHEN (j / 4 + 1) %% 1000 = 7 AND j %% 4 = 0 THEN 'currency_mismatch' WHEN j %% 100 = 1 THEN 'needs_predecessor' END,
		        convert_to(repeat('x', 300), 'UTF8'), 'raw', j %% 12, j, now() - ((j / 4 + 1) %% 14) * interval '1 day',
		        now() - ((j / 4 + 1) %% 14) * interval '1 day' + j * interval '1 ms'
		   FROM generate_series(0, %d) j`, n-1),
		`INSERT INTO dedup_keys (source, dedup_key, delivery_id, recorded_at) SELECT source, dedup_key, id, recorded_at FROM deliveries`,
		fmt.Sprintf(`SELECT setval('deliveries_id_seq', %d)`, n),
		`INSERT INTO consumer_offsets (group_id, topic, partition, next_offset, owner_epoch)
		 SELECT 'paystream-processor', 'paystream.webhooks.raw.v1', p, 100000, 1 FROM generate_series(0, 11) p`,
		`ANALYZE payments, payment_transitions, ledger_movements, deliveries, dedup_keys`,
	}
	for _, s := range stmts {
		start := time.Now()
		if _, err := bb.db.Pool.Exec(ctx, s); err != nil {
			b.Fatalf("%s: %v", strings.Fields(s)[0:3], err)
		}
		b.Logf("%s: %s", strings.Join(strings.Fields(s)[0:3], " "), time.Since(start).Round(time.Millisecond))
	}
}
