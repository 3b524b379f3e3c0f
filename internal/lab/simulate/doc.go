// Package simulate plays every configured gateway against a running
// paystream and checks, afterwards, that the pipeline did what the
// guarantees say: the engine of `paystream-lab simulate` and of the chaos suite.
//
// A [Simulation] generates a realistic payment history for each payment
// (created, authorized, captured, failed, canceled, partially and fully
// refunded, disputed and won or lost), in each driver's own payload format,
// signed as that gateway signs (with the driver package's Sign helper, as
// package loadgen does). [Simulation.Deliver] sends every webhook at least
// once, like a gateway: with duplicates, reordering, delays and bursts, and
// a bounded retry ladder on anything but a 2xx. For the drivers that read
// payments back from the gateway's API it also runs a fake gateway API
// (package gatewaytest) whose answers follow each payment's history.
//
// The [Oracle] records what really happened: each payment's history, the
// final state and ledger balances an independent model expects from it
// (deliberately not package payment's machine, so a bug in the machine is
// caught rather than copied), and every delivery the target acknowledged.
// It can be saved and loaded, so a chaos run can verify after restarting
// things, from another process.
//
// [Simulation.Verify] waits for the backlog to drain, reads the database
// and the state topic, and checks the invariants I1–I10 of docs/design.md,
// one [InvariantResult] each, saying in its Detail how it was checked. An
// optional [Sampler] polls the stored offsets while the simulation runs,
// for the invariants about history over time (I4, I5, I9).
package simulate
