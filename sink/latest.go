package sink

import (
	"context"
	"fmt"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/paystream/paystream/internal/topics"
)

// latestRecords returns, for the latest-state topic named topic, the
// newest of records (state records, per payment in version order) of each
// payment: the same key, value and headers (an Avro value with topic's
// schema id, per enc). None when topic is "".
func latestRecords(topic string, records []*kgo.Record, enc *encoding) []*kgo.Record {
	if topic == "" {
		return nil
	}
	seen := make(map[string]bool, len(records))
	var out []*kgo.Record
	for i := len(records) - 1; i >= 0; i-- {
		r := records[i]
		if seen[string(r.Key)] {
			continue
		}
		seen[string(r.Key)] = true
		value, headers := enc.retarget(r.Value, r.Headers, topic)
		out = append(out, &kgo.Record{Topic: topic, Key: r.Key, Value: value, Headers: headers})
	}
	return out
}

// ensureLatestTopic creates the latest-state topic latest, compacted and
// with the state topic's partitions, unless it exists or latest is "".
func ensureLatestTopic(ctx context.Context, adm *kadm.Client, state, latest string) error {
	if latest == "" {
		return nil
	}
	listed, err := adm.ListTopics(ctx, state, latest)
	if err != nil {
		return fmt.Errorf("look up topics %s and %s: %w", state, latest, err)
	}
	if listed.Has(latest) {
		return nil
	}
	st, ok := listed[state]
	if !ok || st.Err != nil || len(st.Partitions) == 0 {
		return fmt.Errorf("create latest-state topic %s: state topic %s not found (paystream migrate creates both)", latest, state)
	}
	return createTopic(ctx, adm, topics.LatestSpec(latest, int32(len(st.Partitions)), -1), "latest-state topic")
}
