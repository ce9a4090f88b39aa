package cache

import (
	"context"
	"fmt"

	"github.com/iser-blk/iser-blk/block"
)

// The asynchronous read-around. A read that goes around the pages (readaround.go) over a range
// holding no dirty page is the backend's read and nothing else, so it is started on the backend's
// own Submitter (or PipeSubmitter, when the frontend splices) exactly as with the cache off: no
// hand-off to a worker goroutine, no copy. When a page of the range may be dirty it declines, and
// the frontend's ReadAt reads around with the dirty pages copied over (readOverlaid). The look at
// the dirty regions is made after the read was issued and before the backend read, which is what
// readAround's correctness needs (a write acknowledged before the read is on the backend or in a
// dirty page).
//
// For the same reason ReadCached declines a read of ReadAround bytes or more when the backend has
// a Submitter: copying a large read out of the pages on the frontend's reader goroutine costs more
// CPU than the backend's read into the caller's buffer, holds up the connection's other requests,
// and keeps the pages of a sequential stream hot that read-around keeps out. The copy is not
// the cost of the bookkeeping (readHits takes one lock per run of 16 pages) but of the memory:
// after random I/O the pages of a range sit in slots all over the page memory, and copying 1 MiB
// from 256 scattered 4 KiB pages cost about 3.5 times copying it from consecutive ones
// (BenchmarkReadWarm1MiB, cached-scattered against cached-full: 285 against 80 µs), which on the
// bench host made a warm 1 MiB read served from the pages cost the gateway 1457 CPU-µs against 383
// for the same read with the cache off (issue 18). readHits now overlaps those pages' first loads
// (about a third less); whether that makes serving warm large reads from the pages pay is for the
// bench to show before this decline goes.

// asyncReadAround is a read-around in flight on the backend; pooled (Cache.readArounds).
type asyncReadAround struct {
	c      *Cache
	off, n int64
	done   block.Completion
}

// largeRead reports whether a read of n bytes goes around the pages by its size alone.
func (c *Cache) largeRead(n int) bool {
	return c.cfg.ReadAround > 0 && int64(n) >= c.cfg.ReadAround
}

// admitReadAround admits a read of n bytes at off to the asynchronous read-around: it goes around
// the pages, fits one backend command and its range holds no dirty page. On true the caller is
// inside enter and must start the read or call dropReadAround.
func (c *Cache) admitReadAround(off int64, n int) (*asyncReadAround, bool) {
	if n <= 0 || (c.lim.MaxTransfer > 0 && int64(n) > c.lim.MaxTransfer) || c.enter() != nil {
		return nil, false
	}
	if block.CheckRange(c, off, int64(n)) != nil || !c.readsAround(off, n) || c.rangeDirty(off, int64(n)) {
		c.exit()
		return nil, false
	}
	r := c.readArounds.Get().(*asyncReadAround)
	r.c, r.off, r.n = c, off, int64(n)
	return r, true
}

// dropReadAround undoes admitReadAround when the backend declined the read.
func (c *Cache) dropReadAround(r *asyncReadAround) {
	*r = asyncReadAround{}
	c.readArounds.Put(r)
	c.exit()
}

// submitReadAround starts p at off on the backend's Submitter when it goes around the pages (see
// above), or reports false having started nothing.
func (c *Cache) submitReadAround(ctx context.Context, p []byte, off int64, done block.Completion) bool {
	r, ok := c.admitReadAround(off, len(p))
	if !ok {
		return false
	}
	r.done = done
	if !c.sub.SubmitAt(ctx, p, off, false, 0, r) {
		c.dropReadAround(r)
		return false
	}
	c.rstreams.note(off, off+int64(len(p)), 0)
	return true
}

// SubmitReadToPipe implements block.PipeSubmitter for reads that go around the pages over a range
// holding no dirty page (see above), when the backend can splice; it declines everything else,
// which the frontend then sends through SubmitAt or ReadAt.
func (c *Cache) SubmitReadToPipe(ctx context.Context, pipe block.Pipe, n int, off int64, done block.Completion) bool {
	if c.psub == nil {
		return false
	}
	r, ok := c.admitReadAround(off, n)
	if !ok {
		return false
	}
	r.done = done
	if !c.psub.SubmitReadToPipe(ctx, pipe, n, off, r) {
		c.dropReadAround(r)
		return false
	}
	c.rstreams.note(off, off+int64(n), 0)
	return true
}

var _ block.PipeSubmitter = (*Cache)(nil)

// Complete implements block.Completion: the backend read of a read-around ended.
func (r *asyncReadAround) Complete(err error) {
	c := r.c
	if err != nil {
		err = fmt.Errorf("cache: read-around [%d, +%d): %w", r.off, r.n, err)
	} else {
		c.st.readAround.Add(uint64(r.n))
	}
	done := r.done
	*r = asyncReadAround{}
	c.readArounds.Put(r)
	c.exit()
	done.Complete(err)
}
