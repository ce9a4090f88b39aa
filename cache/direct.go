package cache

import (
	"context"
	"fmt"

	"github.com/iser-blk/iser-blk/block"
)

// directRange is the byte range of a direct operation in progress; token names the operation
// (registerDirect) in the pages it supersedes (slot.superseded).
type directRange struct {
	off, end int64
	token    uint64
}

// checkModify validates a request that modifies [off, off+length): in range and aligned, and the
// backend writable.
func (c *Cache) checkModify(off, length int64, what string) error {
	if err := block.CheckRange(c, off, length); err != nil {
		return err
	}
	if c.lim.ReadOnly {
		return fmt.Errorf("cache: %s: %w", what, block.ErrReadOnly)
	}
	return nil
}

// Discard drops cached data in the range and discards it on the backend.
func (c *Cache) Discard(ctx context.Context, off, length int64) error {
	if err := c.enter(); err != nil {
		return err
	}
	defer c.exit()
	if err := c.checkModify(off, length, "discard"); err != nil {
		return err
	}
	if !c.lim.CanDiscard {
		return fmt.Errorf("cache: discard: %w", block.ErrNotSupported)
	}
	if length == 0 {
		return nil
	}
	return c.directOp(ctx, off, length, func(ctx context.Context, o, n int64) error {
		return c.be.Discard(ctx, o, n)
	}, c.lim.MaxDiscard)
}

// WriteZeroes makes the range read back as zeroes: on the backend directly when it can, otherwise
// by writing zero pages through the cache.
func (c *Cache) WriteZeroes(ctx context.Context, off, length int64, flags block.ZeroFlags) error {
	if err := c.enter(); err != nil {
		return err
	}
	defer c.exit()
	if err := c.checkModify(off, length, "write zeroes"); err != nil {
		return err
	}
	if length == 0 {
		return nil
	}
	if !c.lim.CanWriteZeroes {
		if flags&block.FastOnly != 0 {
			return fmt.Errorf("cache: fast zero: %w", block.ErrNotSupported)
		}
		return c.writeZeroPages(ctx, off, length, flags&block.ZeroFUA != 0)
	}
	if flags&block.FastOnly != 0 && !c.lim.CanFastZero {
		return fmt.Errorf("cache: fast zero: %w", block.ErrNotSupported)
	}
	return c.directOp(ctx, off, length, func(ctx context.Context, o, n int64) error {
		return c.be.WriteZeroes(ctx, o, n, flags)
	}, c.lim.MaxWriteZeroes)
}

func (c *Cache) writeZeroPages(ctx context.Context, off, length int64, fua bool) error {
	c.zeroOnce.Do(func() { c.zeroBuf = make([]byte, c.cfg.maxJob) })
	var flags block.WriteFlags
	if fua {
		flags = block.FUA
	}
	for length > 0 {
		n := min(length, int64(len(c.zeroBuf)))
		if err := c.WriteAt(ctx, c.zeroBuf[:n], off, flags); err != nil {
			return err
		}
		off += n
		length -= n
	}
	return nil
}

// directOp runs a backend operation that bypasses the cache pages after invalidating them and
// waiting for write-backs of the range already in flight (see the package comment).
func (c *Cache) directOp(ctx context.Context, off, length int64, op func(context.Context, int64, int64) error, maxLen int64) error {
	token := c.registerDirect(off, length)
	defer c.endDirect(token)
	if err := c.beginDirect(ctx, off, length, token, supersede, nil); err != nil {
		return err
	}
	return c.inPieces(off, length, maxLen, func(o, n int64) error {
		if err := op(ctx, o, n); err != nil {
			return fmt.Errorf("cache: [%d, +%d): %w", o, n, err)
		}
		return nil
	})
}

// registerDirect registers [off, off+length) as a direct operation: no write-back of a page in
// it starts and no fill of it installs until endDirect. It returns the operation's token.
func (c *Cache) registerDirect(off, length int64) uint64 {
	c.directMu.Lock()
	c.directSeq++
	token := c.directSeq
	c.direct = append(c.direct, directRange{off, off + length, token})
	c.directActive.Add(1)
	c.directMu.Unlock()
	return token
}

// beginDirect applies act to the cached sectors of the registered direct operation token's
// range (src: the new data for supersede) and waits for the write-backs of the range already in
// flight. endDirect must follow, whatever beginDirect returns.
func (c *Cache) beginDirect(ctx context.Context, off, length int64, token uint64, act rangeAction, src []byte) error {
	// The registration comes first: a write-back built before it is in flight when act looks
	// (it marks its pages under dmu), one built after it sees the range blocked.
	for busy := c.invalidate(off, length, token, act, src); busy; {
		ch := c.progress.wait()
		if busy = c.invalidate(off, length, token, checkInflight, nil); !busy {
			break
		}
		select {
		case <-ch:
		case <-ctx.Done():
			return fmt.Errorf("cache: waiting for write-back of [%d, +%d): %w", off, length, block.ContextError(ctx.Err()))
		case <-c.stop:
			return fmt.Errorf("cache: %w", block.ErrClosed)
		}
	}
	return nil
}

// endDirect unregisters the direct operation token and lets the write-backs it held back go.
func (c *Cache) endDirect(token uint64) {
	c.directMu.Lock()
	var off, length int64
	for i, r := range c.direct {
		if r.token == token {
			off, length = r.off, r.end-r.off
			c.direct = append(c.direct[:i], c.direct[i+1:]...)
			break
		}
	}
	c.directActive.Add(-1)
	c.directMu.Unlock()
	c.progress.broadcast()
	if c.rangeDirty(off, length) {
		c.doKick() // write-backs of the range may start now; with none dirty, no flusher is woken
	}
}

// rangeAction is what invalidate does to the cached sectors of a range.
type rangeAction int

const (
	// checkInflight changes nothing; invalidate only reports write-backs in flight.
	checkInflight rangeAction = iota
	// supersede drops clean sectors and overwrites the dirty ones with the operation's data
	// (zeroes for discard and write-zeroes), which stay dirty. Dropping them instead would let a
	// Flush that started earlier succeed before the operation reached the backend, and a crash
	// then would bring back data older than what that Flush acknowledged. So nothing
	// acknowledged leaves the cache before what replaces it is on the backend, and what is
	// written back afterwards is the newer data (at worst the same bytes twice).
	supersede
)

// invalidate applies act to the cached sectors of [off, off+length) (src holds the range's new
// data for supersede, nil for zeroes) and reports whether a page of the range has a write-back in
// flight.
func (c *Cache) invalidate(off, length int64, token uint64, act rangeAction, src []byte) (inflight bool) {
	first, last := off/c.ps, (off+length-1)/c.ps
	// visit reports whether page pg (slot s) is left clean with no valid sector, unpinned and
	// not being filled: a page that holds nothing and that nobody holds.
	visit := func(pg int64, s int32) (empty bool) {
		pageOff := pg * c.ps
		lo := max(off, pageOff) - pageOff
		hi := min(off+length, pageOff+c.ps) - pageOff
		mask := c.sectorMask(lo, hi-lo)
		sl := &c.slots[s]
		if sl.busy.Load() == 0 {
			// Clean and not in flight, and it stays so while the shard lock is held (a page
			// becomes dirty only under it): no need for dmu, which the flusher and every writer
			// contend for. A write-around over cached pages took it once per page.
			if act != checkInflight {
				sl.valid &^= mask
				sl.invalSeq++
			}
			return sl.valid == 0 && sl.pins == 0 && !sl.filling
		}
		c.dmu.Lock()
		switch {
		case act == checkInflight:
		case sl.dirty != 0:
			if src == nil {
				clear(c.bufs[s][lo:hi])
			} else {
				copy(c.bufs[s][lo:hi], src[pageOff+lo-off:])
			}
			sl.valid |= mask
			sl.dirty |= mask
			sl.gen++ // a write-back in flight must not clean what it did not carry
			sl.invalSeq++
			sl.superseded = token
		default:
			sl.valid &^= mask
			sl.invalSeq++
		}
		if sl.inflight {
			inflight = true
		}
		c.dmu.Unlock()
		return false
	}
	if last-first+1 <= int64(len(c.slots)) {
		for pg := first; pg <= last; {
			// A shard run's pages under one lock: a 1 MiB write-around over cached pages
			// takes 16 locks, not 256. The pages it empties leave the index and their slots
			// go back to the free list (after the shard lock: allocSlot takes allocMu before
			// a shard lock), so that the next pass of a sequential stream over the range
			// finds nothing to look at and a fill finds a free slot without a CLOCK sweep.
			var freed [shardRun]int32
			k := 0
			sh, stop := c.shard(pg), min(last, runLast(pg))
			sh.mu.Lock()
			for ; pg <= stop; pg++ {
				if s, ok := sh.m[pg]; ok && visit(pg, s) {
					delete(sh.m, pg)
					freed[k] = s
					k++
				}
			}
			sh.mu.Unlock()
			if k > 0 {
				c.releaseSlots(freed[:k])
			}
		}
		return inflight
	}
	c.visitCachedIn(first, last, visit)
	return inflight
}

// visitCachedIn calls visit for every cached page in [first, last], for a range with more pages
// than the cache has slots (a discard of the whole device): looking up the cached pages costs
// less than looking up every page of the range. The pages it empties stay in the index, to be
// reused or evicted as any clean page.
func (c *Cache) visitCachedIn(first, last int64, visit func(pg int64, s int32) bool) {
	for i := range c.shards {
		sh := &c.shards[i]
		sh.mu.Lock()
		for pg, s := range sh.m {
			if pg >= first && pg <= last {
				visit(pg, s)
			}
		}
		sh.mu.Unlock()
	}
}

// directOverlaps reports whether a direct operation is in flight over [off, off+n).
func (c *Cache) directOverlaps(off, n int64) bool {
	if c.directActive.Load() == 0 {
		return false
	}
	c.directMu.Lock()
	defer c.directMu.Unlock()
	for _, r := range c.direct {
		if r.off < off+n && off < r.end {
			return true
		}
	}
	return false
}

// blockedLocked reports whether write-back of page pg must wait for a direct operation.
func (c *Cache) blockedLocked(pg int64) bool {
	return c.directOverlaps(pg*c.ps, c.ps)
}
