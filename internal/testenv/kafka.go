package testenv

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
)

// Kafka returns the seed brokers of the test Kafka cluster: the
// environment's, else a container's. It fails the test when the brokers do
// not answer.
func Kafka(t testing.TB) []string {
	t.Helper()
	SkipIfShort(t)
	var brokers []string
	if env := os.Getenv(EnvKafkaBrokers); strings.TrimSpace(env) != "" {
		for b := range strings.SplitSeq(env, ",") {
			if b = strings.TrimSpace(b); b != "" {
				brokers = append(brokers, b)
			}
		}
	} else {
		var err error
		if brokers, err = kafkaContainer(); err != nil {
			t.Fatalf("testenv: no Kafka for tests: %s is unset and %v\n%s", EnvKafkaBrokers, err, howToStart)
		}
	}
	if err := pingKafka(brokers); err != nil {
		t.Fatalf("testenv: Kafka at %s does not answer: %v\n%s", strings.Join(brokers, ","), err, howToStart)
	}
	return brokers
}

// kafkaStartupGrace is how long Kafka waits for brokers that refuse
// connections, as one still starting does.
var kafkaStartupGrace = 10 * time.Second

// pinged remembers, per broker list, whether the cluster answered, so that
// a test binary asks once.
var pinged sync.Map // string → *pingResult

type pingResult struct {
	once sync.Once
	err  error
}

func pingKafka(brokers []string) error {
	v, _ := pinged.LoadOrStore(strings.Join(brokers, ","), new(pingResult))
	r := v.(*pingResult)
	r.once.Do(func() {
		adm, closeAdm, err := newAdmin(brokers)
		if err != nil {
			r.err = err
			return
		}
		defer closeAdm()
		// A broker that is still starting refuses connections for a few
		// seconds: give it those before failing every test in the binary.
		deadline := time.Now().Add(kafkaStartupGrace)
		for delay := 50 * time.Millisecond; ; delay = min(2*delay, time.Second) {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			_, r.err = adm.BrokerMetadata(ctx)
			cancel()
			left := time.Until(deadline)
			if r.err == nil || left <= 0 {
				return
			}
			time.Sleep(min(delay, left))
		}
	})
	return r.err
}

// Admin returns an admin client for brokers, closed when the test ends.
func Admin(t testing.TB, brokers []string) *kadm.Client {
	t.Helper()
	adm, closeAdm, err := newAdmin(brokers)
	if err != nil {
		t.Fatalf("testenv: %v", err)
	}
	t.Cleanup(closeAdm)
	return adm
}

func newAdmin(brokers []string) (*kadm.Client, func(), error) {
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...))
	if err != nil {
		return nil, nil, fmt.Errorf("kafka client: %w", err)
	}
	return kadm.NewClient(cl), cl.Close, nil
}

// Topic creates a topic for the test with the given number of partitions
// (replication factor 1), named prefix, the test's name and a random
// suffix joined by '-', waits until the cluster's metadata shows every
// partition with a leader, and deletes the topic when the test ends.
func Topic(t testing.TB, prefix string, partitions int) string {
	t.Helper()
	if partitions < 1 {
		t.Fatalf("testenv: Topic %q: partitions = %d, want at least 1", prefix, partitions)
	}
	brokers := Kafka(t)
	name := uniqueName(prefix, t.Name())

	adm, closeAdm, err := newAdmin(brokers)
	if err != nil {
		t.Fatalf("testenv: %v", err)
	}
	defer closeAdm()
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()

	resp, err := adm.CreateTopic(ctx, int32(partitions), 1, nil, name)
	if err == nil {
		err = resp.Err
	}
	if err != nil {
		t.Fatalf("testenv: create topic %s: %v", name, err)
	}
	t.Cleanup(func() { DeleteTopics(t, brokers, name) })

	if err := waitForTopic(ctx, adm, name, partitions); err != nil {
		t.Fatalf("testenv: topic %s: %v", name, err)
	}
	return name
}

// waitForTopic polls metadata until the topic has its partitions, each
// with a leader.
func waitForTopic(ctx context.Context, adm *kadm.Client, name string, partitions int) error {
	var last error
	for delay := 10 * time.Millisecond; ; delay = min(2*delay, 250*time.Millisecond) {
		md, err := adm.Metadata(ctx, name)
		switch {
		case err != nil:
			last = err
		default:
			last = topicReady(md.Topics[name], partitions)
			if last == nil {
				return nil
			}
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("not ready in metadata: %w (last: %v)", ctx.Err(), last)
		case <-time.After(delay):
		}
	}
}

func topicReady(td kadm.TopicDetail, partitions int) error {
	if td.Err != nil {
		return td.Err
	}
	if len(td.Partitions) != partitions {
		return fmt.Errorf("metadata shows %d partitions, want %d", len(td.Partitions), partitions)
	}
	for _, p := range td.Partitions {
		if p.Err != nil {
			return fmt.Errorf("partition %d: %w", p.Partition, p.Err)
		}
		if p.Leader < 0 {
			return fmt.Errorf("partition %d has no leader", p.Partition)
		}
	}
	return nil
}

// DeleteTopics deletes the named topics that exist, and fails the test if
// the cluster refuses to delete one.
func DeleteTopics(t testing.TB, brokers []string, names ...string) {
	t.Helper()
	adm, closeAdm, err := newAdmin(brokers)
	if err != nil {
		t.Errorf("testenv: delete topics %v: %v", names, err)
		return
	}
	defer closeAdm()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	resps, err := adm.DeleteTopics(ctx, names...)
	if err != nil {
		t.Errorf("testenv: delete topics %v: %v", names, err)
		return
	}
	for _, r := range resps.Sorted() {
		if r.Err != nil && !errors.Is(r.Err, kerr.UnknownTopicOrPartition) {
			t.Errorf("testenv: delete topic %s: %v", r.Topic, r.Err)
		}
	}
}

// Group returns a consumer group name no other test uses.
func Group(t testing.TB) string {
	t.Helper()
	return uniqueName("g", t.Name())
}

// uniqueName joins prefix, the sanitized test name and a random suffix,
// within Kafka's 249-byte limit on topic names.
func uniqueName(prefix, testName string) string {
	parts := []string{}
	if prefix = strings.Trim(prefix, "-"); prefix != "" {
		parts = append(parts, prefix)
	}
	if n := sanitizedName(testName, 120); n != "" {
		parts = append(parts, n)
	}
	return strings.Join(append(parts, randomSuffix(4)), "-")
}
