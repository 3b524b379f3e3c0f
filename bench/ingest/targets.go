package main

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"time"

	"github.com/paystream/paystream/bench/internal/rig"
	"github.com/paystream/paystream/internal/source"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
)

// createTopics creates the bench's raw and DLQ topics and returns a
// function deleting them.
func createTopics(ctx context.Context, brokers []string, partitions int) (raw, dlq string, cleanup func(), err error) {
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...))
	if err != nil {
		return "", "", nil, err
	}
	adm := kadm.NewClient(cl)
	suffix, _ := runID()
	raw, dlq = "bench-ingest-raw-"+suffix, "bench-ingest-dlq-"+suffix
	cleanup = func() {
		dctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
		defer cancel()
		_, _ = adm.DeleteTopics(dctx, raw, dlq)
		cl.Close()
	}
	cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	for topic, n := range map[string]int32{raw: int32(partitions), dlq: 1} {
		resp, err := adm.CreateTopic(cctx, n, 1, nil, topic)
		if err == nil {
			err = resp.Err
		}
		if err != nil {
			cleanup()
			return "", "", nil, fmt.Errorf("create topic %s: %w", topic, err)
		}
	}
	// Wait until every partition has a leader.
	for {
		md, err := adm.Metadata(cctx, raw, dlq)
		ready := err == nil
		if ready {
			for _, t := range []string{raw, dlq} {
				td := md.Topics[t]
				if td.Err != nil || len(td.Partitions) == 0 {
					ready = false
				}
				for _, p := range td.Partitions {
					if p.Err != nil || p.Leader < 0 {
						ready = false
					}
				}
			}
		}
		if ready {
			return raw, dlq, cleanup, nil
		}
		select {
		case <-cctx.Done():
			cleanup()
			return "", "", nil, fmt.Errorf("topics not ready: %w", cctx.Err())
		case <-time.After(50 * time.Millisecond):
		}
	}
}

func endOffsets(ctx context.Context, brokers []string, topic string) (int64, error) {
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...))
	if err != nil {
		return 0, err
	}
	defer cl.Close()
	return rig.Records(ctx, kadm.NewClient(cl), topic)
}

// serve runs serveFn on a loopback listener until the returned stop is
// called, and returns the base URL.
func serve(ctx context.Context, serveFn func(context.Context, net.Listener) error) (string, func(), error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", nil, err
	}
	sctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- serveFn(sctx, ln) }()
	return "http://" + ln.Addr().String(), func() {
		cancel()
		if err := <-done; err != nil {
			fmt.Fprintln(os.Stderr, "bench-ingest: server:", err)
		}
	}, nil
}

// bareServe returns a server that answers 200 to requests src's driver
// verifies, 401 to others: net/http, the body limit and the signature
// check, nothing else.
func bareServe(src *source.Source) func(context.Context, net.Listener) error {
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodPost || r.URL.Path != "/webhooks/"+src.Name {
			http.NotFound(w, r)
			return
		}
		if rig.VerifiedRequest(w, r, src) != nil {
			rig.WriteOK(w)
		}
	})
	return func(ctx context.Context, ln net.Listener) error { return rig.Serve(ctx, ln, h) }
}

func waitReady(ctx context.Context, url string) error {
	deadline := time.Now().Add(30 * time.Second)
	for {
		resp, err := http.Get(url)
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("ingest not ready at %s after 30s", url)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
}
