package cache

import (
	"context"
	"fmt"

	"github.com/iser-blk/iser-blk/block"
)

// WriteAt copies p into cache pages and marks them dirty. With FUA (or in write-through mode) the
// pages are written back before it returns. A write of Config.WriteAround bytes or more (or a
// quarter of that continuing a sequential stream) goes around the pages, straight to the backend
// (writearound.go).
func (c *Cache) WriteAt(ctx context.Context, p []byte, off int64, flags block.WriteFlags) error {
	if err := c.enter(); err != nil {
		return err
	}
	defer c.exit()
	if c.lim.ReadOnly {
		return fmt.Errorf("cache: write: %w", block.ErrReadOnly)
	}
	if err := block.CheckRange(c, off, int64(len(p))); err != nil {
		return err
	}
	if len(p) == 0 {
		return nil
	}
	around := c.writesAround(off, len(p))
	c.noteWrite(off, len(p))
	if around {
		return c.writeAround(ctx, p, off, flags)
	}
	if _, err := c.writeRange(ctx, p, off, true); err != nil {
		return err
	}
	if flags&block.FUA != 0 || c.cfg.Mode == WriteThrough {
		return c.syncRange(ctx, off, int64(len(p)), flags&block.FUA != 0)
	}
	return nil
}

// WriteCached implements block.CachedWriter: in write-back mode it copies p into cache pages and
// marks them dirty when that needs no waiting (dirty room and free pages are available), exactly
// as WriteAt without flags would. A later Flush covers it like any acknowledged write. It declines
// writes that go around the pages (Config.WriteAround): they wait for the backend. In
// write-through mode it does the same when the backend, too, takes the write without waiting
// (writethrough.go).
func (c *Cache) WriteCached(p []byte, off int64) bool {
	if c.cfg.Mode == WriteThrough && c.cw != nil {
		return c.writeCachedThrough(p, off)
	}
	if c.cfg.Mode != WriteBack || c.lim.ReadOnly || len(p) == 0 || c.writesAround(off, len(p)) {
		return false
	}
	if c.enter() != nil {
		return false
	}
	defer c.exit()
	if block.CheckRange(c, off, int64(len(p))) != nil {
		return false
	}
	ok, _ := c.writeRange(context.Background(), p, off, false)
	if ok {
		c.noteWrite(off, len(p))
	}
	return ok
}

var _ block.CachedWriter = (*Cache)(nil)

// writeRange copies p (non-empty, in range) into cache pages and marks them dirty. A page that
// goes from clean to dirty needs a dirty reservation (the dirty limit); one already dirty needs
// none, so rewriting dirty data is never throttled. Reservations are taken for the whole request
// at once when they fit (one atomic operation, not one per page), and those not consumed are given
// back at the end; otherwise page by page as clean pages are met, waiting for write-back when wait
// is set. Without wait, writeRange returns false instead of waiting for dirty room or for a free
// slot (pages before that point may then hold their part of p already).
func (c *Cache) writeRange(ctx context.Context, p []byte, off int64, wait bool) (bool, error) {
	first, last := off/c.ps, (off+int64(len(p))-1)/c.ps
	var held int64 // reservations taken and not consumed by a clean→dirty page yet
	if n := last - first + 1; c.tryReserveN(n) {
		held = n
	}
	defer func() {
		if held > 0 {
			c.releaseDirtyN(held)
		}
	}()
	for pos := int64(0); pos < int64(len(p)); {
		page, pOff := (off+pos)/c.ps, (off+pos)%c.ps
		n := min(c.ps-pOff, int64(len(p))-pos)
		ok, err := c.writePage(ctx, page, pOff, p[pos:pos+n], &held, wait)
		if err != nil || !ok {
			return false, err
		}
		pos += n
	}
	return true, nil
}

// writePage copies data into page at pOff and marks it dirty. When the page goes from clean to
// dirty it consumes one of the caller's reservations (*held), or takes one if it can at once, or
// (wait) waits for one. ok is false when it would have to wait and wait is not set.
func (c *Cache) writePage(ctx context.Context, page, pOff int64, data []byte, held *int64, wait bool) (ok bool, err error) {
	mask := c.sectorMask(pOff, int64(len(data)))
	sh := c.shard(page)
	for {
		sh.mu.Lock()
		if s, ok := sh.m[page]; ok {
			sl := &c.slots[s]
			// The dirty state is decided and changed under dmu: a completing write-back
			// (which takes only dmu) may make the page clean at any moment before.
			c.dmu.Lock()
			fromHeld := false
			if sl.dirty == 0 {
				switch {
				case *held > 0:
					fromHeld = true
				case c.tryReserve():
				default:
					c.dmu.Unlock()
					sh.mu.Unlock()
					if !wait {
						return false, nil
					}
					if err := c.reserveDirty(ctx); err != nil {
						return false, err
					}
					*held++
					continue
				}
			}
			copy(c.bufs[s][pOff:], data)
			sl.valid |= mask
			sl.ref = true
			if c.markDirtyLocked(s, sl, page, mask) && fromHeld {
				*held--
			}
			c.dmu.Unlock()
			sh.mu.Unlock()
			return true, nil
		}
		sh.mu.Unlock()
		var s int32
		if wait {
			if s, err = c.allocSlotWait(ctx, page); err != nil {
				return false, err
			}
		} else if s, _ = c.allocSlot(page); s < 0 {
			return false, nil
		}
		c.insertPage(page, s, false)
	}
}

// markDirtyLocked records a modification of slot s. It reports whether the page went from clean
// to dirty (consuming the caller's reservation). Called with the shard lock and dmu held.
func (c *Cache) markDirtyLocked(s int32, sl *slot, page int64, mask uint64) bool {
	sl.gen++
	sl.superseded = 0 // newer than any write-around's data: cleanSuperseded leaves it dirty
	if sl.dirty != 0 {
		sl.dirty |= mask
		return false
	}
	sl.dirty = mask
	c.seq++
	sl.dirtySeq = c.seq
	sl.dirtyAt = nanotime()
	sl.prev, sl.next = c.tail, -1
	if c.tail >= 0 {
		c.slots[c.tail].next = s
	} else {
		c.head = s
	}
	c.tail = s
	c.dirtyIdx.put(page, s)
	c.dirtyPages.Add(1)
	c.dirtyRegions[regionOf(page*c.ps)].Add(1)
	sl.busy.Store(1)
	// Wake a flusher when there is enough to write, or when this is the only dirty page: the
	// flushers may all be idle without an age timer armed.
	if c.head == s || c.dirtyPages.Load()-c.inflightPages >= c.cfg.lowPages {
		c.doKick()
	}
	return true
}

// cleanLocked removes a page that has no dirty sectors left from the dirty structures. Called
// with dmu held.
func (c *Cache) cleanLocked(s int32, sl *slot, page int64) {
	if sl.prev >= 0 {
		c.slots[sl.prev].next = sl.next
	} else {
		c.head = sl.next
	}
	if sl.next >= 0 {
		c.slots[sl.next].prev = sl.prev
	} else {
		c.tail = sl.prev
	}
	sl.prev, sl.next = -1, -1
	c.dirtyIdx.del(page)
	c.dirtyPages.Add(-1)
	c.dirtyRegions[regionOf(page*c.ps)].Add(-1)
	c.reserved.Add(-1)
	if !sl.inflight {
		sl.busy.Store(0)
	}
}

func (c *Cache) tryReserve() bool { return c.tryReserveN(1) }

// tryReserveN takes n dirty-page reservations if all of them fit under the limit.
func (c *Cache) tryReserveN(n int64) bool {
	for {
		r := c.reserved.Load()
		if r+n > c.cfg.limitPages {
			return false
		}
		if c.reserved.CompareAndSwap(r, r+n) {
			return true
		}
	}
}

// releaseDirtyN gives back n reservations that were not consumed.
func (c *Cache) releaseDirtyN(n int64) {
	c.reserved.Add(-n)
	if c.throttled.Load() > 0 {
		c.progress.broadcast()
	}
}

// reserveDirty waits until one more dirty page fits under the limit.
func (c *Cache) reserveDirty(ctx context.Context) error {
	if c.tryReserve() {
		return nil
	}
	c.st.throttledWrites.Add(1)
	c.throttled.Add(1)
	start := nanotime()
	defer func() {
		c.throttled.Add(-1)
		c.st.throttledNanos.Add(nanotime() - start)
	}()
	for {
		ch := c.progress.wait()
		if c.tryReserve() {
			return nil
		}
		c.doKick()
		select {
		case <-ch:
		case <-ctx.Done():
			return fmt.Errorf("cache: waiting for dirty room: %w", block.ContextError(ctx.Err()))
		case <-c.stop:
			return fmt.Errorf("cache: %w", block.ErrClosed)
		}
	}
}
