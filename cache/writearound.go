package cache

import (
	"context"
	"fmt"

	"github.com/iser-blk/iser-blk/block"
)

// Write-around: a write of at least Config.WriteAround bytes, or of a quarter of that continuing
// a sequential stream that has written WriteAround bytes already, goes from the caller's buffer
// straight to the backend instead of through the pages (bcache's sequential cutoff). Caching it would copy every byte twice (into pages, then into a write-back's staging
// buffer) and book every page, which made write-back half as fast as no cache for large
// sequential writes; a request this large gains nothing from coalescing, and what it writes is
// rarely read back soon.
//
// It is a direct operation (see direct.go) with one difference: the dirty pages it overlaps are
// not dropped but overwritten with the new data and stay dirty (supersede). So nothing
// acknowledged ever leaves the cache before the write that replaces it reached the backend: a
// Flush that started before still finds the page dirty and waits for it, and what is written
// back afterwards is the newer data. Clean cached sectors of the range are dropped (a clean page
// left with none, and held by no reader, leaves the index and frees its slot), fills of the
// range in flight do not install (the invalidation bumps invalSeq), write-backs of the range in
// flight finish before the backend write is issued and none starts until it returned, so the
// backend never sees an older write-back land after it. The backend write carries FUA when the
// caller asked for it (or is followed by a backend Flush when the backend has no FUA).

// writesAround reports whether a write of n bytes at off goes around the pages: when it is at
// least Config.WriteAround bytes, or at least a quarter of that and it continues a sequential
// stream that has written WriteAround bytes in a row already (a file copied through the kernel
// arrives in requests of 128 KiB and up). It only reads the streams; noteWrite records the write.
func (c *Cache) writesAround(off int64, n int) bool {
	return c.wstreams.goesAround(off, n, c.cfg.WriteAround)
}

// noteWrite records a write of n bytes at off in the sequential write streams.
func (c *Cache) noteWrite(off int64, n int) {
	if c.cfg.WriteAround > 0 {
		c.wstreams.note(off, off+int64(n), c.cfg.WriteAround/4)
	}
}

// writeAround writes p (non-empty, in range) at off to the backend, keeping the cached pages of
// the range consistent with it (see above).
func (c *Cache) writeAround(ctx context.Context, p []byte, off int64, flags block.WriteFlags) error {
	length := int64(len(p))
	token := c.registerDirect(off, length)
	defer c.endDirect(token)
	if err := c.beginDirect(ctx, off, length, token, supersede, p); err != nil {
		return err
	}
	fua := flags&block.FUA != 0
	var beFlags block.WriteFlags
	if fua && c.lim.CanFUA {
		beFlags = block.FUA
	}
	err := c.inPieces(off, length, c.lim.MaxTransfer, func(o, n int64) error {
		if err := c.be.WriteAt(ctx, p[o-off:o-off+n], o, beFlags); err != nil {
			return fmt.Errorf("cache: write-around [%d, +%d): %w", o, n, err)
		}
		return nil
	})
	if err != nil {
		return err
	}
	c.cleanSuperseded(off, length, token)
	if fua && beFlags == 0 && c.lim.CanFlush {
		if err := c.be.Flush(ctx); err != nil {
			return fmt.Errorf("cache: flush for FUA emulation: %w", err)
		}
	}
	c.st.writeAround.Add(uint64(length))
	return nil
}

// cleanSuperseded runs when the write-around token's backend write of [off, off+length)
// succeeded: the dirty sectors of that range in the pages it superseded, which nothing modified
// since (slot.superseded is still token), hold exactly what the backend now has, as after a
// completed write-back; so they are clean. Before, they stayed dirty and were written again: a
// 1 MiB sequential write over the dirty backlog of a random-write job made the target write most
// of it twice. Pages with dirty sectors outside the range keep those. No write-back of the range
// is in flight (the operation is still registered and waited for those before its write). It
// cleans nothing when another direct operation overlaps the range: that one's backend write may
// land after this one's, and the page must then stay dirty to be written back last.
func (c *Cache) cleanSuperseded(off, length int64, token uint64) {
	if !c.rangeDirty(off, length) || c.otherDirectOverlaps(off, length, token) {
		return
	}
	first, last := off/c.ps, (off+length-1)/c.ps
	for a := first; a <= last; a += maxOverlay { // dmu in bounded stretches
		c.dmu.Lock()
		for pg := a; pg <= min(last, a+maxOverlay-1); pg++ {
			s, ok := c.dirtyIdx.get(pg)
			if !ok {
				continue
			}
			sl := &c.slots[s]
			if sl.superseded != token || sl.inflight {
				continue
			}
			pageOff := pg * c.ps
			lo, hi := max(off, pageOff)-pageOff, min(off+length, pageOff+c.ps)-pageOff
			if sl.dirty &^= c.sectorMask(lo, hi-lo); sl.dirty == 0 {
				c.cleanLocked(s, sl, pg)
				c.st.supersededClean.Add(1)
			}
		}
		c.dmu.Unlock()
	}
	c.progress.broadcast() // a Flush may be waiting for these pages
}

// otherDirectOverlaps reports whether a direct operation other than token is registered over
// [off, off+length).
func (c *Cache) otherDirectOverlaps(off, length int64, token uint64) bool {
	c.directMu.Lock()
	defer c.directMu.Unlock()
	for _, r := range c.direct {
		if r.token != token && r.off < off+length && off < r.end {
			return true
		}
	}
	return false
}
