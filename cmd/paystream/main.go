// Command paystream turns payment-gateway webhooks into exactly-once payment
// effects. Run `paystream --help` for the subcommands.
package main

import "os"

func main() {
	os.Exit(run(os.Args[1:]))
}
