package simulate

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kgo"
)

// Target is the running pipeline a simulation verifies.
type Target struct {
	// DatabaseURL and Schema reach the processor's tables (Schema, when
	// set, becomes the search_path). Pool, when set, is used instead.
	DatabaseURL, Schema string
	Pool                *pgxpool.Pool
	// KafkaBrokers, RawTopic, StateTopic and Group are the pipeline's
	// brokers, topics and processor group.
	KafkaBrokers []string
	RawTopic     string
	StateTopic   string
	Group        string
	// KafkaOpts are extra franz-go options given to every Kafka client,
	// e.g. TLS and SASL from internal/kafkaconn. Defaults to none.
	KafkaOpts []kgo.Opt
	// DrainTimeout bounds the wait for the backlog to drain (every raw
	// record applied, every refetch done, every transition on the state
	// topic). Defaults to 2 minutes.
	DrainTimeout time.Duration
	// StallLimit is I9's bound on the longest time the Sampler saw a
	// backlog without progress. Defaults to 60s.
	StallLimit time.Duration
	// Progress, when set, is told what the drain waits for, about once a
	// second.
	Progress func(string)
}

// InvariantResult is one invariant's verdict.
type InvariantResult struct {
	ID   string `json:"id"`
	Name string `json:"name"`
	OK   bool   `json:"ok"`
	// Skipped marks an invariant the run did not exercise (OK stays true).
	Skipped bool `json:"skipped,omitempty"`
	// Detail says how it was checked, with numbers, and the first
	// violations found.
	Detail string `json:"detail"`
	// Checked counts the items checked (webhooks, records, payments…);
	// Violations the violations found.
	Checked    int `json:"checked"`
	Violations int `json:"violations"`
}

// Report is a verification's result: one line per invariant, I1 to I10.
type Report struct {
	Invariants []InvariantResult `json:"invariants"`
	// Drained says whether the backlog drained within DrainTimeout, and
	// DrainTime how long the wait took.
	Drained   bool          `json:"drained"`
	DrainTime time.Duration `json:"drain_time_ns"`
	// Payments counts the payments checked, Incomplete those left out of
	// the state checks because a webhook of theirs was never acknowledged.
	Payments   int `json:"payments"`
	Incomplete int `json:"incomplete"`
}

// OK reports whether every invariant holds.
func (r Report) OK() bool {
	for _, inv := range r.Invariants {
		if !inv.OK {
			return false
		}
	}
	return len(r.Invariants) > 0
}

// Failed returns the ids of the invariants that do not hold.
func (r Report) Failed() []string {
	var ids []string
	for _, inv := range r.Invariants {
		if !inv.OK {
			ids = append(ids, inv.ID)
		}
	}
	return ids
}

// Result returns invariant id's result (zero when absent).
func (r Report) Result(id string) InvariantResult {
	for _, inv := range r.Invariants {
		if inv.ID == id {
			return inv
		}
	}
	return InvariantResult{}
}

// Verify waits (up to t.DrainTimeout) for the target to apply everything
// it acknowledged, then checks I1–I10 against the oracle. An error means
// it could not read the target; violations are in the Report.
func (s *Simulation) Verify(ctx context.Context, t Target) (Report, error) {
	switch {
	case len(t.KafkaBrokers) == 0 || t.RawTopic == "" || t.StateTopic == "" || t.Group == "":
		return Report{}, errors.New("verify: KafkaBrokers, RawTopic, StateTopic and Group are required")
	case t.Pool == nil && t.DatabaseURL == "":
		return Report{}, errors.New("verify: DatabaseURL (or Pool) is required")
	}
	t.DrainTimeout = cmp.Or(t.DrainTimeout, 2*time.Minute)
	t.StallLimit = cmp.Or(t.StallLimit, time.Minute)
	pool := t.Pool
	if pool == nil {
		var err error
		if pool, err = openPool(ctx, t.DatabaseURL, t.Schema); err != nil {
			return Report{}, err
		}
		defer pool.Close()
	}
	o := s.oracle
	complete := o.complete()
	keys := o.paymentKeys()

	began := time.Now()
	drained, why, err := s.drain(ctx, pool, t, keys, complete)
	if err != nil {
		return Report{}, err
	}
	rep := Report{Drained: drained, DrainTime: time.Since(began), Payments: len(keys)}
	for _, c := range complete {
		if !c {
			rep.Incomplete++
		}
	}
	s.FinishSampling()
	snap, err := read(ctx, pool, t, o, keys)
	if err != nil {
		return Report{}, err
	}
	rep.Invariants = []InvariantResult{
		checkI1(o, snap),
		checkI2(o, snap),
		checkI3(snap),
		checkI4(o, snap),
		checkI5(o, snap),
		checkI6(snap),
		checkI7(o, snap, complete),
		checkI8(snap),
		checkI9(o, drained, why, rep.DrainTime, t.StallLimit),
		checkI10(o, snap),
	}
	return rep, nil
}

// openPool connects to url with schema as its search_path.
func openPool(ctx context.Context, url, schema string) (*pgxpool.Pool, error) {
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		return nil, fmt.Errorf("parse database URL: %w", err) // pgx redacts the password
	}
	if schema != "" {
		cfg.ConnConfig.RuntimeParams["search_path"] = schema
	}
	cfg.ConnConfig.RuntimeParams["application_name"] = "paystream simulate"
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("connect to postgres: %w", err)
	}
	return pool, nil
}

// drain waits until the stored offsets reached the raw topic's end, no
// delivery of a complete payment waits (deferred), and every transition
// of the oracle's payments is on the state topic; or until the timeout.
// It reports whether it drained and, if not, what it was waiting for.
func (s *Simulation) drain(ctx context.Context, pool *pgxpool.Pool, t Target, keys []string, complete []bool) (bool, string, error) {
	deadline := time.Now().Add(t.DrainTimeout)
	var waitingKeys []string
	for i, k := range keys {
		if complete[i] {
			waitingKeys = append(waitingKeys, k)
		}
	}
	why := ""
	for {
		why = ""
		// The pipeline's services may be restarting: an error reading
		// them is something to wait for, like a backlog.
		ends, err := endOffsets(ctx, t.kafkaOpts(), t.RawTopic)
		if err != nil {
			why = err.Error()
		}
		stored, _, err := storedOffsets(ctx, pool, t.Group, t.RawTopic)
		if err != nil && why == "" {
			why = err.Error()
		}
		var behind int64
		for p, end := range ends {
			behind += max(0, end-stored[p])
		}
		if why == "" && behind > 0 {
			why = fmt.Sprintf("%d raw records not applied", behind)
		}
		if why == "" {
			var waiting int
			err := pool.QueryRow(ctx, `SELECT count(*) FROM deliveries WHERE payment_key = ANY($1) AND status = 'deferred'`, waitingKeys).Scan(&waiting)
			switch {
			case err != nil:
				why = err.Error()
			case waiting > 0:
				why = fmt.Sprintf("%d deliveries deferred (refetch or predecessor pending)", waiting)
			}
		}
		if why == "" {
			var want int
			if err := pool.QueryRow(ctx, `SELECT count(*) FROM payment_transitions WHERE payment_key = ANY($1)`, keys).Scan(&want); err != nil {
				why = err.Error()
			} else {
				state, err := readState(ctx, t.kafkaOpts(), t.StateTopic, toSet(keys))
				seen := map[string]bool{}
				for _, r := range state {
					seen[r.eventID] = true
				}
				switch {
				case err != nil:
					why = err.Error()
				case len(seen) < want:
					why = fmt.Sprintf("%d of %d transitions on the state topic", len(seen), want)
				}
			}
		}
		if why == "" {
			return true, "", nil
		}
		if t.Progress != nil {
			t.Progress("draining: " + why)
		}
		if ctx.Err() != nil {
			return false, why, fmt.Errorf("verify: %w", ctx.Err())
		}
		if time.Now().After(deadline) {
			return false, why, nil
		}
		if !sleep(ctx, 500*time.Millisecond) {
			return false, why, ctx.Err()
		}
	}
}

func toSet(keys []string) map[string]bool {
	m := make(map[string]bool, len(keys))
	for _, k := range keys {
		m[k] = true
	}
	return m
}
