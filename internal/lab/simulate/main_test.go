package simulate

import (
	"testing"

	"go.uber.org/goleak"

	"github.com/paystream/paystream/internal/testenv"
)

// TestMain fails the package's tests if any leaves a goroutine running,
// once testenv's containers (if it started any) are stopped.
func TestMain(m *testing.M) { goleak.VerifyTestMain(testenv.Wrap(m)) }
