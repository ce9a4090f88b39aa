//go:build vm

package ublk

import (
	"testing"
)

// TestVMControlPayloadSurvivesStackGrowth is the regression test for a GET_FEATURES that answered
// 0 (seen once in CI as "the driver lacks ioctl-encoded commands (features 0x0)"). The driver
// writes a control command's payload by address; when that address was a caller's local variable
// on a goroutine stack, and the stack grew (and moved) between filling the SQE and the driver's
// write, the driver wrote into the old stack and the caller read its zeroed copy. The test calls
// every payload-returning command at each stack depth in a fresh goroutine, so that at some depth
// the stack grows inside the command; every answer must be the driver's.
func TestVMControlPayloadSurvivesStackGrowth(t *testing.T) {
	c, err := OpenControl("")
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	want, err := c.Features()
	if err != nil || want&FeatCmdIoctlEncode == 0 {
		t.Fatalf("features %#x, %v", want, err)
	}
	bad := 0
	for depth := range 600 {
		got := make(chan uint64)
		go func() { got <- atDepth(depth, c.Features) }()
		if f := <-got; f != want {
			bad++
			t.Errorf("depth %d: GET_FEATURES answered %#x, want %#x", depth, f, want)
		}
	}
	t.Logf("GET_FEATURES at 600 stack depths: %d wrong answers", bad)
}

// atDepth calls fn under depth extra stack frames of 64 bytes each.
//
//go:noinline
func atDepth(depth int, fn func() (uint64, error)) uint64 {
	var pad [64]byte
	if depth > 0 {
		return atDepth(depth-1, fn) + uint64(pad[depth%64])
	}
	f, err := fn()
	if err != nil {
		return 0
	}
	return f
}
