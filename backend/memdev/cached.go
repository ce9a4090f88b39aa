package memdev

import "context"

// The device's data is all in memory, so it offers the frontends' inline paths
// (block.CachedReader, block.CachedWriter): a ublk queue's ring thread or the NBD reader serves a
// request on the spot instead of handing it to a worker. That makes mem:// the floor of each
// frontend's fastest path in benchmarks (issue 37: what a userspace device costs before any
// backend work). A request ReadAt or WriteAt would refuse (range, read-only, closed) is declined
// here, so the caller's ReadAt or WriteAt reports the error.

// ReadCached implements block.CachedReader: always a hit for a valid range.
func (d *Device) ReadCached(p []byte, off int64) bool {
	return d.ReadAt(context.Background(), p, off) == nil // fails only before touching p
}

// WriteCached implements block.CachedWriter: memory is this device's stable storage, so a
// write stored is as done as WriteAt's.
func (d *Device) WriteCached(p []byte, off int64) bool {
	return d.WriteAt(context.Background(), p, off, 0) == nil // fails only before storing
}
