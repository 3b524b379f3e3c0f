package simulate

import (
	"cmp"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"
)

// maxListed is how many violations a Detail names.
const maxListed = 5

// violations collects an invariant's violations, keeping the first few.
type violations struct {
	n     int
	first []string
}

func (v *violations) add(format string, args ...any) {
	v.n++
	if len(v.first) < maxListed {
		v.first = append(v.first, fmt.Sprintf(format, args...))
	}
}

// result builds an InvariantResult: how is the method, always said.
func (v *violations) result(id, name string, checked int, how string) InvariantResult {
	r := InvariantResult{ID: id, Name: name, OK: v.n == 0, Checked: checked, Violations: v.n, Detail: how}
	if v.n > 0 {
		r.Detail = fmt.Sprintf("%d violation(s): %s; checked: %s", v.n, strings.Join(v.first, "; "), how)
	}
	return r
}

// byDedupKey maps each (source, dedup key) to its deliveries.
func byDedupKey(snap *snapshot) map[[2]string][]deliveryRow {
	m := map[[2]string][]deliveryRow{}
	for _, d := range snap.deliveries {
		k := [2]string{d.source, d.key}
		m[k] = append(m[k], d)
	}
	return m
}

// isRedelivery reports whether d is recorded as a redelivery of an
// earlier delivery of the same event.
func (d deliveryRow) isRedelivery() bool { return d.duplicateOf != nil }

func checkI1(o *Oracle, snap *snapshot) InvariantResult {
	var v violations
	byKey := byDedupKey(snap)
	checked := 0
	for _, e := range o.Events {
		if e.Acks == 0 {
			continue
		}
		checked++
		src := o.Payments[e.Payment].Source
		ds := byKey[[2]string{src, e.DedupKey}]
		first := 0
		for _, d := range ds {
			if !d.isRedelivery() {
				first++
			}
		}
		switch {
		case first != 1:
			v.add("%s event %s: %d first deliveries in the inbox, want 1", src, e.EventID, first)
		case len(ds) < e.Acks:
			v.add("%s event %s: acknowledged %d times, %d deliveries recorded", src, e.EventID, e.Acks, len(ds))
		}
	}
	// Every transition (a state change) on the state topic exactly once.
	onTopic := map[string]int{}
	for _, r := range snap.state {
		onTopic[r.eventID]++
	}
	transitions := 0
	for key, trs := range snap.transitions {
		for _, tr := range trs {
			transitions++
			id := fmt.Sprintf("%s:%d", key, tr.version)
			if n := onTopic[id]; n != 1 {
				v.add("transition %s on the state topic %d times, want 1", id, n)
			}
		}
	}
	return v.result("I1", "every acknowledged webhook in the inbox once, each state change on the topic once", checked,
		fmt.Sprintf("%d acknowledged webhooks: exactly one first delivery per (source, dedup key as the driver computes it) and at least as many deliveries as 2xx answers; %d transitions each read once from the state topic (read_committed)", checked, transitions))
}

func checkI2(o *Oracle, snap *snapshot) InvariantResult {
	var v violations
	// A delivery id -> (source, dedup key).
	keyOf := map[int64][2]string{}
	for _, d := range snap.deliveries {
		keyOf[d.id] = [2]string{d.source, d.key}
	}
	checked := 0
	for key, trs := range snap.transitions {
		checked++
		causes := map[[2]string]map[int64]bool{}
		seen := map[string]int64{}
		for _, tr := range trs {
			if tr.deliveryID != nil {
				k := keyOf[*tr.deliveryID]
				if causes[k] == nil {
					causes[k] = map[int64]bool{}
				}
				causes[k][*tr.deliveryID] = true
			}
			fact := ""
			switch tr.kind {
			case "capture", "dispute", "dispute_won", "dispute_lost":
				fact = tr.kind
			case "refund":
				fact = "refund " + tr.refund
			case "status":
				fact = "status " + tr.to
			}
			if fact == "" {
				continue
			}
			if prev, ok := seen[fact]; ok {
				v.add("%s: %s applied twice (versions %d and %d)", key, fact, prev, tr.version)
			}
			seen[fact] = tr.version
		}
		for k, ds := range causes {
			if len(ds) > 1 {
				v.add("%s: event %s/%s had effects from %d deliveries", key, k[0], k[1], len(ds))
			}
		}
	}
	return v.result("I2", "zero duplicate effects", checked,
		fmt.Sprintf("%d payments' transitions: no capture, dispute, dispute outcome, refund id or status reached twice, and no two deliveries of one event both causing transitions", checked))
}

func checkI3(snap *snapshot) InvariantResult {
	var v violations
	seen := map[string]int{}
	for _, r := range snap.state {
		if r.eventID == "" {
			v.add("record %d@%d without an event-id header", r.partition, r.offset)
			continue
		}
		seen[r.eventID]++
		if seen[r.eventID] == 2 {
			v.add("event id %s read twice", r.eventID)
		}
	}
	return v.result("I3", "no repeated event id for read_committed consumers", len(snap.state),
		fmt.Sprintf("%d records of the simulated payments read with read_committed from the start of the state topic: %d distinct event ids", len(snap.state), len(seen)))
}

func checkI4(o *Oracle, snap *snapshot) InvariantResult {
	var v violations
	how := []string{}
	if o.Samples != nil {
		for _, r := range o.Samples.OffsetRegressions {
			v.add("%s", r)
		}
		how = append(how, fmt.Sprintf("sampled stored offsets %d times: %d decreases", o.Samples.Polls, len(o.Samples.OffsetRegressions)))
	} else {
		how = append(how, "no sampler: decreases not watched")
	}
	checked := 0
	for p, end := range snap.ends {
		lo := o.StartOffsets[p]
		stored := snap.stored[p]
		if end <= lo {
			continue
		}
		checked++
		if stored != end {
			v.add("partition %d: stored offset %d, end offset %d", p, stored, end)
			continue
		}
		r := snap.ranges[p]
		if want := stored - lo; r.distinct != want || r.rows != r.distinct {
			v.add("partition %d: %d delivery rows at %d distinct offsets in [%d, %d), want %d", p, r.rows, r.distinct, lo, stored, want)
		}
	}
	from := "the simulation's start"
	if o.StartOffsets == nil {
		from = "offset 0 (where the simulation started is unknown: no brokers while delivering)"
	}
	how = append(how, fmt.Sprintf("%d partitions: stored offset equals the end offset and every offset from %s to it has its delivery row (none skipped)", checked, from))
	return v.result("I4", "stored offsets never decrease, none skipped", checked, strings.Join(how, "; "))
}

func checkI5(o *Oracle, snap *snapshot) InvariantResult {
	var v violations
	how := "from outside, a revoked worker's commit that succeeded shows as a second delivery row for a raw record, or an owner epoch going back"
	if o.Samples != nil {
		for _, r := range o.Samples.EpochRegressions {
			v.add("%s", r)
		}
		how += fmt.Sprintf("; sampled epochs %d times: %d decreases", o.Samples.Polls, len(o.Samples.EpochRegressions))
	} else {
		how += "; no sampler: epochs not watched"
	}
	checked := 0
	for p, r := range snap.ranges {
		checked++
		if r.rows != r.distinct {
			v.add("partition %d: %d delivery rows for %d raw records", p, r.rows, r.distinct)
		}
	}
	how += fmt.Sprintf("; %d partitions: one delivery row per raw record", checked)
	return v.result("I5", "a revoked worker's commit fails", checked, how)
}

func checkI6(snap *snapshot) InvariantResult {
	var v violations
	type seen struct {
		partition int32
		last      int64
	}
	per := map[string]*seen{}
	for _, r := range snap.state {
		if r.decodeErr != nil {
			v.add("record %d@%d: %v", r.partition, r.offset, r.decodeErr)
			continue
		}
		s := per[r.key]
		if s == nil {
			s = &seen{partition: r.partition}
			per[r.key] = s
		}
		if r.partition != s.partition {
			v.add("%s on partitions %d and %d", r.key, s.partition, r.partition)
		}
		if r.ev.Version != s.last+1 {
			v.add("%s: version %d after %d", r.key, r.ev.Version, s.last)
		}
		s.last = max(s.last, r.ev.Version)
	}
	for key, p := range snap.payments {
		got := int64(0)
		if s := per[key]; s != nil {
			got = s.last
		}
		if got != p.version {
			v.add("%s: topic reaches version %d, database %d", key, got, p.version)
		}
	}
	return v.result("I6", "per-payment order on the topic equals version order, gapless", len(per),
		fmt.Sprintf("%d payments on the state topic: one partition each, versions 1, 2, 3… in partition order up to the database's version", len(per)))
}

func checkI7(o *Oracle, snap *snapshot, complete []bool) InvariantResult {
	var v violations
	checked := 0
	var wantTotal, gotTotal int64
	for i, op := range o.Payments {
		if !complete[i] {
			continue
		}
		checked++
		p, ok := snap.payments[op.PaymentKey]
		if !ok {
			v.add("%s (%s): not in the database", op.PaymentKey, op.Shape)
			continue
		}
		if p.status != op.Expected.Status {
			v.add("%s (%s): status %s, the oracle says %s", op.PaymentKey, op.Shape, p.status, op.Expected.Status)
		}
		want := map[string]int64{}
		for acct, b := range op.Expected.Balances {
			want[acct+"/"+Currency] = b
		}
		got := snap.balances[op.PaymentKey]
		if !maps.Equal(want, got) {
			v.add("%s (%s): ledger %v, the oracle says %v", op.PaymentKey, op.Shape, got, want)
		}
		wantTotal += want["gateway_receivable/"+Currency]
		gotTotal += got["gateway_receivable/"+Currency]
	}
	how := fmt.Sprintf("%d payments: status and ledger balances per account equal the oracle's independent model; gateway receivable in all %d (oracle %d)", checked, gotTotal, wantTotal)
	if n := len(o.Payments) - checked; n > 0 {
		how += fmt.Sprintf("; %d payments left out: a webhook never acknowledged", n)
	}
	return v.result("I7", "money conserved: ledger equals the oracle", checked, how)
}

func checkI8(snap *snapshot) InvariantResult {
	var v violations
	for _, r := range snap.state {
		if r.decodeErr != nil {
			continue
		}
		trs := snap.transitions[r.key]
		i, found := slices.BinarySearchFunc(trs, r.ev.Version, func(tr transitionRow, v int64) int { return cmp.Compare(tr.version, v) })
		if !found {
			v.add("%s: no committed transition for the topic's version %d", r.eventID, r.ev.Version)
			continue
		}
		tr := trs[i]
		if string(r.ev.Status) != tr.to || r.ev.Kind != tr.kind || r.ev.AmountMinor != tr.amount || r.ev.RefundID != tr.refund {
			v.add("%s: topic says %s %s %d, the committed transition %s %s %d", r.eventID, r.ev.Kind, r.ev.Status, r.ev.AmountMinor, tr.kind, tr.to, tr.amount)
		}
	}
	return v.result("I8", "nothing from a rolled-back transaction reaches the topic", len(snap.state),
		fmt.Sprintf("%d read_committed records each match a committed transition (status, kind, amount, refund id) of the database; a read_uncommitted consumer sees %d records of the simulated payments (%d more: aborted or open Kafka transactions, which read_committed consumers never see)",
			len(snap.state), snap.uncommitted, snap.uncommitted-len(snap.state)))
}

func checkI9(o *Oracle, drained bool, why string, took, stallLimit time.Duration) InvariantResult {
	var v violations
	if !drained {
		v.add("backlog not drained after %s: %s", took.Round(time.Millisecond), why)
	}
	how := fmt.Sprintf("backlog drained in %s after delivery", took.Round(time.Millisecond))
	if o.Samples != nil {
		if o.Samples.LongestStall > stallLimit {
			v.add("no progress for %s with a backlog (limit %s)", o.Samples.LongestStall.Round(time.Millisecond), stallLimit)
		}
		how += fmt.Sprintf("; %d samples over %s (%d could not read): offsets advanced %d, longest time with a backlog and no progress %s (limit %s)",
			o.Samples.Polls, o.Samples.Span.Round(time.Millisecond), o.Samples.Failed, o.Samples.Advanced, o.Samples.LongestStall.Round(time.Millisecond), stallLimit)
	} else {
		how += "; no sampler: progress during the run not watched"
	}
	return v.result("I9", "progress during faults, backlog drains after", 1, how)
}

func checkI10(o *Oracle, snap *snapshot) InvariantResult {
	if len(o.Poison) == 0 {
		return InvariantResult{ID: "I10", Name: "poison never blocks a partition", OK: true, Skipped: true,
			Detail: "not exercised: no poison planted (--poison N)"}
	}
	var v violations
	quarantined := map[[2]int64]bool{}
	for _, d := range snap.deliveries {
		if d.status == "quarantined" {
			quarantined[[2]int64{int64(d.partition), d.offset}] = true
		}
	}
	for _, p := range o.Poison {
		if !quarantined[[2]int64{int64(p.Partition), p.Offset}] {
			v.add("poison at %d@%d not quarantined", p.Partition, p.Offset)
		}
		if snap.stored[p.Partition] <= p.Offset {
			v.add("partition %d stuck at %d, poison at %d", p.Partition, snap.stored[p.Partition], p.Offset)
		}
	}
	// Records after the poison on its partition were applied.
	after := 0
	for _, d := range snap.deliveries {
		for _, p := range o.Poison {
			if d.partition == p.Partition && d.offset > p.Offset && d.status != "quarantined" {
				after++
				break
			}
		}
	}
	return v.result("I10", "poison never blocks a partition", len(o.Poison),
		fmt.Sprintf("%d poison records each quarantined, their partitions' stored offsets past them, %d later deliveries of simulated payments decided on those partitions", len(o.Poison), after))
}
