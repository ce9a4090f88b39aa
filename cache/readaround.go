package cache

import (
	"context"
	"fmt"
	"math/bits"
)

// Read-around: a read miss of at least Config.ReadAround bytes, or of a quarter of that
// continuing a sequential stream that has read ReadAround bytes already (streams.go), goes from
// the backend straight into the caller's buffer instead of through the pages (the read side of
// the sequential cutoff, see writearound.go). Filling pages would copy every byte twice (staging
// buffer to page, page to caller) and book every page, which made a large cold read through the
// write-back cache slower than no cache; and what a large read brings in would evict pages more
// likely to be read again. Nothing is installed, so no fill of a page can race with the read.
//
// Correctness rests on one look made after the read was issued and before the backend read:
// which pages of the range are dirty. Every write acknowledged before the read was issued is
// either on the backend or in a page that is dirty at that moment: it was written around
// (acknowledged only after the backend accepted it), or copied into a page that was dirty when
// acknowledged and stays dirty until a write-back carrying its data completed (a page in flight
// keeps its dirty bits until the backend write returned). So the backend read returns every
// acknowledged write except those in the dirty pages, and those pages are pinned before the
// backend read (a pinned page is never evicted, so its data is still there after it, even if it
// has been written back meanwhile) and their valid sectors copied over what the backend returned
// (overlay). A valid sector always holds the newest data the cache knows of the block, so the
// newer data wins, as in a fill (finishFill). A write that lands after the look is concurrent
// with the read, which may return the old or the new data.
//
// The look is cheap when the range holds no dirty page, the common case: dirtyRegions counts the
// dirty pages of every region of the device (regionShift bytes, hashed onto nRegions counters),
// raised when a page becomes dirty (before the write is acknowledged) and lowered when it becomes
// clean (after its write-back returned). A range whose regions all count zero holds no dirty page
// and is read with no lock taken; a count above zero (a dirty page there, or in another region
// that hashes onto the same counter) sends the range through the overlay.

const (
	regionShift = 20 // 1 MiB regions: a 1 MiB read looks at one or two counters
	nRegions    = 4096
	// maxOverlay bounds the pages one overlaid backend read covers (a larger read is cut into
	// pieces), so that the slots it pins fit in an array on the stack.
	maxOverlay = 256
)

func regionOf(off int64) int { return int(uint64(off)>>regionShift) & (nRegions - 1) }

// readsAround reports whether the missing rest of a read of n bytes, which starts at off, goes
// around the pages.
func (c *Cache) readsAround(off int64, n int) bool {
	return c.rstreams.goesAround(off, n, c.cfg.ReadAround)
}

// readAround reads p (non-empty, in range) at off from the backend straight into p, with the
// cache's dirty pages of the range copied over it.
func (c *Cache) readAround(ctx context.Context, p []byte, off int64) error {
	err := c.inPieces(off, int64(len(p)), c.lim.MaxTransfer, func(o, n int64) error {
		q := p[o-off : o-off+n]
		if !c.rangeDirty(o, n) {
			if err := c.be.ReadAt(ctx, q, o); err != nil {
				return fmt.Errorf("cache: read-around [%d, +%d): %w", o, n, err)
			}
			return nil
		}
		return c.inPieces(o, n, maxOverlay*c.ps, func(o2, n2 int64) error {
			return c.readOverlaid(ctx, q[o2-o:o2-o+n2], o2)
		})
	})
	if err != nil {
		return err
	}
	c.st.readAround.Add(uint64(len(p)))
	return nil
}

// rangeDirty reports whether a page of [off, off+length) may be dirty (see dirtyRegions). It
// takes no lock.
func (c *Cache) rangeDirty(off, length int64) bool {
	if c.dirtyPages.Load() == 0 {
		return false
	}
	first, last := uint64(off)>>regionShift, uint64(off+length-1)>>regionShift
	for r, i := first, 0; r <= last && i < nRegions; r, i = r+1, i+1 {
		if c.dirtyRegions[r&(nRegions-1)].Load() != 0 {
			return true
		}
	}
	return false
}

// readOverlaid reads p (at most maxOverlay pages) at off from the backend and copies the valid
// sectors of the range's dirty pages over it (see above).
func (c *Cache) readOverlaid(ctx context.Context, p []byte, off int64) error {
	var store [maxOverlay]pinnedPage
	pinned := c.pinDirty(off, int64(len(p)), store[:0])
	err := c.be.ReadAt(ctx, p, off)
	if err != nil {
		err = fmt.Errorf("cache: read-around [%d, +%d): %w", off, len(p), err)
	}
	for _, pp := range pinned {
		sh := c.shard(pp.page)
		sh.mu.Lock()
		sl := &c.slots[pp.slot]
		if err == nil {
			c.copyValid(p, off, pp.slot, pp.page, sl.valid)
		}
		sl.pins--
		sh.mu.Unlock()
	}
	if len(pinned) > 0 {
		c.st.overlaid.Add(uint64(len(pinned)))
		c.progress.broadcast() // unpinned pages may be evictable now
	}
	return err
}

// pinnedPage is a page readOverlaid holds pinned.
type pinnedPage struct {
	page int64
	slot int32
}

// pinDirty pins the pages of [off, off+length) that are dirty now and returns them (appended to
// pinned). The dirty pages are found under dmu, then pinned under their shard lock (the lock
// order). A page that is no longer cached in between was written back and evicted, so the
// backend read, which starts after this, returns its data; one that was evicted and read in
// again holds valid sectors as current as any, and is pinned as found.
func (c *Cache) pinDirty(off, length int64, pinned []pinnedPage) []pinnedPage {
	first, last := off/c.ps, (off+length-1)/c.ps
	c.dmu.Lock()
	for pg := first; pg <= last; pg++ {
		if _, ok := c.dirtyIdx.get(pg); ok {
			pinned = append(pinned, pinnedPage{page: pg})
		}
	}
	c.dmu.Unlock()
	kept := pinned[:0]
	for _, pp := range pinned {
		sh := c.shard(pp.page)
		sh.mu.Lock()
		if s, ok := sh.m[pp.page]; ok {
			c.slots[s].pins++
			kept = append(kept, pinnedPage{page: pp.page, slot: s})
		}
		sh.mu.Unlock()
	}
	return kept
}

// copyValid copies the valid sectors of slot s (page pg) that lie in [off, off+len(p)) into p,
// a run of consecutive sectors at a time. Called with the page's shard lock held.
func (c *Cache) copyValid(p []byte, off int64, s int32, pg int64, valid uint64) {
	pageOff := pg * c.ps
	lo, hi := max(off, pageOff), min(off+int64(len(p)), pageOff+c.ps)
	if hi <= lo {
		return
	}
	m := valid & c.sectorMask(lo-pageOff, hi-lo)
	for m != 0 {
		a := bits.TrailingZeros64(m)
		b := min(a+bits.TrailingZeros64(^(m>>uint(a))), 64)
		copy(p[pageOff+int64(a)*c.bs-off:pageOff+int64(b)*c.bs-off], c.bufs[s][int64(a)*c.bs:])
		m &^= segMask(a, b)
	}
}
