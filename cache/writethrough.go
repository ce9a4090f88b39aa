package cache

import (
	"context"

	"github.com/iser-blk/iser-blk/block"
)

// Write-through without waiting. With --cache-dev the cache runs write-through over the
// persistent log (cache/journal), which takes a write without waiting when it can
// (block.CachedWriter): it is acknowledged once it is in the log. The frontend's reading
// goroutine then completes the write itself — pages updated, then written through to the log —
// instead of handing it to a worker and taking the answer back from it: two wake-ups that were
// most of a commit's latency on a fast local device. Everything that would wait declines, and the
// caller's WriteAt does the write again the ordinary way: a page in flight or blocked by a direct
// operation, no dirty room or free page, a write the log declines (a part of a unit, no room in
// its ring, a batch being written). Pages written before the decline stay dirty and are written
// through by that WriteAt (or any write-back): the same data, so harmless.

// writeCachedThrough is WriteCached in write-through mode over a backend that is a
// block.CachedWriter.
func (c *Cache) writeCachedThrough(p []byte, off int64) bool {
	if c.lim.ReadOnly || len(p) == 0 || c.writesAround(off, len(p)) {
		return false
	}
	if c.enter() != nil {
		return false
	}
	defer c.exit()
	if block.CheckRange(c, off, int64(len(p))) != nil {
		return false
	}
	if ok, _ := c.writeRange(context.Background(), p, off, false); !ok {
		return false
	}
	if !c.tryWriteThrough(off, int64(len(p))) {
		return false
	}
	c.noteWrite(off, len(p))
	return true
}

// tryWriteThrough is syncRange without waiting and without flags: it writes the dirty pages of
// [off, off+length) to the backend's WriteCached, and reports false as soon as something would
// wait or the backend declines (the pages of that job stay dirty).
func (c *Cache) tryWriteThrough(off, length int64) bool {
	first, last := off/c.ps, (off+length-1)/c.ps
	j := c.jobs.Get().(*job)
	defer c.jobs.Put(j)
	pg, sec := first, 0
	for pg <= last {
		c.dmu.Lock()
		s, dirty, busy := c.jobStartLocked(pg, sec)
		if !dirty {
			c.dmu.Unlock()
			pg, sec = pg+1, 0
			continue
		}
		if busy {
			c.dmu.Unlock()
			return false
		}
		c.buildJobLocked(j, s, pg, sec, first, last)
		c.dmu.Unlock()
		if !c.runJobCached(j) {
			return false
		}
		pg, sec = c.after(j)
	}
	return true
}

// runJobCached is runJob through the backend's WriteCached. A declined job ends as if it had
// never started: its pages stay dirty and are no longer in flight.
func (c *Cache) runJobCached(j *job) bool {
	n := j.end - j.off
	var buf []byte
	pooled := false
	if p := c.cfg.IOPool; p != nil && int(n) <= p.MaxClass() {
		if b, ok := p.TryGet(int(n)); ok {
			buf, pooled = b, true
		}
	}
	if buf == nil {
		if cap(j.buf) < int(n) {
			j.buf = make([]byte, n)
		}
		buf = j.buf[:n]
	}
	c.gather(j, buf)
	ok := c.cw.WriteCached(buf, j.off)
	if pooled {
		c.cfg.IOPool.Put(buf)
	}
	if ok {
		c.complete(j, nil, false)
		return true
	}
	c.dmu.Lock()
	for _, jp := range j.pages {
		c.slots[jp.slot].inflight = false
	}
	c.inflightPages -= int64(len(j.pages))
	c.dmu.Unlock()
	c.progress.broadcast()
	return false
}
