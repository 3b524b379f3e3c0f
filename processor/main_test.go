package processor

import (
	"testing"

	"go.uber.org/goleak"

	"github.com/paystream/paystream/internal/testenv"
)

// TestMain fails the package when a goroutine outlives its tests (a
// worker, sweeper or loop that a stopped Processor left running), after
// stopping the Kafka and Postgres containers testenv starts when no
// PAYSTREAM_TEST_* servers are set (make test-containers).
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(testenv.Wrap(m))
}
