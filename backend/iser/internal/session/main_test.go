package session

import (
	"testing"

	"go.uber.org/goleak"
)

// TestMain fails the package if a test leaves goroutines behind (a reader, a flusher or an
// abort that never ended would show up here).
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }
