package policy

import (
	"testing"

	"github.com/kvlm/kvlm/internal/shared"
)

// TestMain says how many tests were skipped for want of ../shared.
func TestMain(m *testing.M) { shared.Main(m) }
