package sink

import "github.com/jackc/pglogrepl"

// SetAfterCommitHook makes r call hook after each Kafka commit, before it
// confirms the slot; an error from hook ends the relay's session there, as
// a crash between the two would.
func SetAfterCommitHook(r *Relay, hook func(lsn uint64) error) {
	r.afterCommit = func(lsn pglogrepl.LSN) error { return hook(uint64(lsn)) }
}

// SetMidPublishHook makes r call hook after each state record it produces
// in a Kafka transaction, with how many it has produced so far; an error
// from hook ends the relay's session there, the transaction neither
// committed nor aborted, as a crash in the middle of publishing would.
func SetMidPublishHook(r *Relay, hook func(produced int) error) {
	r.midPublish = hook
}
