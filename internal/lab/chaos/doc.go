// Package chaos breaks a running paystream on purpose and checks what the
// guarantees promise still holds: the engine of `make chaos` (bench/chaos)
// and of the short chaos test in `make test`.
//
// Each [Scenario] gets a pipeline of its own: a fresh schema and topics
// made by `paystream migrate`, and `paystream ingest`, `processor` and
// `sink` as child processes of the harness. The simulation (package
// simulate) delivers at least the configured number of signed webhooks to
// ingest, retrying anything but a 2xx as a gateway does, while the
// scenario's faults are injected once delivery reaches given fractions:
// SIGTERM or SIGKILL of a process (then restarted at once), a processor
// added to or removed from the group, a toxic on a proxied connection
// (toxiproxy embedded as a library: resets, black holes, latency), or a
// server killed, restarted or stopped for a while. After each fault the
// harness times the recovery: from the repair until everything the raw
// topic held at that moment has been processed and its state events
// published. Once every delivery is acknowledged and the backlog drained,
// the simulation verifies the invariants of docs/design.md and the
// scenario's [Result] is one row of the table in docs/reliability.md.
//
// Scenarios that only break paystream's own processes and connections run
// on the shared stack, each in its own schema, topics and group. Those
// that stop or kill Postgres or Kafka run on a [PrivateStack]
// (deploy/stack.sh with its own directory and ports): the shared stack is
// never stopped.
package chaos
