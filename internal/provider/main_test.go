package provider_test

import (
	"testing"

	"go.uber.org/goleak"
)

// TestMain fails the package when a goroutine outlives the tests (the
// concurrent verification tests start some).
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }
