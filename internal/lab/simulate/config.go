package simulate

import (
	"cmp"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"net"
	"net/http"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/paystream/paystream/internal/lab/loadgen"
)

// Config configures a Simulation.
type Config struct {
	// SourcesFile is the sources file the target's ingest runs with: the
	// simulator signs with its secrets. Required.
	SourcesFile string
	// IngestURL is ingest's base URL, e.g. http://127.0.0.1:8080. Required
	// to Deliver.
	IngestURL string
	// Payments is the number of payments, spread over the sources in turn.
	// Defaults to 100.
	Payments int
	// MinDeliveries, when positive, raises Payments until the plan holds
	// at least this many sends (histories differ in length, so a payment
	// count alone does not say how many webhooks a run sends).
	MinDeliveries int
	// Duplicates is the fraction of deliveries, in [0, 1), that re-send a
	// webhook already sent (same ids and body, a fresh signature).
	Duplicates float64
	// Reorder is the fraction of webhooks, in [0, 1], sent later than
	// their place in the payment's history, usually after a later step.
	Reorder float64
	// Rate is the target in requests per second; 0 sends as fast as
	// Concurrency allows.
	Rate float64
	// Burst is how many requests may go at once above Rate; defaults to
	// 1% of Rate (at least 1). Ignored without Rate.
	Burst int
	// Concurrency is the number of senders, each with one request in
	// flight. Defaults to 16.
	Concurrency int
	// MaxDelay delays each delivery's first attempt by a random time up to
	// MaxDelay, as gateways' queues do. Defaults to 0.
	MaxDelay time.Duration
	// RetryLadder is how long a delivery answered anything but a 2xx (or
	// not answered) waits before each retry; after the last wait's retry
	// fails it is given up. Defaults to DefaultRetryLadder.
	RetryLadder []time.Duration
	// RequestTimeout bounds one request. Defaults to 10s.
	RequestTimeout time.Duration
	// Seed makes the run reproducible: the same Seed and Config give the
	// same histories and plan. 0 picks one at random.
	Seed int64
	// Drivers restricts the run to the sources of these drivers; empty
	// means every source of the sources file the simulator can drive.
	Drivers []string
	// GatewayListen is the address (loopback) of the fake gateway API the
	// refetching sources' api_base_url must point at. GatewayListener,
	// when set, is used instead (tests listen on port 0 first).
	GatewayListen   string
	GatewayListener net.Listener
	// Poison plants this many unprocessable records (one each for its own
	// payment) on the raw topic halfway through the delivery, for I10.
	// Needs KafkaBrokers and RawTopic.
	Poison int
	// KafkaBrokers and RawTopic, when set, let Deliver record where the raw
	// topic's partitions started (I4) and plant the poison.
	KafkaBrokers []string
	RawTopic     string
	// KafkaOpts are extra franz-go options given to every Kafka client,
	// e.g. TLS and SASL from internal/kafkaconn. Defaults to none.
	KafkaOpts []kgo.Opt
	// Sampler, when set, is started by Deliver (unless already running)
	// and stopped by Verify once the backlog drained.
	Sampler *Sampler
	// ProgressInterval is how often Deliver calls progress. Defaults to 1s.
	ProgressInterval time.Duration
	// Client sends the webhooks. Defaults to a keep-alive client sized for
	// Concurrency with RequestTimeout.
	Client *http.Client
}

// DefaultRetryLadder is the retry ladder unless Config says otherwise:
// about a minute in all, a compressed version of gateways' days.
var DefaultRetryLadder = []time.Duration{
	100 * time.Millisecond, 250 * time.Millisecond, 500 * time.Millisecond, time.Second,
	2 * time.Second, 4 * time.Second, 8 * time.Second, 15 * time.Second, 30 * time.Second,
}

func (cfg *Config) check() error {
	switch {
	case cfg.SourcesFile == "":
		return errors.New("simulate config: SourcesFile is required")
	case cfg.Payments < 0:
		return errors.New("simulate config: Payments must be positive")
	case cfg.MinDeliveries < 0:
		return errors.New("simulate config: MinDeliveries must not be negative")
	case cfg.Duplicates < 0 || cfg.Duplicates >= 1 || math.IsNaN(cfg.Duplicates):
		return fmt.Errorf("simulate config: Duplicates %v: want a fraction in [0, 1)", cfg.Duplicates)
	case cfg.Reorder < 0 || cfg.Reorder > 1 || math.IsNaN(cfg.Reorder):
		return fmt.Errorf("simulate config: Reorder %v: want a fraction in [0, 1]", cfg.Reorder)
	case cfg.Rate < 0 || math.IsInf(cfg.Rate, 0) || math.IsNaN(cfg.Rate):
		return fmt.Errorf("simulate config: Rate %v: want requests per second, or 0 for no limit", cfg.Rate)
	case cfg.Concurrency < 0 || cfg.Burst < 0 || cfg.MaxDelay < 0 || cfg.Poison < 0:
		return errors.New("simulate config: Concurrency, Burst, MaxDelay and Poison must not be negative")
	case cfg.Poison > 0 && (len(cfg.KafkaBrokers) == 0 || cfg.RawTopic == ""):
		return errors.New("simulate config: Poison needs KafkaBrokers and RawTopic")
	}
	for _, d := range cfg.RetryLadder {
		if d < 0 {
			return errors.New("simulate config: RetryLadder waits must not be negative")
		}
	}
	return nil
}

func (cfg *Config) setDefaults() {
	cfg.Payments = cmp.Or(cfg.Payments, 100)
	cfg.Concurrency = cmp.Or(cfg.Concurrency, 16)
	cfg.RequestTimeout = cmp.Or(cfg.RequestTimeout, 10*time.Second)
	cfg.ProgressInterval = cmp.Or(cfg.ProgressInterval, time.Second)
	if cfg.RetryLadder == nil {
		cfg.RetryLadder = DefaultRetryLadder
	}
	if cfg.Burst == 0 {
		cfg.Burst = max(1, int(math.Ceil(cfg.Rate/100)))
	}
	if cfg.Seed == 0 {
		var b [8]byte
		_, _ = rand.Read(b[:])
		cfg.Seed = int64(binary.LittleEndian.Uint64(b[:]) >> 1)
	}
	if cfg.Client == nil {
		cfg.Client = loadgen.NewClient(cfg.Concurrency, cfg.RequestTimeout)
	}
}
