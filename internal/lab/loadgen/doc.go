// Package loadgen sends correctly signed webhooks to ingest at a target
// rate and measures the answers: the engine of `paystream-lab loadgen` and of
// `make bench-ingest`.
//
// A [Builder] makes one source's requests in its driver's payload format,
// signed with the driver package's own Sign helper, so what ingest verifies
// is exactly what a gateway would send. A [Generator] decides which event
// comes next: payments advance in turn (created, paid, then refunds or
// repeated facts) and a fraction of requests re-send an event already
// sent, as gateways' retries do. [Run] drives a Generator with a number of
// workers, rate-limited by golang.org/x/time/rate, recording latencies in
// a [Histogram] and answers by status code.
package loadgen
