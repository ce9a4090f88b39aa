package cache

import "math"

// pieceLen is the largest piece a backend request may have under limit (MaxTransfer,
// MaxDiscard, MaxWriteZeroes; 0 or less: no limit): limit rounded down to the block size, and
// never less than one block, so that a limit below the block size cannot make a loop over the
// pieces stand still (a piece of 0 bytes would be retried forever).
func (c *Cache) pieceLen(limit int64) int64 {
	if limit <= 0 {
		return math.MaxInt64
	}
	return max(limit/c.bs*c.bs, c.bs)
}

// inPieces runs op on the consecutive pieces of [off, off+length) of at most limit bytes (see
// pieceLen), in order, and stops at the first error. op must not keep its closure (so that the
// closure stays on the caller's stack: a piece loop allocates nothing).
func (c *Cache) inPieces(off, length, limit int64, op func(off, n int64) error) error {
	step := c.pieceLen(limit)
	for pos := int64(0); pos < length; {
		n := min(step, length-pos)
		if err := op(off+pos, n); err != nil {
			return err
		}
		pos += n
	}
	return nil
}
