package store_test

import (
	"testing"

	"github.com/paystream/paystream/internal/testenv"
)

// TestMain stops the containers testenv started, if any, and fails the
// package when a goroutine outlives the tests (a pool a test left open).
func TestMain(m *testing.M) { testenv.Main(m) }
