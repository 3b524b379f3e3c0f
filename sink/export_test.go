package sink

import "github.com/jackc/pglogrepl"

// SetAfterCommitHook makes r call hook after each Kafka commit, before it
// confirms the slot; an error from hook ends the relay's session there, as
// a crash between the two would.
func SetAfterCommitHook(r *Relay, hook func(lsn uint64) error) {
	r.afterCommit = func(lsn pglogrepl.LSN) error { return hook(uint64(lsn)) }
}
