package processor

import (
	"testing"

	"github.com/paystream/paystream/internal/testenv"
)

// TestMain stops the Kafka and Postgres containers testenv starts when no
// PAYSTREAM_TEST_* servers are set (make test-containers).
func TestMain(m *testing.M) { testenv.Main(m) }
