package main

import (
	"context"
	"encoding/json"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/paystream/paystream/internal/envelope"
	"github.com/paystream/paystream/internal/payment"
	"github.com/paystream/paystream/internal/statelog"
	"github.com/paystream/paystream/internal/testenv"
	"github.com/paystream/paystream/sink"
	"github.com/paystream/paystream/sink/sinktest"
)

// TestBootstrapUnderTraffic: the real relay publishes the state topic and
// the latest-state topic in the same transactions while processor-like
// writers commit versions of 200 payments; a new consumer group starts
// with Bootstrap mid-flow, then consumes the state topic. In the end it
// has every payment at its last version, and after the snapshot it saw
// each payment's versions with no gap.
func TestBootstrapUnderTraffic(t *testing.T) {
	db := testenv.NewDB(t)
	brokers := testenv.Kafka(t)
	state, latest, ckpt := testenv.Topic(t, "state", 3), testenv.Topic(t, "latest", 3), testenv.Topic(t, "ckpt", 1)
	ctx := t.Context()
	sinktest.StartRelay(t, db.Pool, sink.Config{
		Brokers: brokers, Topic: state, LatestTopic: latest, CheckpointTopic: ckpt, MaxBatchDelay: 5 * time.Millisecond,
	})

	// Writers: each transaction moves 1–5 random payments one version on.
	const payments = 200
	var versions [payments]atomic.Int64
	wctx, stopWriting := context.WithCancel(ctx)
	var written atomic.Int64
	var wg sync.WaitGroup
	for w := range 2 {
		wg.Go(func() {
			for i := 0; wctx.Err() == nil; i++ {
				var events []statelog.Event
				next := map[int]int64{}
				for j := range 1 + i%5 {
					p := (w + 2*(i*7+j*13)) % payments // each writer owns the payments of its parity
					key := fmt.Sprintf("acme:pay_%03d", p)
					if next[p] == 0 {
						next[p] = versions[p].Load()
					}
					next[p]++
					v := next[p]
					st := envelope.State{EventID: envelope.StateEventID(key, v), PaymentKey: key, Source: "acme", Version: v,
						Status: payment.Status("paid"), Payment: payment.State{Status: "paid", Version: v}}
					payload, err := json.Marshal(st)
					if err != nil {
						t.Error(err)
						return
					}
					events = append(events, statelog.Event{Key: key, Version: v, Payload: payload})
				}
				frame, err := statelog.EncodeMessage(events)
				if err == nil {
					_, err = db.Pool.Exec(wctx, statelog.EmitMessageSQL, frame)
				}
				if err != nil {
					if wctx.Err() == nil {
						t.Error(err)
					}
					return
				}
				for p, v := range next { // committed: the versions count
					versions[p].Store(v)
				}
				written.Add(int64(len(events)))
				time.Sleep(2 * time.Millisecond)
			}
		})
	}
	testenv.Eventually(t, time.Minute, func() bool { return written.Load() >= 1500 }, "1500 events written")

	group := testenv.Group(t)
	d := NewDeduper()
	snapshot := map[string]int64{}
	if err := Bootstrap(ctx, brokers, state, latest, group, d, func(ev StateEvent) error {
		snapshot[ev.PaymentKey] = ev.Version
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if len(snapshot) == 0 {
		t.Fatal("the snapshot holds no payment")
	}
	cl, err := NewClient(brokers, state, group)
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	cctx, stopConsuming := context.WithCancel(ctx)
	var mu sync.Mutex
	last := map[string]int64{}
	for k, v := range snapshot {
		last[k] = v
	}
	var gaps []string
	consumed := make(chan error, 1)
	go func() {
		consumed <- Consume(cctx, cl, d, func(ev StateEvent) error {
			mu.Lock()
			defer mu.Unlock()
			if ev.Version != last[ev.PaymentKey]+1 {
				gaps = append(gaps, fmt.Sprintf("%s: v%d after v%d", ev.PaymentKey, ev.Version, last[ev.PaymentKey]))
			}
			last[ev.PaymentKey] = ev.Version
			return nil
		})
	}()
	time.Sleep(time.Second) // more traffic after the bootstrap
	stopWriting()
	wg.Wait()
	done := func() bool {
		mu.Lock()
		defer mu.Unlock()
		for p := range payments {
			if last[fmt.Sprintf("acme:pay_%03d", p)] < versions[p].Load() {
				return false
			}
		}
		return true
	}
	testenv.WaitFor(t, time.Minute, func() error {
		select {
		case err := <-consumed:
			return fmt.Errorf("Consume returned: %w", err)
		default:
		}
		if done() {
			return nil
		}
		mu.Lock()
		defer mu.Unlock()
		behind := 0
		for p := range payments {
			if last[fmt.Sprintf("acme:pay_%03d", p)] < versions[p].Load() {
				behind++
			}
		}
		return fmt.Errorf("%d payments behind their last version", behind)
	})
	stopConsuming()
	<-consumed
	mu.Lock()
	defer mu.Unlock()
	if len(gaps) > 0 {
		t.Errorf("%d gaps after the snapshot, first: %v", len(gaps), gaps[:min(5, len(gaps))])
	}
	t.Logf("%d events written; the snapshot held %d payments; then the consumer followed %d payments to their last version", written.Load(), len(snapshot), len(last))
}
