package testenv

import (
	"math/rand/v2"
	"testing"
)

// Seed returns the seed of a randomized test: flagged, or a random one
// when flagged is 0. It logs the seed with the command that reruns the
// test with it (go test ./pkg -run Name -flagName=seed), so a failure seen
// once can be replayed.
func Seed(t testing.TB, flagged uint64, pkg, flagName string) uint64 {
	t.Helper()
	seed := flagged
	if seed == 0 {
		seed = rand.Uint64()
	}
	t.Logf("seed %d (rerun: go test %s -run %s -%s=%d)", seed, pkg, t.Name(), flagName, seed)
	return seed
}
