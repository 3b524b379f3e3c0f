package payment

import "slices"

// Resumed is a waiting (deferred) fact that Resume or Offer decided.
type Resumed struct {
	// Index is the fact's position in the waiting slice.
	Index int
	// Decision is the verdict on it: applied or ignored. Facts still
	// deferred are not reported.
	Decision Decision
}

// Settled is a payment after its waiting facts have had their chance.
type Settled struct {
	// State is the payment after every applied fact.
	State State
	// Resumed are the waiting facts decided, in the order they were
	// decided. Each applied one's Decision.State is the payment right after
	// it; persist them in this order.
	Resumed []Resumed
	// Transitions are all the transitions made, in version order: gapless,
	// starting one above the input state's Version.
	Transitions []Transition
}

// Resume offers a payment's waiting facts again: in OccurredAt order (ties
// kept in slice order, so pass them in arrival order), applying each that
// now applies to the state the previous ones left, pass after pass, until a
// pass applies nothing. Facts that are now ignored are reported too; facts
// still deferred stay waiting. waiting is not modified.
//
// This is the one implementation of "retry the deferred facts after a
// transition": the processor and the property tests share it. It terminates
// (every pass but the last applies a fact) and, Apply being pure and
// deterministic, makes the same decisions for the same input.
func (m Machine) Resume(s State, waiting []Fact) Settled {
	out := Settled{State: s}
	order := make([]int, len(waiting))
	for i := range order {
		order[i] = i
	}
	slices.SortStableFunc(order, func(a, b int) int {
		return waiting[a].OccurredAt.Compare(waiting[b].OccurredAt)
	})
	for progress := true; progress; {
		progress = false
		remaining := order[:0]
		for _, i := range order {
			d := m.Apply(out.State, waiting[i])
			if d.Outcome == OutcomeDeferred {
				remaining = append(remaining, i)
				continue
			}
			out.Resumed = append(out.Resumed, Resumed{Index: i, Decision: d})
			if d.Outcome == OutcomeApplied {
				out.State = d.State
				out.Transitions = append(out.Transitions, d.Transitions...)
				progress = true
			}
		}
		order = remaining
	}
	return out
}

// Offer applies f to s and, if f was applied, resumes the payment's waiting
// facts (see Resume). It returns the verdict on f and the settled payment,
// whose Transitions start with f's. A deferred f is not added to waiting:
// the caller keeps it (the processor leaves its inbox row deferred).
func (m Machine) Offer(s State, f Fact, waiting []Fact) (Decision, Settled) {
	d := m.Apply(s, f)
	if d.Outcome != OutcomeApplied {
		return d, Settled{State: s}
	}
	rest := m.Resume(d.State, waiting)
	rest.Transitions = append(slices.Clip(d.Transitions), rest.Transitions...)
	return d, rest
}

// Replayed is the result of Replay.
type Replayed struct {
	// State is the payment after all the facts.
	State State
	// Transitions are every transition made, in version order.
	Transitions []Transition
	// Decisions is the last verdict on each fact, by position: the facts
	// still waiting at the end are OutcomeDeferred.
	Decisions []Decision
}

// Replay delivers facts, in the order given, to a payment in state s exactly
// as the processor does: each fact is offered (Offer) with the facts deferred
// so far waiting, and a fact deferred joins them. Use it to replay a
// payment's history, and to check that delivery order does not matter.
func (m Machine) Replay(s State, facts []Fact) Replayed {
	out := Replayed{Decisions: make([]Decision, len(facts))}
	var waiting []Fact
	var from []int // from[j] is waiting[j]'s position in facts
	for i, f := range facts {
		d, settled := m.Offer(s, f, waiting)
		out.Decisions[i] = d
		s = settled.State
		out.Transitions = append(out.Transitions, settled.Transitions...)
		if len(settled.Resumed) > 0 {
			done := make([]bool, len(waiting))
			for _, r := range settled.Resumed {
				out.Decisions[from[r.Index]] = r.Decision
				done[r.Index] = true
			}
			k := 0
			for j := range waiting {
				if !done[j] {
					waiting[k], from[k] = waiting[j], from[j]
					k++
				}
			}
			waiting, from = waiting[:k], from[:k]
		}
		if d.Outcome == OutcomeDeferred {
			waiting = append(waiting, f)
			from = append(from, i)
		}
	}
	out.State = s
	return out
}
