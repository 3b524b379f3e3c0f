package zoop

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"net/url"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/paystream/paystream/internal/payment"
	"github.com/paystream/paystream/internal/provider"
	"github.com/paystream/paystream/internal/provider/gatewaytest"
	"github.com/paystream/paystream/internal/source"
)

var seedFlag = flag.Uint64("zoop.seed", 0, "seed for TestLifecycleConverges (0: random, logged)")

// zoopSource loads a zoop source from a sources file, as ingest and the
// processor do, pointed at the fake API gw.
func zoopSource(t *testing.T, gw *gatewaytest.Zoop, timeout string) *source.Source {
	t.Helper()
	srcs, err := source.Parse([]byte(gw.SourcesYAML(oldSecret, timeout)), map[string]provider.Factory{"zoop": New})
	if err != nil {
		t.Fatal(err)
	}
	src := srcs["zoop"]
	if src.Refetch == nil {
		t.Fatal("zoop source loaded without refetching")
	}
	return src
}

// errNotFound is fetch's error for a 404.
var errNotFound = errors.New("gateway does not know the transaction")

// fetch refetches transaction id the way the processor's refetcher does —
// the source's request, its timeout as a deadline, non-2xx answers as
// errors — and parses the answer checking it is about id.
func fetch(t *testing.T, src *source.Source, client *http.Client, id string) ([]payment.Fact, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), src.Refetch.Timeout)
	defer cancel()
	req, err := src.Refetch.Request(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := client.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, err
	}
	switch {
	case resp.StatusCode == http.StatusNotFound:
		return nil, errNotFound
	case resp.StatusCode/100 != 2:
		return nil, fmt.Errorf("gateway answered %d", resp.StatusCode)
	}
	return src.Driver.(*Driver).ParseRefetchFor(id, body)
}

// transaction is gatewaytest.ZoopCardLifecycle for gw's marketplace.
func transaction(gw *gatewaytest.Zoop, id string, stage int) gatewaytest.ZoopTransaction {
	return gatewaytest.ZoopCardLifecycle(gw.MarketplaceID(), id, stage)
}

// TestRefetchAgainstZoop refetches through a real HTTP server playing
// Zoop's API, with the source loaded from a sources file: basic auth with
// the API key, the marketplace's path, the source's timeout. The API up
// gives the transaction's facts; down (an error status, a dropped
// connection) and slow (past refetch_timeout) give errors and no facts;
// lying about the id (answering another transaction) is refused; a wrong
// key is 401 and an unknown id 404, as Zoop answers them.
func TestRefetchAgainstZoop(t *testing.T) {
	t.Parallel()
	gw := gatewaytest.NewZoop(t)
	src := zoopSource(t, gw, "300ms")
	id, other := "0a1b2c3d4e5f60718293a4b5c6d7e8f9", "ffffffffffffffffffffffffffffff01"
	gw.SetTransaction(id, transaction(gw, id, 2))
	gw.SetTransaction(other, transaction(gw, other, 3))

	// Up.
	facts, err := fetch(t, src, gw.Client(), id)
	if err != nil {
		t.Fatalf("API up: %v", err)
	}
	want := []payment.Fact{
		brl(payment.StatusPaid, 25000, "2026-11-02T11:00:00Z"),
		brlRefund(payment.StatusPartiallyRefunded, "0a1b2c3dv1", 5000, "2026-11-03T10:00:00Z"),
	}
	if !reflect.DeepEqual(facts, want) {
		t.Fatalf("API up: facts\n%s\nwant\n%s", dump(facts), dump(want))
	}

	// Down: an error status, then a dropped connection (without
	// keep-alives, so the transport does not retry on a new connection).
	gw.FailNext(1, http.StatusServiceUnavailable)
	if facts, err := fetch(t, src, gw.Client(), id); err == nil || facts != nil {
		t.Fatalf("API answering 503: %+v, %v; want an error", facts, err)
	}
	gw.FailNext(1, 0)
	noReuse := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}}
	if facts, err := fetch(t, src, noReuse, id); err == nil || facts != nil {
		t.Fatalf("API dropping the connection: %+v, %v; want an error", facts, err)
	}

	// Slow: past the source's refetch_timeout the request is abandoned.
	gw.Delay(time.Minute)
	if facts, err := fetch(t, src, gw.Client(), id); !errors.Is(err, context.DeadlineExceeded) || facts != nil {
		t.Fatalf("slow API: %+v, %v; want the deadline", facts, err)
	}
	gw.Delay(0)
	if facts, err := fetch(t, src, gw.Client(), id); err != nil || !reflect.DeepEqual(facts, want) {
		t.Fatalf("API back: %+v, %v", facts, err)
	}

	// Lying about the id: the answer for id is another transaction's.
	lie := transaction(gw, other, 3)
	gw.SetTransaction(id, lie)
	if facts, err := fetch(t, src, gw.Client(), id); !errors.Is(err, provider.ErrUnprocessable) || facts != nil {
		t.Fatalf("lying API: %+v, %v; want ErrUnprocessable", facts, err)
	}
	// The same lie with the uri rewritten to the asked-for path: the
	// history still names the other transaction.
	lie.URI = TransactionPath(gw.MarketplaceID(), id)
	gw.SetTransaction(id, lie)
	if facts, err := fetch(t, src, gw.Client(), id); !errors.Is(err, provider.ErrUnprocessable) || facts != nil {
		t.Fatalf("lying API, uri rewritten: %+v, %v; want ErrUnprocessable", facts, err)
	}

	// Errors Zoop answers.
	if facts, err := fetch(t, src, gw.Client(), "00000000000000000000000000000404"); !errors.Is(err, errNotFound) || facts != nil {
		t.Fatalf("unknown transaction: %+v, %v; want 404", facts, err)
	}
	wrongKey := zoopSource(t, gatewaytest.NewZoopWith(t, "zpk_test_wrong", gw.MarketplaceID()), "300ms")
	wrongKey.Refetch.BaseURL = gw.URL()
	if facts, err := fetch(t, wrongKey, gw.Client(), other); err == nil || facts != nil {
		t.Fatalf("wrong API key: %+v, %v; want 401", facts, err)
	}
	if n := gw.RequestsFor(id); n != 7 {
		t.Errorf("API saw %d requests for %s, want 7", n, id)
	}
}

// TestLifecycleConverges is the order-independence property for a Zoop
// payment taken through pre-authorized → succeeded → partial refund →
// refunded (voided in full). Its four webhooks (plus a second event for
// the capture, as Zoop sends transaction.capture.succeeded and
// transaction.succeeded) are delivered in random orders with
// redeliveries; the processor drops redelivered event ids and refetches
// the transaction for each new one, the API answering the transaction as
// it is at that moment: never older than the event, and the final state by
// the time the last event is delivered. The facts of those answers, applied
// in that order, must leave the same state and ledger as the four stages
// applied in order, every time. The API's answers are read through a real
// HTTP server playing Zoop.
func TestLifecycleConverges(t *testing.T) {
	t.Parallel()
	seed := *seedFlag
	if seed == 0 {
		seed = rand.Uint64()
	}
	t.Logf("seed %d (rerun: go test ./internal/provider/zoop -run %s -zoop.seed=%d)", seed, t.Name(), seed)
	r := rand.New(rand.NewPCG(seed, 12))

	gw := gatewaytest.NewZoop(t)
	src := zoopSource(t, gw, "5s")
	id := "7ab0b0a0d4a34a4c9a1e2f3b4c5d6e7f"
	var stages [4][]payment.Fact
	for stage := range stages {
		gw.SetTransaction(id, transaction(gw, id, stage))
		facts, err := fetch(t, src, gw.Client(), id)
		if err != nil {
			t.Fatalf("stage %d: %v", stage, err)
		}
		stages[stage] = facts
	}

	// The webhooks, verified and parsed by the source's driver: the stage
	// at which Zoop sends each.
	type delivery struct {
		ev    provider.Event
		stage int
	}
	var events []delivery
	for i, w := range []struct {
		typ   string
		stage int
	}{
		{"transaction.pre_authorized", 0}, {"transaction.capture.succeeded", 1}, {"transaction.succeeded", 1},
		{"transaction.void.succeeded", 2}, {"transaction.canceled", 3},
	} {
		body := []byte(fmt.Sprintf(`{"id":"evt%02d","type":%q,"resource":"event","uri":"/v1/marketplaces/%s/events/evt%02d","payload":{"object":{"id":%q,"resource":"transaction","status":"ignored","amount":"1.00"}},"created_at":"2026-11-02T10:00:0%d+0000"}`,
			i, w.typ, gw.MarketplaceID(), i, id, i))
		req := &provider.Request{Header: http.Header{HeaderAuthorization: {Sign(oldSecret)}}, Query: url.Values{}, Body: body}
		if err := src.Driver.Verify(req); err != nil {
			t.Fatal(err)
		}
		ev, err := src.Driver.Parse(req)
		if err != nil {
			t.Fatal(err)
		}
		if !ev.NeedsRefetch || ev.PaymentID != id {
			t.Fatalf("event %d: %+v", i, ev)
		}
		events = append(events, delivery{ev, w.stage})
	}

	var m payment.Machine
	var inOrder []payment.Fact
	for _, fs := range stages {
		inOrder = append(inOrder, fs...)
	}
	want := m.Replay(payment.State{}, inOrder)
	if want.State.Status != payment.StatusRefunded || want.State.CapturedMinor != 25000 || want.State.RefundedMinor != 25000 {
		t.Fatalf("in-order state %+v", want.State)
	}
	if last := m.Replay(payment.State{}, stages[3]).State; !last.Equivalent(want.State) {
		t.Fatalf("the final answer alone: %+v, want %+v", last, want.State)
	}

	for round := range 2000 {
		// Deliveries: each event once, in a random order, some again.
		order := make([]delivery, 0, 2*len(events))
		for _, i := range r.Perm(len(events)) {
			order = append(order, events[i])
		}
		for _, e := range events {
			for r.IntN(3) == 0 {
				order = append(order, e)
				k := r.IntN(len(order))
				order[k], order[len(order)-1] = order[len(order)-1], order[k]
			}
		}
		// The API's stage when each new event is refetched: it only moves
		// forward, is never behind the event, and is final once every
		// event has been sent.
		seen := map[string]bool{}
		apiStage := 0
		var applied []payment.Fact
		for _, d := range order {
			if seen[d.ev.DedupKey] {
				continue // duplicate_event: no refetch
			}
			seen[d.ev.DedupKey] = true
			apiStage = max(apiStage, d.stage, apiStage+r.IntN(2))
			apiStage = min(apiStage, 3)
			if len(seen) == len(events) {
				apiStage = 3
			}
			applied = append(applied, stages[apiStage]...)
		}
		got := m.Replay(payment.State{}, applied)
		if !got.State.Equivalent(want.State) {
			t.Fatalf("round %d: state %+v, want %+v\nfacts:\n%s", round, got.State, want.State, dump(applied))
		}
		if !reflect.DeepEqual(got.State.Balances(), want.State.Balances()) {
			t.Fatalf("round %d: balances %v, want %v", round, got.State.Balances(), want.State.Balances())
		}
		for i, d := range got.Decisions {
			if d.Outcome == payment.OutcomeDeferred {
				t.Fatalf("round %d: fact %d %+v left deferred (%s)", round, i, applied[i], d.Reason)
			}
		}
	}
	// Stale answers (a cache, a lagging replica) in any order converge too,
	// as long as the final answer is among them.
	for round := range 2000 {
		var applied []payment.Fact
		for range 1 + r.IntN(6) {
			applied = append(applied, stages[r.IntN(4)]...)
		}
		applied = append(applied, stages[3]...)
		r.Shuffle(len(applied), func(i, j int) { applied[i], applied[j] = applied[j], applied[i] })
		got := m.Replay(payment.State{}, applied)
		if !got.State.Equivalent(want.State) || !reflect.DeepEqual(got.State.Balances(), want.State.Balances()) {
			t.Fatalf("stale round %d: state %+v, want %+v\nfacts:\n%s", round, got.State, want.State, dump(applied))
		}
	}
}

// TestSourcesFile: how a zoop source loads. The API key, literal or from
// the environment, refetches with the default base URL; without API keys
// the source loads but cannot refetch; `refetch: false` and a key written
// as "key:" (basic auth's form) are refused, naming the field, never the
// key.
func TestSourcesFile(t *testing.T) {
	t.Setenv("ZOOP_TEST_API_KEY", "zpk_test_from_env_0123")
	factories := map[string]provider.Factory{"zoop": New}
	head := "sources:\n  - name: zoop\n    driver: zoop\n    account: " + marketplace + "\n    secrets: [\"" + oldSecret + "\"]\n"

	srcs, err := source.Parse([]byte(head+"    api_token: env:ZOOP_TEST_API_KEY\n"), factories)
	if err != nil {
		t.Fatal(err)
	}
	req, err := srcs["zoop"].Refetch.Request(context.Background(), txID)
	if err != nil {
		t.Fatal(err)
	}
	if user, pass, ok := req.BasicAuth(); !ok || user != "zpk_test_from_env_0123" || pass != "" {
		t.Fatalf("basic auth %q:%q, %v", user, pass, ok)
	}
	if want := DefaultAPIBaseURL + TransactionPath(marketplace, txID); req.URL.String() != want {
		t.Fatalf("URL %s, want %s", req.URL, want)
	}
	if got := srcs["zoop"].PaymentKey(txID); got != "zoop:"+marketplace+":"+txID {
		t.Fatalf("payment key %q: not scoped by the marketplace", got)
	}

	srcs, err = source.Parse([]byte(head), factories)
	if err != nil {
		t.Fatal(err)
	}
	if srcs["zoop"].Refetch != nil {
		t.Fatal("a zoop source without API keys refetches")
	}

	for name, extra := range map[string]string{
		"refetch: false":   "    refetch: false\n    api_token: zpk_test_s3cr3t\n",
		"key with a colon": "    api_token: \"zpk_test_s3cr3t:\"\n",
	} {
		_, err := source.Parse([]byte(head+extra), factories)
		if err == nil {
			t.Errorf("%s: loaded", name)
			continue
		}
		if strings.Contains(err.Error(), "s3cr3t") {
			t.Errorf("%s: error %q reveals the key", name, err)
		}
		if !strings.Contains(err.Error(), "refetch") && !strings.Contains(err.Error(), "api_token") {
			t.Errorf("%s: error %q names neither refetch nor api_token", name, err)
		}
	}
}
