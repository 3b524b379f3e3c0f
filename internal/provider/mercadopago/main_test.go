package mercadopago

import (
	"testing"

	"go.uber.org/goleak"
)

// TestMain fails the package's tests if any leaves a goroutine running:
// the refetch tests start fake gateway APIs.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }
