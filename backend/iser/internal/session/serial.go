package session

// Serial-number arithmetic for 32-bit sequence numbers (RFC 1982 with SERIAL_BITS = 32), which
// RFC 7143 §4.2.2.1 prescribes for CmdSN, ExpCmdSN, MaxCmdSN, StatSN and DataSN. Two numbers
// exactly 2^31 apart are incomparable; these helpers then report "not less", which keeps a
// window closed rather than opening it by mistake.

// serialLT reports a < b.
func serialLT(a, b uint32) bool {
	return a != b && ((a < b && b-a < 1<<31) || (a > b && a-b > 1<<31))
}

// serialGT reports a > b.
func serialGT(a, b uint32) bool { return serialLT(b, a) }

// serialLE reports a <= b.
func serialLE(a, b uint32) bool { return a == b || serialLT(a, b) }
