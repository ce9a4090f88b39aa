package cache

import (
	"context"
	"fmt"
)

// Read-around: a read miss of at least Config.ReadAround bytes, or of a quarter of that
// continuing a sequential stream that has read ReadAround bytes already, goes from the backend
// straight into the caller's buffer instead of through the pages (the read side of the
// sequential cutoff, see writearound.go). Filling pages would copy every byte twice (staging
// buffer to page, page to caller) and book every page, which made a large cold read through the
// write-back cache slower than no cache; and what a large read brings in would evict pages more
// likely to be read again.
//
// Correctness rests on one check made after the read was issued and before the backend read:
// no page of the range is dirty (or being written back). Every write acknowledged before the read
// was issued is then on the backend: it was either written around (acknowledged only after the
// backend accepted it) or copied into a page that was dirty when acknowledged and has since become
// clean, which happens only when a write-back carrying its data completed (a page written back is
// clean only after the backend write returned; a page in flight stays busy until then). So the
// backend read returns it. A write that lands after the check is concurrent with the read, which
// may return the old or the new data. When a page of the range is dirty or busy, the read goes
// through the pages (readMiss), which merge the cache's dirty sectors into what the backend
// returns. Nothing is installed, so no fill of a page can race with the read.

// readsAround reports whether a read of n bytes at off that missed goes around the pages (its
// missing rest). Only reads that missed are recorded in the streams (by ReadAt): a stream that
// hits needs no decision.
func (c *Cache) readsAround(off int64, n int) bool {
	return c.rstreams.goesAround(off, n, c.cfg.ReadAround)
}

// readAround reads p (non-empty, in range) at off from the backend straight into p when no page
// of the range is dirty or being written back, and through the pages otherwise.
func (c *Cache) readAround(ctx context.Context, p []byte, off int64) error {
	if c.rangeBusy(off, int64(len(p))) {
		return c.readMiss(ctx, p, off)
	}
	length := int64(len(p))
	for pos := int64(0); pos < length; {
		n := length - pos
		if mt := c.lim.MaxTransfer; mt > 0 && n > mt {
			n = mt / c.bs * c.bs
		}
		if err := c.be.ReadAt(ctx, p[pos:pos+n], off+pos); err != nil {
			return fmt.Errorf("cache: read-around [%d, +%d): %w", off+pos, n, err)
		}
		pos += n
	}
	c.st.readAround.Add(uint64(length))
	return nil
}

// rangeBusy reports whether a page of [off, off+length) is dirty or has a write-back in flight.
// With no dirty page in the cache at all (dirtyPages is raised before a write is acknowledged and
// lowered only when its write-back completed) it looks at no page.
func (c *Cache) rangeBusy(off, length int64) bool {
	if c.dirtyPages.Load() == 0 {
		return false
	}
	first, last := off/c.ps, (off+length-1)/c.ps
	if last-first+1 > int64(len(c.slots)) {
		return c.anyBusy(first, last)
	}
	for pg := first; pg <= last; pg++ {
		sh := c.shard(pg)
		sh.mu.Lock()
		s, ok := sh.m[pg]
		busy := ok && c.slots[s].busy.Load() != 0
		sh.mu.Unlock()
		if busy {
			return true
		}
	}
	return false
}

// anyBusy is rangeBusy for a range larger than the cache: it walks the cache's pages instead.
func (c *Cache) anyBusy(first, last int64) bool {
	for i := range c.shards {
		sh := &c.shards[i]
		sh.mu.Lock()
		for pg, s := range sh.m {
			if pg >= first && pg <= last && c.slots[s].busy.Load() != 0 {
				sh.mu.Unlock()
				return true
			}
		}
		sh.mu.Unlock()
	}
	return false
}
