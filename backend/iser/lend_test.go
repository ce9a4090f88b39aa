package iser

import (
	"math"
	"testing"
	"time"
)

// TestLendPolicy: writes are sent by reference only where a lent write's wait for the
// reinstatement delays nothing: one session, a replacement timeout that is not 0, and no
// --copy-writes; the wait is bounded by the replacement timeout.
func TestLendPolicy(t *testing.T) {
	rt := func(d time.Duration) *Recovery { r := DefaultRecovery(); r.ReplacementTimeout = d; return &r }
	for _, tc := range []struct {
		name     string
		sessions int
		opts     Options
		lend     bool
		hold     time.Duration
	}{
		{"defaults", 1, Options{}, true, 120 * time.Second},
		{"replacement timeout", 1, Options{Recovery: rt(30 * time.Second)}, true, 30 * time.Second},
		{"waits forever", 1, Options{Recovery: rt(-1)}, true, math.MaxInt64},
		{"fails at once", 1, Options{Recovery: rt(0)}, false, 0},
		{"two sessions", 2, Options{}, false, 0},
		{"copy writes", 1, Options{CopyWrites: true}, false, 0},
	} {
		lend, hold := lendPolicy(tc.sessions, tc.opts)
		if lend != tc.lend || hold != tc.hold {
			t.Errorf("%s: lend %v hold %v, want %v %v", tc.name, lend, hold, tc.lend, tc.hold)
		}
	}
}
