package main

import (
	"context"
	"encoding/json"
	"fmt"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
)

// Bootstrap starts consumer group group from the latest-state topic (each
// payment's newest event, compacted) instead of the state topic's whole
// history, and misses nothing that follows:
//
//  1. it lists the state topic's last stable offsets E: every record below
//     them is committed or aborted;
//  2. then the latest-state topic's high watermarks H;
//  3. it reads the latest-state topic with read_committed up to H (waiting
//     for any transaction open below H to end), handing each payment's
//     newest event to handle and recording it in d;
//  4. it commits E as the group's offsets on the state topic.
//
// The sink writes both topics in the same Kafka transactions, so every
// transaction below E is in what step 3 read, and Consume from E misses
// nothing; d skips the versions the snapshot already covered. The group
// must be new (no committed offsets, no members).
func Bootstrap(ctx context.Context, brokers []string, stateTopic, latestTopic, group string, d *Deduper, handle func(StateEvent) error) error {
	admCl, err := kgo.NewClient(kgo.SeedBrokers(brokers...))
	if err != nil {
		return err
	}
	defer admCl.Close()
	adm := kadm.NewClient(admCl)
	stable, err := adm.ListCommittedOffsets(ctx, stateTopic)
	if err == nil {
		err = stable.Error()
	}
	if err != nil {
		return fmt.Errorf("list %s's last stable offsets: %w", stateTopic, err)
	}
	ends, err := adm.ListEndOffsets(ctx, latestTopic)
	if err == nil {
		err = ends.Error()
	}
	if err != nil {
		return fmt.Errorf("list %s's end offsets: %w", latestTopic, err)
	}
	todo := map[int32]int64{}
	from := map[int32]kgo.Offset{}
	ends.Each(func(o kadm.ListedOffset) {
		if o.Offset > 0 {
			todo[o.Partition] = o.Offset
			from[o.Partition] = kgo.NewOffset().AtStart()
		}
	})
	if len(todo) > 0 {
		cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...),
			kgo.ConsumePartitions(map[string]map[int32]kgo.Offset{latestTopic: from}),
			kgo.FetchIsolationLevel(kgo.ReadCommitted()),
			kgo.KeepControlRecords()) // so the end is seen when the last records are markers
		if err != nil {
			return err
		}
		defer cl.Close()
		for len(todo) > 0 {
			fetches := cl.PollFetches(ctx)
			if err := ctx.Err(); err != nil {
				return err
			}
			if err := fetches.Err0(); err != nil {
				return fmt.Errorf("fetch %s: %w", latestTopic, err)
			}
			var herr error
			fetches.EachRecord(func(r *kgo.Record) {
				if end, ok := todo[r.Partition]; ok && r.Offset+1 >= end {
					delete(todo, r.Partition)
				}
				if herr != nil || r.Attrs.IsControl() {
					return
				}
				var ev StateEvent
				if err := json.Unmarshal(r.Value, &ev); err != nil {
					herr = fmt.Errorf("record %s/%d/%d: %w", r.Topic, r.Partition, r.Offset, err)
					return
				}
				if d.Seen(ev) {
					return
				}
				if herr = handle(ev); herr == nil {
					d.Done(ev)
				}
			})
			if herr != nil {
				return herr
			}
		}
	}
	offsets := kadm.Offsets{}
	stable.Each(func(o kadm.ListedOffset) {
		offsets.Add(kadm.Offset{Topic: stateTopic, Partition: o.Partition, At: o.Offset, LeaderEpoch: -1})
	})
	committed, err := adm.CommitOffsets(ctx, group, offsets)
	if err == nil {
		err = committed.Error()
	}
	if err != nil {
		return fmt.Errorf("commit group %s's offsets on %s: %w", group, stateTopic, err)
	}
	return nil
}
