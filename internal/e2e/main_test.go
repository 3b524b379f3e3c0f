package e2e

import (
	"testing"

	"github.com/paystream/paystream/internal/testenv"
)

func TestMain(m *testing.M) { testenv.Main(m) }
