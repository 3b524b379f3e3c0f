package simulate

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"time"
)

// oracleVersion is the format of a saved Oracle.
const oracleVersion = 1

// Oracle is what really happened in a simulation: every payment's history
// and expected outcome, every webhook and how often the target
// acknowledged it, the poison planted and what the Sampler saw. It is safe
// for concurrent use; Save and Load carry it across processes.
type Oracle struct {
	mu sync.Mutex

	Version   int       `json:"version"`
	IDs       RunIDs    `json:"ids"`
	Seed      int64     `json:"seed"`
	CreatedAt time.Time `json:"created_at"`
	// Payments are the histories, with what each must end as.
	Payments []*OraclePayment `json:"payments"`
	// Events are the distinct webhooks, one per step of each history.
	Events []*OracleEvent `json:"events"`
	// Poison are the records planted on the raw topic (I10).
	Poison []PoisonRecord `json:"poison,omitempty"`
	// StartOffsets are the raw topic's end offsets before the first
	// delivery, when the simulation knew the brokers: I4 checks the
	// offsets from there.
	StartOffsets map[int32]int64 `json:"start_offsets,omitempty"`
	// Samples is what the Sampler saw while the simulation ran.
	Samples *SampleSummary `json:"samples,omitempty"`
	// Stats are the delivery counts.
	Stats DeliveryStats `json:"stats"`
}

// OraclePayment is one payment: its true history and expected outcome.
type OraclePayment struct {
	History
	Expected Expected `json:"expected"`
}

// OracleEvent is one distinct webhook: step Step of payment Payment (an
// index into Payments), its dedup key as the driver computes it, and what
// happened to its deliveries.
type OracleEvent struct {
	Payment  int    `json:"payment"`
	Step     int    `json:"step"`
	EventID  string `json:"event_id"`
	DedupKey string `json:"dedup_key"`
	// Sends is how many times the plan sends it (1 + its duplicates).
	Sends int `json:"sends"`
	// Attempts counts HTTP requests, retries included; Acks the 2xx
	// answers; GivenUp the sends abandoned after the whole retry ladder.
	Attempts int `json:"attempts"`
	Acks     int `json:"acks"`
	GivenUp  int `json:"given_up,omitempty"`
}

// PoisonRecord is one unprocessable record planted on the raw topic.
type PoisonRecord struct {
	Key       string `json:"key"`
	Partition int32  `json:"partition"`
	Offset    int64  `json:"offset"`
}

// ack records the answer to one attempt of event e.
func (o *Oracle) ack(e *OracleEvent, ok bool) {
	o.mu.Lock()
	defer o.mu.Unlock()
	e.Attempts++
	if ok {
		e.Acks++
	}
}

func (o *Oracle) giveUp(e *OracleEvent) {
	o.mu.Lock()
	defer o.mu.Unlock()
	e.GivenUp++
}

// complete reports whether every event of payment p was acknowledged at
// least once: only then is its expected outcome what the target must show.
func (o *Oracle) complete() []bool {
	o.mu.Lock()
	defer o.mu.Unlock()
	out := make([]bool, len(o.Payments))
	for i := range out {
		out[i] = true
	}
	for _, e := range o.Events {
		if e.Acks == 0 {
			out[e.Payment] = false
		}
	}
	return out
}

// Save writes the oracle to path as JSON, atomically (a temporary file
// renamed over it). It holds no secret.
func (o *Oracle) Save(path string) error {
	o.mu.Lock()
	b, err := json.Marshal(o)
	o.mu.Unlock()
	if err != nil {
		return fmt.Errorf("encode oracle: %w", err)
	}
	tmp, err := os.CreateTemp(filepath.Dir(path), filepath.Base(path)+".*")
	if err != nil {
		return fmt.Errorf("save oracle: %w", err)
	}
	if _, err := tmp.Write(b); err != nil {
		tmp.Close()
		os.Remove(tmp.Name())
		return fmt.Errorf("save oracle: %w", err)
	}
	if err := tmp.Close(); err != nil {
		os.Remove(tmp.Name())
		return fmt.Errorf("save oracle: %w", err)
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		os.Remove(tmp.Name())
		return fmt.Errorf("save oracle: %w", err)
	}
	return nil
}

// LoadOracle reads an oracle written by Save.
func LoadOracle(path string) (*Oracle, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("load oracle: %w", err)
	}
	var o Oracle
	if err := json.Unmarshal(b, &o); err != nil {
		return nil, fmt.Errorf("load oracle %s: %w", path, err)
	}
	if o.Version != oracleVersion {
		return nil, fmt.Errorf("load oracle %s: version %d, want %d", path, o.Version, oracleVersion)
	}
	for i, e := range o.Events {
		if e == nil || e.Payment < 0 || e.Payment >= len(o.Payments) || e.Step < 0 || e.Step >= len(o.Payments[e.Payment].Steps) {
			return nil, fmt.Errorf("load oracle %s: event %d does not point at a payment's step", path, i)
		}
	}
	return &o, nil
}

// paymentKeys returns the payment keys, in order.
func (o *Oracle) paymentKeys() []string {
	keys := make([]string, len(o.Payments))
	for i, p := range o.Payments {
		keys[i] = p.PaymentKey
	}
	return keys
}
