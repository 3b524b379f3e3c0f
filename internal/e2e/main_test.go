package e2e

import (
	"testing"

	"github.com/paystream/paystream/internal/testenv"
)

// binary is the paystream binary built for the tests that run it as a
// subprocess (so they can SIGKILL it).
var binary string

func TestMain(m *testing.M) { testenv.MainWithBinary(m, &binary, "-race") }
