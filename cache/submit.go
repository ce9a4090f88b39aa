package cache

import (
	"context"
	"fmt"

	"github.com/iser-blk/iser-blk/block"
)

// The asynchronous read miss (block.Submitter). A frontend serving requests from one goroutine
// (the NBD reader) tries ReadCached, then SubmitAt, and hands the request to a worker goroutine
// only when both decline. Without SubmitAt every cold read through the cache took that hand-off
// (a wake-up of a worker and one back), which the same read with the cache off, started on the
// backend's own Submitter, does not: at queue depth 1 that was the gap between write-back and
// no cache (issue 18). So a miss within one page, the common random read, is started here on the
// backend's Submitter: its page is pinned as placeholder exactly as readMiss does, and the
// backend's completion fills it (finishFill, the same rules: only invalid sectors, and nothing
// installed when a direct operation overlapped or the page was invalidated meanwhile), copies the
// request's part out and reports it (a whole page into a slot used before is read in place:
// startFill). Everything that may wait — a page being filled by another miss, a sequential
// stream (read-ahead), no free staging buffer where one is needed, a larger request — declines
// and takes the synchronous path. Writes always decline: WriteCached is their fast path.

// asyncFill is one read miss in flight on the backend's Submitter; it is the Completion the
// backend calls. Pooled (Cache.fills), so a miss allocates nothing (once the goroutines that
// install fresh pages, see Complete, are there to be reused).
type asyncFill struct {
	c       *Cache
	p       []byte // the caller's buffer
	off     int64  // of p
	pg      int64
	fp      fillPage
	buf     []byte // page pg's data: a staging buffer from Config.IOPool, or p itself (!staged)
	staged  bool
	install bool
	done    block.Completion
}

// SubmitAt implements block.Submitter for reads within one page (a hit completes at once, a miss
// is started on the backend's Submitter, see above), for reads that go around the pages over a
// range without dirty pages (submitReadAround), and for writes that go around the pages
// (submitAround). It declines everything else.
func (c *Cache) SubmitAt(ctx context.Context, p []byte, off int64, write bool, flags block.WriteFlags, done block.Completion) bool {
	if write {
		return c.submitAround(ctx, p, off, flags, done)
	}
	if c.sub == nil || len(p) == 0 {
		return false
	}
	if int64(len(p)) > c.ps {
		return c.submitReadAround(ctx, p, off, done)
	}
	if c.cfg.IOPool == nil {
		return false
	}
	if c.enter() != nil {
		return false
	}
	pg := off / c.ps
	if block.CheckRange(c, off, int64(len(p))) != nil || (off+int64(len(p))-1)/c.ps != pg {
		c.exit()
		return false
	}
	if c.readHits(p, off) == int64(len(p)) {
		c.exit()
		done.Complete(nil)
		return true
	}
	if c.startFill(ctx, p, off, pg, done) {
		return true // c.exit runs at completion: page memory stays mapped until then
	}
	c.exit()
	return false
}

// startFill starts the backend read of page pg for the miss p at off, or reports false having
// started nothing. A miss of the whole page, into a slot whose memory is mapped, is read straight
// into p and installed from there before it is reported (fillInPlace): no staging buffer, and one
// copy of the page instead of two. Any other miss reads into a staging buffer from Config.IOPool,
// which the report copies p out of and the install copies the page in from.
func (c *Cache) startFill(ctx context.Context, p []byte, off, pg int64, done block.Completion) bool {
	if c.beingFilled(pg) {
		return false // ReadAt waits for that fill instead of reading the page twice
	}
	if c.cfg.raPages > 0 && c.rstreams.continues(off) {
		return false // readMiss reads ahead
	}
	n := min(c.ps, c.size-pg*c.ps)
	f := c.fills.Get().(*asyncFill)
	*f = asyncFill{c: c, p: p, off: off, pg: pg, done: done}
	f.fp = c.placeholder(pg, false)
	if off == pg*c.ps && int64(len(p)) == n && !f.fp.fresh {
		f.buf = p // the whole page: read in place (fillInPlace)
	} else if buf, ok := c.cfg.IOPool.TryGet(int(n)); ok {
		f.buf, f.staged = buf[:n], true
	} else {
		c.abortFill(f)
		return false
	}
	f.install = !c.directOverlaps(pg*c.ps, c.ps)
	c.rstreams.note(off, off+int64(len(p)), 0)
	if c.sub.SubmitAt(ctx, f.buf, pg*c.ps, false, 0, f) {
		return true
	}
	if !f.staged { // the backend may take only its own memory (iSER: registered buffers)
		if buf, ok := c.cfg.IOPool.TryGet(int(n)); ok {
			f.buf, f.staged = buf[:n], true
			if c.sub.SubmitAt(ctx, f.buf, pg*c.ps, false, 0, f) {
				return true
			}
		}
	}
	c.abortFill(f)
	return false
}

// abortFill undoes startFill's work for a fill that was not started: the page is unpinned, the
// staging buffer returned, f recycled.
func (c *Cache) abortFill(f *asyncFill) {
	c.finishFill(f.pg, f.fp, nil, false, f.p, f.off, false, false) // unpin
	if f.staged {
		c.cfg.IOPool.Put(f.buf)
	}
	*f = asyncFill{}
	c.fills.Put(f)
	c.progress.broadcast()
}

// Complete implements block.Completion: the backend read of the page ended. A miss read in place
// installs the page and then reports (p is the caller's again after the report). Otherwise the
// caller's data is copied out and reported first, and the page installed after, so that
// installing stays off the request's latency. The page stays pinned and marked filling until it is installed, so readers
// of it wait for the install, and the fill stays inside enter/exit, so the page memory stays
// mapped until then.
//
// A page in a slot never used before is installed on a goroutine of its own, started before the
// report. Installing it is the first write to its memory, a page fault: ~11 µs per 4 KiB page on
// the bench host (a virtual machine whose host backs guest memory lazily), a third of the miss's
// gateway CPU. Installed inline, that fault ran before the session reader could block again, and
// with GOMAXPROCS=1 (small hosts, cmd/iser-blk) the reply writer, which the report wakes, only
// runs then: the fault was on every cold read's latency. The new goroutine is runnable before the
// reply writer is woken, so the scheduler runs the writer first (the goroutine readied last runs
// next); with more Ps it runs beside it. A slot used before is installed inline: its memory is
// mapped, and a 4 KiB copy costs ~0.1 µs, less than starting a goroutine. So a slot pays for a
// goroutine at most once (when an asynchronous miss is its first use), and the cache's memory is
// still faulted in only as it is used.
//
// At most maxFreshInstalls wait at a time: misses arriving faster than pages can be faulted in (a
// tight loop; never a client waiting on a target) would otherwise pile up goroutines, each holding
// a staging buffer, until SubmitAt declines for want of one. Past the bound a fresh page is
// installed inline like any other.
func (f *asyncFill) Complete(err error) {
	c := f.c
	if err != nil {
		err = fmt.Errorf("cache: read miss [%d, +%d): %w", f.pg*c.ps, len(f.buf), err)
	}
	c.st.misses.Add(1)
	install := f.install && err == nil
	done := f.done // f is recycled by finish, which may run on another P before the report
	if !f.staged {
		c.fillInPlace(f.pg, f.fp, f.p, install) // before the report: p is the caller's after it
		done.Complete(err)
		f.finish(false)
		return
	}
	if err == nil {
		c.copyOutFill(f.pg, f.fp, f.buf, f.p, f.off)
	}
	if install && f.fp.fresh {
		if c.freshInstalls.Add(1) <= maxFreshInstalls {
			go f.finishFresh()
			done.Complete(err)
			return
		}
		c.freshInstalls.Add(-1)
	}
	done.Complete(err)
	f.finish(install)
}

// maxFreshInstalls bounds the fresh pages waiting to be installed on goroutines of their own.
const maxFreshInstalls = 64

// finishFresh is finish for a fresh page on a goroutine of its own (Complete).
func (f *asyncFill) finishFresh() {
	c := f.c
	f.finish(true)
	c.freshInstalls.Add(-1)
}

// finish installs the page (if install), releases the staging buffer, wakes the fill's waiters,
// recycles f and ends the fill's enter.
func (f *asyncFill) finish(install bool) {
	c := f.c
	if f.staged {
		c.installFill(f.pg, f.fp, f.buf, install)
		c.cfg.IOPool.Put(f.buf)
	}
	c.progress.broadcast() // waiters for this fill, and the page may now be evictable
	*f = asyncFill{}
	c.fills.Put(f)
	c.exit()
}

// asyncAround is a write-around in flight on the backend's Submitter; pooled (Cache.arounds).
type asyncAround struct {
	c      *Cache
	off, n int64
	token  uint64 // of the direct operation (registerDirect)
	done   block.Completion
}

// submitAround starts a write that goes around the pages (writearound.go) on the backend's
// Submitter, so that a large write is not handed to a worker goroutine either. It is writeAround
// without waiting: the range is registered and the cached pages superseded exactly as there, but
// when a write-back of the range is in flight (which writeAround would wait for), or the backend
// declines, it unregisters and declines; the caller's WriteAt then writes the same data again
// into the superseded pages, which is harmless. A FUA write the backend cannot carry natively
// declines (FUA emulation needs a Flush after the write).
func (c *Cache) submitAround(ctx context.Context, p []byte, off int64, flags block.WriteFlags, done block.Completion) bool {
	if c.sub == nil || c.lim.ReadOnly || len(p) == 0 || (flags&block.FUA != 0 && !c.lim.CanFUA) ||
		!c.writesAround(off, len(p)) {
		return false
	}
	if c.subLim != nil && len(p) > c.subLim.SubmitWriteMax() {
		// The backend would decline it after the range was registered and its pages
		// superseded, and WriteAt would do both again: a 1 MiB write over iSCSI/TCP (which
		// needs R2Ts) paid for two invalidations of 256 pages.
		return false
	}
	if c.enter() != nil {
		return false
	}
	n := int64(len(p))
	if block.CheckRange(c, off, n) != nil || (c.lim.MaxTransfer > 0 && n > c.lim.MaxTransfer) {
		c.exit()
		return false
	}
	token := c.registerDirect(off, n)
	if !c.invalidate(off, n, token, supersede, p) {
		w := c.arounds.Get().(*asyncAround)
		*w = asyncAround{c: c, off: off, n: n, token: token, done: done}
		if c.sub.SubmitAt(ctx, p, off, true, flags&block.FUA, w) {
			c.noteWrite(off, len(p))
			return true
		}
		*w = asyncAround{}
		c.arounds.Put(w)
	}
	c.endDirect(token)
	c.exit()
	return false
}

// Complete implements block.Completion: the backend write of a write-around ended.
func (w *asyncAround) Complete(err error) {
	c := w.c
	if err != nil {
		err = fmt.Errorf("cache: write-around [%d, +%d): %w", w.off, w.n, err)
	} else {
		c.st.writeAround.Add(uint64(w.n))
		c.cleanSuperseded(w.off, w.n, w.token)
	}
	c.endDirect(w.token)
	done := w.done
	*w = asyncAround{}
	c.arounds.Put(w)
	c.exit()
	done.Complete(err)
}

// Kick sends the backend's held-back requests (block.Submitter).
func (c *Cache) Kick() {
	if c.sub != nil {
		c.sub.Kick()
	}
}

var _ block.Submitter = (*Cache)(nil)
