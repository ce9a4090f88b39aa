package cache

import (
	"context"
	"fmt"
	"math/bits"
	"runtime"

	"github.com/iser-blk/iser-blk/block"
)

// ReadAt serves p from cache pages where they are valid and fills the rest from the backend. A
// read of Config.ReadAround bytes or more, and a large miss continuing a sequential stream, are
// read from the backend straight into p with the dirty pages of the range copied over
// (readaround.go).
func (c *Cache) ReadAt(ctx context.Context, p []byte, off int64) error {
	if err := c.enter(); err != nil {
		return err
	}
	defer c.exit()
	if err := block.CheckRange(c, off, int64(len(p))); err != nil {
		return err
	}
	if c.largeRead(len(p)) {
		// Not even its cached pages are copied out: the backend's read into p costs the gateway
		// less than copying a large read out of pages that random I/O left all over the page
		// memory (submitaround.go), and the two paths of a large read (asynchronous and this)
		// then agree.
		if err := c.readAround(ctx, p, off); err != nil {
			return err
		}
		c.rstreams.note(off, off+int64(len(p)), 0)
		return nil
	}
	pos := int64(0)
	for pos < int64(len(p)) {
		if pos += c.readHits(p[pos:], off+pos); pos == int64(len(p)) {
			break
		}
		// A concurrent miss (typically read-ahead) is already reading this page: wait for it
		// rather than read the same bytes from the backend twice. Looked at once before taking
		// the notifier's channel, which a plain miss then never allocates.
		page := (off + pos) / c.ps
		if !c.beingFilled(page) {
			break
		}
		ch := c.progress.wait()
		if !c.beingFilled(page) {
			break
		}
		select {
		case <-ch:
		case <-ctx.Done():
			return fmt.Errorf("cache: waiting for a fill: %w", block.ContextError(ctx.Err()))
		}
	}
	if pos == int64(len(p)) {
		return nil
	}
	// The stream is looked up where the miss is: after a run of hits on read-ahead pages that
	// is where the stream's last miss stopped filling.
	if c.readsAround(off+pos, len(p)) {
		if err := c.readAround(ctx, p[pos:], off+pos); err != nil {
			return err
		}
		c.rstreams.note(off+pos, off+int64(len(p)), 0)
		return nil
	}
	return c.readMiss(ctx, p[pos:], off+pos)
}

// ReadCached implements block.CachedReader: it copies p from cache pages when every sector of
// it is valid there, without touching the backend or waiting for a fill in progress. It declines
// a read that goes around the pages by its size when the backend can take it asynchronously
// (submitaround.go), and a read of more than a page whose last page is not all there before
// copying anything (where a sequential stream leaves the cached data).
func (c *Cache) ReadCached(p []byte, off int64) bool {
	if c.sub != nil && c.largeRead(len(p)) {
		return false
	}
	if c.enter() != nil {
		return false
	}
	defer c.exit()
	n := int64(len(p))
	if n == 0 || block.CheckRange(c, off, n) != nil {
		return false
	}
	if last := (off + n - 1) / c.ps; last != off/c.ps && !c.pageHolds(last, 0, off+n-last*c.ps) {
		return false
	}
	return c.readHits(p, off) == n
}

var _ block.CachedReader = (*Cache)(nil)

func (c *Cache) beingFilled(page int64) bool {
	sh := c.shard(page)
	sh.mu.Lock()
	s, ok := sh.m[page]
	filling := ok && c.slots[s].filling
	sh.mu.Unlock()
	return filling
}

// pageHolds reports whether page holds valid data for [pOff, pOff+n) of it now.
func (c *Cache) pageHolds(page, pOff, n int64) bool {
	sh := c.shard(page)
	sh.mu.Lock()
	s, ok := sh.m[page]
	need := c.sectorMask(pOff, n)
	ok = ok && c.slots[s].valid&need == need
	sh.mu.Unlock()
	return ok
}

// readHits copies into p the data of [off, off+len(p)) that the pages hold from its start on, as
// far as every sector it needs is valid, and returns how many bytes it copied. The pages of a
// shard run (shard) are looked up under one lock, so that a 1 MiB hit takes 16 locks rather than
// 256, and a hit allocates nothing. The lookups read a byte of every KiB of each page before any
// is copied: after random I/O the pages of a range lie all over the page memory, and those loads,
// independent of each other, bring their first cache lines in together where each copy would
// otherwise wait for its own (BenchmarkReadWarm1MiB cached-scattered: about a third less time).
func (c *Cache) readHits(p []byte, off int64) int64 {
	end := int64(len(p))
	pos := int64(0)
	var slots [shardRun]int32
	for pos < end {
		first := (off + pos) / c.ps
		stop := min(end, (runLast(first)+1)*c.ps-off) // where first's shard run ends, in p
		sh := c.shard(first)
		sh.mu.Lock()
		k, found, touch := 0, pos, byte(0)
		for found < stop {
			page, pOff := (off+found)/c.ps, (off+found)%c.ps
			n := min(c.ps-pOff, end-found)
			s, ok := sh.m[page]
			if !ok {
				break
			}
			if need := c.sectorMask(pOff, n); c.slots[s].valid&need != need {
				break
			}
			for b, i := c.bufs[s][pOff:pOff+n], int64(0); i < n; i += 1024 {
				touch += b[i]
			}
			slots[k] = s
			k++
			found += n
		}
		runtime.KeepAlive(touch) // the loads are the point: not optimised away
		for _, s := range slots[:k] {
			pOff := (off + pos) % c.ps
			pos += int64(copy(p[pos:min(found, pos+c.ps-pOff)], c.bufs[s][pOff:]))
			c.slots[s].ref = true
		}
		sh.hits += uint64(k)
		sh.mu.Unlock()
		if pos < stop {
			break
		}
	}
	return pos
}

type fillPage struct {
	slot     int32 // -1: not cached
	invalSeq uint32
	created  bool // this fill inserted the page (and set its filling flag)
	fresh    bool // into a slot never used before: installing faults its memory in (submit.go)
}

// readMiss reads [off, off+len(p)) (page-aligned, plus read-ahead when sequential) from the
// backend into placeholder pages, merges it with what the cache holds and copies p out.
func (c *Cache) readMiss(ctx context.Context, p []byte, off int64) error {
	// Sequential detection runs on misses only, so hits stay cheap: the stream expects its next
	// miss where this one stops filling, read-ahead included.
	sequential := c.rstreams.continues(off)
	filledEnd := off + int64(len(p))
	defer func() { c.rstreams.note(off, filledEnd, 0) }()
	first := off / c.ps
	last := (off + int64(len(p)) - 1) / c.ps
	reqLast := last
	lastDev := (c.size - 1) / c.ps
	if sequential && c.cfg.raPages > 0 {
		last = min(last+c.cfg.raPages, lastDev)
	}
	maxPages := c.cfg.maxJob / c.ps
	if c.lim.MaxTransfer > 0 {
		maxPages = max(1, c.lim.MaxTransfer/c.ps)
	}
	var small [16]fillPage // a 4 KiB miss (and any up to 64 KiB) needs no heap allocation
	fills := small[:0]
	if n := min(last-first+1, maxPages); n > int64(len(small)) {
		fills = make([]fillPage, 0, n)
	}
	for a := first; a <= last; {
		b := min(last, a+maxPages-1)
		if a > reqLast { // pure read-ahead chunk: stop at a page we already have
			b = c.trimReadAhead(a, b)
			if b < a {
				break
			}
		}
		fills = fills[:0]
		for pg := a; pg <= b; pg++ {
			fills = append(fills, c.placeholder(pg, pg > reqLast))
		}
		// Read-ahead pages found cached by placeholder() were not pinned; trim them off the tail.
		for b > reqLast && len(fills) > 0 && fills[len(fills)-1].slot == -2 {
			fills = fills[:len(fills)-1]
			b--
		}
		if b < a {
			break
		}
		install := !c.directOverlaps(a*c.ps, (b-a+1)*c.ps)
		err := c.fillChunk(ctx, p, off, a, b, reqLast, fills, install)
		if err != nil {
			return err
		}
		if a > reqLast || b >= reqLast {
			filledEnd = max(filledEnd, min((b+1)*c.ps, c.size))
		}
		a = b + 1
	}
	return nil
}

// trimReadAhead returns the last page of [a, b] before the first cached page.
func (c *Cache) trimReadAhead(a, b int64) int64 {
	for pg := a; pg <= b; pg++ {
		sh := c.shard(pg)
		sh.mu.Lock()
		_, ok := sh.m[pg]
		sh.mu.Unlock()
		if ok {
			return pg - 1
		}
	}
	return b
}

// placeholder pins the page (inserting an empty one if absent and a slot can be had). For
// read-ahead pages that are already cached it returns slot -2 (nothing to do).
func (c *Cache) placeholder(pg int64, readAhead bool) fillPage {
	sh := c.shard(pg)
	for {
		sh.mu.Lock()
		if s, ok := sh.m[pg]; ok {
			sl := &c.slots[s]
			if readAhead && sl.valid == c.full {
				sh.mu.Unlock()
				return fillPage{slot: -2}
			}
			sl.pins++
			fp := fillPage{slot: s, invalSeq: sl.invalSeq}
			sh.mu.Unlock()
			return fp
		}
		sh.mu.Unlock()
		s, fresh := c.allocSlot(pg)
		if s < 0 {
			return fillPage{slot: -1}
		}
		if invalSeq, ok := c.insertPage(pg, s, true); ok {
			return fillPage{slot: s, invalSeq: invalSeq, created: true, fresh: fresh}
		}
	}
}

// stagingError names a failure to get a staging buffer from Config.IOPool: the caller's context
// (block.ErrCanceled or ErrTimeout), or else an I/O error.
func stagingError(ctx context.Context, err error) error {
	if ctx.Err() != nil {
		return fmt.Errorf("cache: staging buffer: %w", block.ContextError(err))
	}
	return fmt.Errorf("cache: staging buffer: %w: %w", block.ErrIO, err)
}

// staging returns a buffer of n bytes for a backend read: from Config.IOPool when it has one
// that large (pooled: give it back with c.cfg.IOPool.Put), else from the heap.
func (c *Cache) staging(ctx context.Context, n int) (buf []byte, pooled bool, err error) {
	if c.cfg.IOPool != nil && n <= c.cfg.IOPool.MaxClass() {
		b, err := c.cfg.IOPool.Get(ctx, n)
		if err != nil {
			return nil, false, stagingError(ctx, err)
		}
		return b, true, nil
	}
	return make([]byte, n), false, nil
}

func (c *Cache) fillChunk(ctx context.Context, p []byte, off, a, b, reqLast int64, fills []fillPage, install bool) (err error) {
	n := (b - a + 1) * c.ps
	if end := c.size; a*c.ps+n > end {
		n = end - a*c.ps
	}
	buf, pooled, err := c.staging(ctx, int(n))
	if err == nil {
		if pooled {
			defer c.cfg.IOPool.Put(buf)
		}
		err = c.be.ReadAt(ctx, buf, a*c.ps)
		if err != nil {
			err = fmt.Errorf("cache: read miss [%d, +%d): %w", a*c.ps, n, err)
		}
	}
	for i, fp := range fills {
		pg := a + int64(i)
		pageData := buf
		if err == nil {
			lo := int64(i) * c.ps
			pageData = buf[lo:min(lo+c.ps, n)]
		}
		c.finishFill(pg, fp, pageData, install && err == nil, p, off, pg <= reqLast, err == nil)
	}
	c.st.misses.Add(uint64(min(b, reqLast) - a + 1))
	if b > reqLast {
		c.st.readAhead.Add(uint64((b - reqLast) * c.ps))
	}
	c.progress.broadcast() // unpinned pages may now be evictable
	return err
}

// finishFill copies the requested part of a filled page out (when requested and the backend read
// succeeded), installs the page (if still wanted) and unpins it.
func (c *Cache) finishFill(pg int64, fp fillPage, data []byte, install bool, p []byte, off int64, requested, haveData bool) {
	if requested && haveData {
		c.copyOutFill(pg, fp, data, p, off)
	}
	c.installFill(pg, fp, data, install)
}

// copyOutFill copies the part of p in page pg out of a fill: the page's valid sectors (they are at
// least as new as what the backend returned) over the backend's data. It reads no page memory
// when the page has no valid sector, so a fresh page is not faulted in here (see installFill).
func (c *Cache) copyOutFill(pg int64, fp fillPage, data []byte, p []byte, off int64) {
	sh := c.shard(pg)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	s := c.fillSlotLocked(pg, fp)
	pageOff := pg * c.ps
	lo, hi := max(off, pageOff), min(off+int64(len(p)), pageOff+c.ps)
	var valid uint64
	if s >= 0 {
		valid = c.slots[s].valid
	}
	if need := c.sectorMask(lo-pageOff, hi-lo); valid&need != need {
		copy(p[lo-off:hi-off], data[lo-pageOff:])
	}
	if valid != 0 {
		c.copyValid(p, off, s, pg, valid)
	}
}

// installFill installs the data of a fill into its page's invalid sectors (if install and the page
// was not invalidated meanwhile) and unpins the page. The copy into the page is where a page never
// used before is faulted in, which costs tens of microseconds on a virtual machine whose host
// backs guest memory lazily: an asynchronous miss through a staging buffer reports its data
// before this (submit.go; one read in place installs with fillInPlace, before it reports).
func (c *Cache) installFill(pg int64, fp fillPage, data []byte, install bool) {
	if fp.slot < 0 {
		return
	}
	sh := c.shard(pg)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	c.endFillLocked(fp, data, install)
}

// fillInPlace ends a fill that read page pg straight into the caller's buffer p, which is the
// whole page (submit.go): the page's valid sectors, at least as new as what the backend returned,
// are copied over p, then p's other sectors are installed (if install and the page was not
// invalidated meanwhile) and the page unpinned, all under one shard lock. The caller reports p
// after this, and it is then the caller's again.
func (c *Cache) fillInPlace(pg int64, fp fillPage, p []byte, install bool) {
	sh := c.shard(pg)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	if s := c.fillSlotLocked(pg, fp); s >= 0 && c.slots[s].valid != 0 {
		c.copyValid(p, pg*c.ps, s, pg, c.slots[s].valid)
	}
	if fp.slot >= 0 {
		c.endFillLocked(fp, p, install)
	}
}

// fillSlotLocked (under page pg's shard lock) is the slot whose valid sectors a fill of pg must
// copy over the backend's data: the fill's own (pinned, so still pg's), or, for a fill that had
// none, the slot a write may have cached pg in since; -1 if there is none.
func (c *Cache) fillSlotLocked(pg int64, fp fillPage) int32 {
	if fp.slot >= 0 {
		return fp.slot
	}
	if s, ok := c.shard(pg).m[pg]; ok {
		return s
	}
	return -1
}

// endFillLocked (under the shard lock of the fill's page, fp.slot >= 0) unpins the page, ends its
// filling if this fill created it, and installs data into its invalid sectors if install and the
// page was not invalidated meanwhile.
func (c *Cache) endFillLocked(fp fillPage, data []byte, install bool) {
	sl := &c.slots[fp.slot]
	sl.pins--
	if fp.created {
		sl.filling = false
	}
	sl.ref = true
	if !install || sl.invalSeq != fp.invalSeq {
		return
	}
	c.installLocked(fp.slot, data)
}

// installLocked (under the shard lock of slot s's page) copies the sectors of data that slot s
// does not hold valid into its page and marks them valid.
func (c *Cache) installLocked(s int32, data []byte) {
	sl := &c.slots[s]
	have := c.full // the last page of a device may be cut short
	if int64(len(data)) < c.ps {
		have = c.sectorMask(0, int64(len(data)))
	}
	page := c.bufs[s]
	if sl.valid == 0 {
		copy(page, data)
	} else {
		for m := have &^ sl.valid; m != 0; m &= m - 1 {
			k := int64(bits.TrailingZeros64(m))
			copy(page[k*c.bs:(k+1)*c.bs], data[k*c.bs:])
		}
	}
	sl.valid |= have
}
