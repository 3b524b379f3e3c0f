// Package topics creates paystream's Kafka topics with the configuration a
// production system needs, reports (and where safe, fixes) the drift of
// existing ones, and guards the raw topic's partition count: it is recorded
// in Postgres at migrate time, and CheckPartitions refuses a live count that
// differs, because adding partitions moves payments' keys to other
// partitions and breaks per-payment order.
package topics

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
)

// Defaults of Layout's fields.
const (
	DefaultRawRetention  = 7 * 24 * time.Hour
	DefaultDLQRetention  = 30 * 24 * time.Hour
	DefaultDLQPartitions = 3
)

// Topic config keys paystream sets.
const (
	ConfigRetentionMs       = "retention.ms"
	ConfigMaxMessageBytes   = "max.message.bytes"
	ConfigCompressionType   = "compression.type"
	ConfigMinInsyncReplicas = "min.insync.replicas"
	ConfigCleanupPolicy     = "cleanup.policy"
)

// compressionType is every topic's compression.type: the broker keeps the
// batches as the producer compressed them (franz-go's default, snappy), so
// it never spends CPU recompressing, and max.message.bytes is measured on
// the batch as sent.
const compressionType = "producer"

// minInsync is min.insync.replicas for topics of 3 or more replicas: an
// acks=all write survives the loss of any one broker.
const minInsync = 2

// Layout is paystream's topics as an operator configures them.
type Layout struct {
	// Raw, State and DLQ are the topic names. Required.
	Raw, State, DLQ string
	// Latest is the compacted latest-state topic (see LatestSpec).
	// Defaults to "": none.
	Latest string
	// Checkpoint is the sink's checkpoint topic (see CheckpointSpec).
	// Defaults to "": no checkpoint topic (paystream migrate and dev
	// always name one).
	Checkpoint string
	// Partitions of the raw and state topics when creating them. Required.
	Partitions int32
	// DLQPartitions of the DLQ topic when creating it. Defaults to
	// DefaultDLQPartitions: DLQ records are keyed by source, so more
	// partitions than sources only spread them thinner.
	DLQPartitions int32
	// ReplicationFactor when creating topics; -1 is the broker's default.
	// Defaults to -1.
	ReplicationFactor int16
	// RawRetention is the raw topic's retention.ms: how long webhooks can
	// be re-read (a new consumer group, a rebuild). Defaults to
	// DefaultRawRetention.
	RawRetention time.Duration
	// DLQRetention is the DLQ topic's retention.ms: how long an operator
	// has to look at a dead-lettered webhook. Defaults to
	// DefaultDLQRetention.
	DLQRetention time.Duration
	// MaxMessageBytes is the raw and DLQ topics' max.message.bytes: ingest's
	// largest record (ingest.MaxRecordBytes). Required.
	MaxMessageBytes int32
}

// Spec is one topic as paystream wants it.
type Spec struct {
	Name              string
	Partitions        int32
	ReplicationFactor int16 // -1: the broker's default
	// Configs are the topic configs paystream manages. Ensure adds
	// min.insync.replicas=2 to them for a topic of 3 or more replicas.
	Configs map[string]string
}

// Specs returns l's topics: raw, state, DLQ and, when named, checkpoint.
func (l Layout) Specs() ([]Spec, error) {
	if l.Raw == "" || l.State == "" || l.DLQ == "" {
		return nil, errors.New("topic layout: topic names are required")
	}
	if l.Partitions < 1 || l.DLQPartitions < 0 || l.MaxMessageBytes < 1 || l.RawRetention < 0 || l.DLQRetention < 0 {
		return nil, errors.New("topic layout: partitions and max message bytes must be positive, retentions not negative")
	}
	if l.DLQPartitions == 0 {
		l.DLQPartitions = DefaultDLQPartitions
	}
	if l.ReplicationFactor == 0 {
		l.ReplicationFactor = -1
	}
	if l.RawRetention == 0 {
		l.RawRetention = DefaultRawRetention
	}
	if l.DLQRetention == 0 {
		l.DLQRetention = DefaultDLQRetention
	}
	maxMsg := strconv.Itoa(int(l.MaxMessageBytes))
	specs := []Spec{
		{Name: l.Raw, Partitions: l.Partitions, ReplicationFactor: l.ReplicationFactor, Configs: map[string]string{
			ConfigRetentionMs:     strconv.FormatInt(l.RawRetention.Milliseconds(), 10),
			ConfigMaxMessageBytes: maxMsg,
			ConfigCompressionType: compressionType,
		}},
		{Name: l.State, Partitions: l.Partitions, ReplicationFactor: l.ReplicationFactor, Configs: map[string]string{
			ConfigCompressionType: compressionType,
		}},
		{Name: l.DLQ, Partitions: l.DLQPartitions, ReplicationFactor: l.ReplicationFactor, Configs: map[string]string{
			ConfigRetentionMs:     strconv.FormatInt(l.DLQRetention.Milliseconds(), 10),
			ConfigMaxMessageBytes: maxMsg,
			ConfigCompressionType: compressionType,
		}},
	}
	if l.Latest != "" {
		specs = append(specs, LatestSpec(l.Latest, l.Partitions, l.ReplicationFactor))
	}
	if l.Checkpoint != "" {
		specs = append(specs, CheckpointSpec(l.Checkpoint, l.ReplicationFactor))
	}
	return specs, nil
}

// LatestSpec is the latest-state topic: each payment's newest state event,
// keyed by payment, so it is compacted (no time retention) and has the
// state topic's partitions. A new consumer reads it whole instead of the
// state topic's history (docs/consumers.md, "Starting a new consumer").
func LatestSpec(name string, partitions int32, replicationFactor int16) Spec {
	return Spec{Name: name, Partitions: partitions, ReplicationFactor: replicationFactor, Configs: map[string]string{
		ConfigCleanupPolicy:   "compact",
		ConfigCompressionType: compressionType,
	}}
}

// CheckpointSpec is the sink's checkpoint topic: one record per replication
// slot, rewritten in every Kafka transaction of its relay, of which the
// relay only ever reads the newest. So it is compacted (cleanup.policy
// compact, no time retention) and has one partition, which a relay reads
// from its start when it takes over. replicationFactor -1 is the broker's
// default.
func CheckpointSpec(name string, replicationFactor int16) Spec {
	return Spec{Name: name, Partitions: 1, ReplicationFactor: replicationFactor, Configs: map[string]string{
		ConfigCleanupPolicy:   "compact",
		ConfigCompressionType: compressionType,
	}}
}

// Drift is one difference between a live topic and its Spec.
type Drift struct {
	Topic   string
	Setting string // a config key, or "partitions"
	Have    string // the effective value, "" when there is none
	Want    string
	// Fixed is true when Ensure altered the config to Want. Ensure never
	// changes partition counts, never shortens retention and never lowers
	// max.message.bytes or min.insync.replicas: those are reported only.
	Fixed bool
}

func (d Drift) String() string {
	verb := "kept"
	if d.Fixed {
		verb = "fixed"
	}
	return fmt.Sprintf("topic %s: %s is %q, want %q (%s)", d.Topic, d.Setting, d.Have, d.Want, verb)
}

// Result is what Ensure did.
type Result struct {
	Created []string // topics created
	Drifts  []Drift  // differences found in existing topics
}

// Ensure creates the topics of specs that do not exist, with their configs,
// and compares the existing ones with their spec: configs that can change
// safely (compression, a longer retention, a larger max.message.bytes, a
// higher min.insync.replicas) are altered with IncrementalAlterConfigs;
// everything else is only reported. Partition counts are never changed.
func Ensure(ctx context.Context, adm *kadm.Client, specs []Spec) (Result, error) {
	var res Result
	for _, spec := range specs {
		configs := spec.Configs
		if spec.ReplicationFactor >= 3 {
			configs = withMinInsync(configs)
		}
		resp, err := adm.CreateTopic(ctx, spec.Partitions, spec.ReplicationFactor, ptrs(configs), spec.Name)
		if err == nil {
			err = resp.Err
		}
		switch {
		case err == nil:
			res.Created = append(res.Created, spec.Name)
		case !errors.Is(err, kerr.TopicAlreadyExists):
			return res, fmt.Errorf("create topic %s: %w", spec.Name, err)
		}
		drifts, err := reconcile(ctx, adm, spec)
		if err != nil {
			return res, err
		}
		res.Drifts = append(res.Drifts, drifts...)
	}
	return res, nil
}

// reconcile compares a live topic with spec and alters what is safe to.
func reconcile(ctx context.Context, adm *kadm.Client, spec Spec) ([]Drift, error) {
	td, err := describe(ctx, adm, spec.Name)
	if err != nil {
		return nil, err
	}
	var drifts []Drift
	if n := int32(len(td.Partitions)); n != spec.Partitions {
		drifts = append(drifts, Drift{Topic: spec.Name, Setting: "partitions", Have: strconv.Itoa(int(n)), Want: strconv.Itoa(int(spec.Partitions))})
	}
	want := spec.Configs
	if replicas(td) >= 3 {
		want = withMinInsync(want)
	}
	have, err := topicConfigs(ctx, adm, spec.Name)
	if err != nil {
		return nil, err
	}
	var alter []kadm.AlterConfig
	for _, key := range slices.Sorted(maps.Keys(want)) {
		if have[key] == want[key] {
			continue
		}
		d := Drift{Topic: spec.Name, Setting: key, Have: have[key], Want: want[key], Fixed: safeToSet(key, have[key], want[key])}
		if d.Fixed {
			alter = append(alter, kadm.AlterConfig{Op: kadm.SetConfig, Name: key, Value: &d.Want})
		}
		drifts = append(drifts, d)
	}
	if len(alter) > 0 {
		resps, err := adm.AlterTopicConfigs(ctx, alter, spec.Name)
		if err == nil {
			_, err = resps.On(spec.Name, nil)
		}
		if err != nil {
			return nil, fmt.Errorf("alter configs of topic %s: %w", spec.Name, err)
		}
	}
	return drifts, nil
}

// safeToSet tells whether changing a topic's config key from have ("" when
// unset) to want can neither lose data nor refuse writes accepted today.
func safeToSet(key, have, want string) bool {
	if have == "" {
		return true
	}
	h, errH := strconv.ParseInt(have, 10, 64)
	w, errW := strconv.ParseInt(want, 10, 64)
	numeric := errH == nil && errW == nil
	switch key {
	case ConfigRetentionMs:
		return numeric && h >= 0 && h < w // -1 (forever) or longer: kept
	case ConfigMaxMessageBytes, ConfigMinInsyncReplicas:
		return numeric && h < w
	default:
		return true
	}
}

// topicConfigs returns a topic's effective configs, its own or the
// broker's defaults, by key.
func topicConfigs(ctx context.Context, adm *kadm.Client, topic string) (map[string]string, error) {
	rcs, err := adm.DescribeTopicConfigs(ctx, topic)
	if err != nil {
		return nil, fmt.Errorf("describe configs of topic %s: %w", topic, err)
	}
	rc, err := rcs.On(topic, nil)
	if err == nil {
		err = rc.Err
	}
	if err != nil {
		return nil, fmt.Errorf("describe configs of topic %s: %w", topic, err)
	}
	out := map[string]string{}
	for _, c := range rc.Configs {
		if c.Value != nil {
			out[c.Key] = *c.Value
		}
	}
	return out, nil
}

// describe returns a topic's metadata. A topic just created may take a
// moment to show in every broker's metadata: an unknown topic is asked for
// again, for up to metadataWait.
func describe(ctx context.Context, adm *kadm.Client, topic string) (kadm.TopicDetail, error) {
	deadline := time.Now().Add(metadataWait)
	for delay := 20 * time.Millisecond; ; delay = min(2*delay, time.Second) {
		td, err := describeOnce(ctx, adm, topic)
		if !errors.Is(err, kerr.UnknownTopicOrPartition) || time.Now().After(deadline) {
			return td, err
		}
		select {
		case <-ctx.Done():
			return td, err
		case <-time.After(delay):
		}
	}
}

// metadataWait is how long describe waits for a topic to show.
const metadataWait = 10 * time.Second

func describeOnce(ctx context.Context, adm *kadm.Client, topic string) (kadm.TopicDetail, error) {
	tds, err := adm.ListTopics(ctx, topic)
	if err != nil {
		return kadm.TopicDetail{}, fmt.Errorf("describe topic %s: %w", topic, err)
	}
	td, ok := tds[topic]
	if !ok {
		return kadm.TopicDetail{}, fmt.Errorf("describe topic %s: %w", topic, kerr.UnknownTopicOrPartition)
	}
	if td.Err != nil {
		return kadm.TopicDetail{}, fmt.Errorf("describe topic %s: %w", topic, td.Err)
	}
	return td, nil
}

// replicas returns the replica count of a topic's first partition.
func replicas(td kadm.TopicDetail) int {
	for _, p := range td.Partitions {
		return len(p.Replicas)
	}
	return 0
}

func withMinInsync(configs map[string]string) map[string]string {
	out := maps.Clone(configs)
	out[ConfigMinInsyncReplicas] = strconv.Itoa(minInsync)
	return out
}

func ptrs(m map[string]string) map[string]*string {
	out := make(map[string]*string, len(m))
	for k, v := range m {
		out[k] = &v
	}
	return out
}

// MaxMessageBytes returns a topic's effective max.message.bytes.
func MaxMessageBytes(ctx context.Context, adm *kadm.Client, topic string) (int32, error) {
	cfgs, err := topicConfigs(ctx, adm, topic)
	if err != nil {
		return 0, err
	}
	n, err := strconv.ParseInt(cfgs[ConfigMaxMessageBytes], 10, 32)
	if err != nil {
		return 0, fmt.Errorf("topic %s: max.message.bytes %q: %w", topic, cfgs[ConfigMaxMessageBytes], err)
	}
	return int32(n), nil
}
