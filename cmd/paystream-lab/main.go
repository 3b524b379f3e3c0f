// Command paystream-lab holds the tools that exercise a paystream
// deployment from outside: `simulate` plays every gateway's payment
// histories against it and verifies the invariants, `loadgen` sends signed
// webhooks at a target rate. It is a binary of its own so that paystream,
// the product, never links the load generator, the simulator or the fake
// gateway API (internal/lab, internal/provider/gatewaytest). Run
// `paystream-lab --help` for the subcommands.
package main

import "os"

func main() {
	os.Exit(run(os.Args[1:]))
}
