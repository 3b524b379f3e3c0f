package reconcile

import (
	"testing"

	"go.uber.org/goleak"

	"github.com/paystream/paystream/internal/testenv"
)

// TestMain runs the tests, stops the containers testenv started, if any,
// and fails the package when a goroutine outlives the tests (a pool or a
// client a test left open).
func TestMain(m *testing.M) { goleak.VerifyTestMain(testenv.Wrap(m)) }
