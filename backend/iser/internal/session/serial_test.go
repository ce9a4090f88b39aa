package session

import "testing"

func TestSerialArithmetic(t *testing.T) {
	tests := []struct {
		a, b   uint32
		lt, gt bool
	}{
		{0, 1, true, false},
		{1, 0, false, true},
		{5, 5, false, false},
		{0xffffffff, 0, true, false}, // wrap: 2^32-1 < 0
		{0, 0xffffffff, false, true},
		{0xfffffff0, 0x10, true, false},
		{0x10, 0xfffffff0, false, true},
		{0, 0x7fffffff, true, false},
		{0x7fffffff, 0, false, true},
		{0, 0x80000000, false, false}, // exactly 2^31 apart: undefined, neither
		{0x80000000, 0, false, false},
		{0x80000000, 0x80000001, true, false},
		{0x7fffffff, 0x80000000, true, false},
	}
	for _, tt := range tests {
		if got := serialLT(tt.a, tt.b); got != tt.lt {
			t.Errorf("serialLT(%#x, %#x) = %v, want %v", tt.a, tt.b, got, tt.lt)
		}
		if got := serialGT(tt.a, tt.b); got != tt.gt {
			t.Errorf("serialGT(%#x, %#x) = %v, want %v", tt.a, tt.b, got, tt.gt)
		}
		if got := serialLE(tt.a, tt.b); got != (tt.lt || tt.a == tt.b) {
			t.Errorf("serialLE(%#x, %#x) = %v", tt.a, tt.b, got)
		}
	}
}

// TestSerialWindowAcrossWrap walks a command window across 2^32 and checks that it stays open
// exactly for CmdSN in [ExpCmdSN, MaxCmdSN].
func TestSerialWindowAcrossWrap(t *testing.T) {
	for _, exp := range []uint32{0xfffffff0, 0xffffffff, 0, 0x7ffffff8} {
		maxSN := exp + 31
		for i := uint32(0); i < 64; i++ {
			sn := exp + i
			open := serialLE(sn, maxSN)
			if open != (i <= 31) {
				t.Fatalf("ExpCmdSN %#x MaxCmdSN %#x: CmdSN %#x open=%v", exp, maxSN, sn, open)
			}
		}
		// A closed window: MaxCmdSN = ExpCmdSN-1.
		if serialLE(exp, exp-1) {
			t.Fatalf("window with MaxCmdSN = ExpCmdSN-1 (%#x) is open", exp-1)
		}
	}
}
