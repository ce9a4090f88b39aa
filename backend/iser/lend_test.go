package iser

import "testing"

// TestLendPolicy: writes are sent by reference only on a device with one session, where a
// command failed by a lost connection is re-issued on that session after its reinstatement
// (see the session's lend.go), and not with CopyWrites.
func TestLendPolicy(t *testing.T) {
	for _, tc := range []struct {
		name     string
		sessions int
		opts     Options
		lend     bool
	}{
		{"one session", 1, Options{}, true},
		{"two sessions", 2, Options{}, false},
		{"copy writes", 1, Options{CopyWrites: true}, false},
	} {
		if lend := lendPolicy(tc.sessions, tc.opts); lend != tc.lend {
			t.Errorf("%s: lend %v, want %v", tc.name, lend, tc.lend)
		}
	}
}
