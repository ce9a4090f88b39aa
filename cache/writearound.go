package cache

import (
	"context"
	"fmt"
	"sync/atomic"

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
// back afterwards is the newer data. Clean cached sectors of the range are dropped, fills of the
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
func (c *Cache) noteWrite(off int64, n int) { c.wstreams.note(off, n, c.cfg.WriteAround) }

// streamSet tracks the sequential streams of large requests of one kind (writes or reads) for
// the cutoff: a request of at least cutoff bytes goes around the pages, and one of a quarter of
// it too when it continues a stream that has moved cutoff bytes in a row already.
type streamSet struct {
	s     [16]stream
	clock atomic.Int64 // orders the streams' use
}

// stream is a sequential stream: where its next request is expected, how many bytes it has moved
// in a row, and when it was last used (streamSet.clock). Its fields are read and written without
// a lock: a lost update only routes one request through the pages instead of around them, or the
// reverse, and both are correct.
type stream struct {
	next, run, used atomic.Int64
}

// goesAround reports whether a request of n bytes at off goes around the pages. It only reads the
// streams; note records the request.
func (ss *streamSet) goesAround(off int64, n int, cutoff int64) bool {
	switch {
	case cutoff <= 0 || int64(n) < cutoff/4:
		return false
	case int64(n) >= cutoff:
		return true
	}
	for i := range ss.s {
		if ss.s[i].next.Load() == off {
			return ss.s[i].run.Load() >= cutoff
		}
	}
	return false
}

// note records a request of n bytes at off: it extends the stream it continues, or replaces the
// least recently used one (replacing round-robin would let each new stream evict an active one,
// whose next request would then evict another, and so on: no stream would ever reach the
// cutoff). Requests smaller than a quarter of the cutoff are not tracked: small sequential writes
// stay cached, where they are acknowledged at once and coalesced, and small reads keep the
// cache's read-ahead.
func (ss *streamSet) note(off int64, n int, cutoff int64) {
	if cutoff <= 0 || int64(n) < cutoff/4 {
		return
	}
	now := ss.clock.Add(1)
	victim := &ss.s[0]
	for i := range ss.s {
		st := &ss.s[i]
		if st.next.Load() == off {
			st.run.Add(int64(n))
			st.next.Store(off + int64(n))
			st.used.Store(now)
			return
		}
		if st.used.Load() < victim.used.Load() {
			victim = st
		}
	}
	victim.run.Store(int64(n))
	victim.next.Store(off + int64(n))
	victim.used.Store(now)
}

// writeAround writes p (non-empty, in range) at off to the backend, keeping the cached pages of
// the range consistent with it (see above).
func (c *Cache) writeAround(ctx context.Context, p []byte, off int64, flags block.WriteFlags) error {
	length := int64(len(p))
	defer c.endDirect(off, length)
	if err := c.beginDirect(ctx, off, length, supersede, p); err != nil {
		return err
	}
	fua := flags&block.FUA != 0
	var beFlags block.WriteFlags
	if fua && c.lim.CanFUA {
		beFlags = block.FUA
	}
	for pos := int64(0); pos < length; {
		n := length - pos
		if mt := c.lim.MaxTransfer; mt > 0 && n > mt {
			n = mt / c.bs * c.bs
		}
		if err := c.be.WriteAt(ctx, p[pos:pos+n], off+pos, beFlags); err != nil {
			return fmt.Errorf("cache: write-around [%d, +%d): %w", off+pos, n, err)
		}
		pos += n
	}
	if fua && beFlags == 0 && c.lim.CanFlush {
		if err := c.be.Flush(ctx); err != nil {
			return fmt.Errorf("cache: flush for FUA emulation: %w", err)
		}
	}
	c.st.writeAround.Add(uint64(length))
	return nil
}
