package cache

// The write-back loop: Workers goroutines pick the oldest dirty page worth writing now, coalesce
// it with its dirty neighbours into one backend write, and complete it under the gen rule (see
// the package comment). syncRange (sync.go) runs the same jobs on the caller's goroutine.

import (
	"context"
	"fmt"
	"math/bits"
	"time"

	"go.uber.org/zap"

	"github.com/iser-blk/iser-blk/block"
)

const (
	minBackoff = 10 * time.Millisecond
	maxBackoff = time.Second
)

// jobPage is one page's part of a write-back: the sectors written and the generation seen.
type jobPage struct {
	slot int32
	page int64
	gen  uint64
	mask uint64
}

// job is one coalesced backend write covering the contiguous bytes [off, end).
type job struct {
	pages   []jobPage
	off     int64
	end     int64
	endPage int64 // page and sector where the forward part of the run stopped
	endSec  int
	seq     uint64 // start order (Cache.jobSeq)
	// background: started only because dirty data passed the low watermark; counted in
	// Cache.bgJobs so that such write-back stays within Config.bgWorkers.
	background bool
	buf        []byte // heap staging buffer, used when no IOPool is configured
}

func (c *Cache) newJob() *job {
	return &job{pages: make([]jobPage, 0, c.cfg.maxJob/c.ps+2)}
}

func segMask(a, b int) uint64 {
	if b-a >= 64 {
		return ^uint64(0)
	}
	return (1<<uint(b-a) - 1) << uint(a)
}

// buildJobLocked builds the write-back that starts with the first dirty segment at or after
// sector minSec of page pg (slot s) and extends it over adjacent dirty pages within [lo, hi],
// up to maxJob bytes, then marks every page of it in flight. Called with dmu held; the seed
// must be dirty there, not in flight and not blocked by a direct operation.
func (c *Cache) buildJobLocked(j *job, s int32, pg int64, minSec int, lo, hi int64) {
	spp := c.cfg.spp
	j.pages = j.pages[:0]
	sl := &c.slots[s]
	m := sl.dirty &^ segMask(0, minSec)
	a := bits.TrailingZeros64(m)
	b := a + bits.TrailingZeros64(^(m >> uint(a)))
	if b > spp {
		b = spp
	}
	j.pages = append(j.pages, jobPage{slot: s, page: pg, gen: sl.gen, mask: segMask(a, b)})
	j.off = pg*c.ps + int64(a)*c.bs
	j.end = pg*c.ps + int64(b)*c.bs
	j.endPage, j.endSec = pg, b
	maxBytes := c.cfg.maxJob
	if b == spp {
		for p := pg + 1; p <= hi; p++ {
			s2, sl2 := c.joinableLocked(p)
			if sl2 == nil {
				break
			}
			cnt := min(bits.TrailingZeros64(^sl2.dirty), spp)
			if cnt == 0 || j.end-j.off+int64(cnt)*c.bs > maxBytes {
				break
			}
			j.pages = append(j.pages, jobPage{slot: s2, page: p, gen: sl2.gen, mask: segMask(0, cnt)})
			j.end += int64(cnt) * c.bs
			j.endPage, j.endSec = p, cnt
			if cnt < spp {
				break
			}
		}
	}
	if a == 0 {
		for p := pg - 1; p >= lo; p-- {
			s2, sl2 := c.joinableLocked(p)
			if sl2 == nil {
				break
			}
			top := sl2.dirty << uint(64-spp)
			cnt := min(bits.LeadingZeros64(^top), spp)
			if cnt == 0 || j.end-j.off+int64(cnt)*c.bs > maxBytes {
				break
			}
			j.pages = append(j.pages, jobPage{slot: s2, page: p, gen: sl2.gen, mask: segMask(spp-cnt, spp)})
			j.off -= int64(cnt) * c.bs
			if cnt < spp {
				break
			}
		}
	}
	for _, jp := range j.pages {
		c.slots[jp.slot].inflight = true
	}
	c.inflightPages += int64(len(j.pages))
	c.jobSeq++
	j.seq = c.jobSeq
}

// joinableLocked returns the slot of page p if a write-back may take it: dirty, not in flight,
// not blocked by a direct operation; otherwise nil. Called with dmu held.
func (c *Cache) joinableLocked(p int64) (int32, *slot) {
	s, ok := c.dirtyIdx.get(p)
	if !ok {
		return -1, nil
	}
	sl := &c.slots[s]
	if sl.inflight || c.blockedLocked(p) {
		return -1, nil
	}
	return s, sl
}

// runJob copies the job's sectors into a staging buffer, writes them to the backend and
// completes the job. bg marks a background write-back, whose failure is reported by Flush.
func (c *Cache) runJob(ctx context.Context, j *job, flags block.WriteFlags, bg bool) error {
	n := j.end - j.off
	var buf []byte
	pooled := false
	if p := c.cfg.IOPool; p != nil && int(n) <= p.MaxClass() {
		b, err := p.Get(ctx, int(n))
		if err != nil {
			c.complete(j, stagingError(ctx, err), bg)
			return err
		}
		buf, pooled = b, true
	} else {
		if cap(j.buf) < int(n) { // grow in powers of two: random write-back needs only a page
			j.buf = make([]byte, min(int64(1)<<bits.Len64(uint64(n-1)), c.cfg.maxJob))
		}
		buf = j.buf[:n]
	}
	c.gather(j, buf)
	err := c.be.WriteAt(ctx, buf, j.off, flags)
	if pooled {
		c.cfg.IOPool.Put(buf)
	}
	if err != nil {
		err = fmt.Errorf("cache: write-back [%d, +%d): %w", j.off, n, err)
	}
	c.complete(j, err, bg)
	return err
}

// gather copies the job's dirty sectors from their pages into buf (j.end-j.off bytes).
func (c *Cache) gather(j *job, buf []byte) {
	for _, jp := range j.pages {
		a := int64(bits.TrailingZeros64(jp.mask))
		cnt := int64(bits.OnesCount64(jp.mask))
		dst := jp.page*c.ps + a*c.bs - j.off
		sh := c.shard(jp.page)
		sh.mu.Lock()
		copy(buf[dst:dst+cnt*c.bs], c.bufs[jp.slot][a*c.bs:])
		sh.mu.Unlock()
	}
}

// complete ends a write-back: pages whose generation did not change lose the dirty sectors that
// were written; on failure everything stays dirty and the flusher backs off.
func (c *Cache) complete(j *job, err error, bg bool) {
	n := j.end - j.off
	c.dmu.Lock()
	for _, jp := range j.pages {
		sl := &c.slots[jp.slot]
		sl.inflight = false
		if err == nil && sl.gen == jp.gen && sl.dirty != 0 {
			sl.dirty &^= jp.mask
			if sl.dirty == 0 {
				c.cleanLocked(jp.slot, sl, jp.page)
			}
		}
		if sl.dirty == 0 {
			sl.busy.Store(0)
		}
	}
	c.inflightPages -= int64(len(j.pages))
	if j.background {
		j.background = false
		c.bgJobs--
	}
	if err != nil {
		c.st.wbErrors.Add(1)
		c.st.lastWBFailure.Store(&wbFailure{err: err.Error(), at: time.Now()})
		if j.seq > c.failSeq {
			c.failSeq = j.seq
			c.lastErr = err
		}
		if bg {
			if c.backoff == 0 {
				c.log.Warn("write-back failed; keeping the data dirty and retrying",
					zap.Int64("off", j.off), zap.Int64("len", n), zap.Error(err))
			}
			c.backoff = min(max(2*c.backoff, minBackoff), maxBackoff)
			c.backoffUntil = time.Now().Add(c.backoff)
		}
	} else {
		c.st.wbBytes.Add(uint64(n))
		if bg && c.backoff != 0 {
			c.log.Info("write-back recovered")
			c.backoff = 0
			c.backoffUntil = time.Time{}
		}
	}
	c.dmu.Unlock()
	c.progress.broadcast()
	c.doKick()
}

// pickJobLocked chooses the next background write-back: the oldest dirty page that is not in
// flight, if there is a reason to write it now. Otherwise it returns how long to sleep (0: until
// kicked). Called with dmu held.
func (c *Cache) pickJobLocked(j *job) (bool, time.Duration) {
	if !c.backoffUntil.IsZero() {
		if d := time.Until(c.backoffUntil); d > 0 {
			return false, d
		}
	}
	eligible := c.dirtyPages.Load() - c.inflightPages
	for s := c.head; s >= 0; s = c.slots[s].next {
		sl := &c.slots[s]
		pg := sl.page
		if sl.inflight || c.blockedLocked(pg) {
			continue
		}
		age := time.Duration(nanotime() - sl.dirtyAt)
		// Urgent: someone waits for it (a Flush, a throttled writer, Close).
		urgent := c.flushTarget >= sl.dirtySeq || c.throttled.Load() > 0 || c.closing
		if !urgent {
			if age < c.cfg.MaxDirtyAge && eligible < c.cfg.lowPages {
				return false, c.cfg.MaxDirtyAge - age
			}
			// Above the low watermark, or past the age limit, but nobody waits: write back
			// with a few workers only, so background write-back does not take the CPU and the
			// target's queue from foreground I/O (on a small host every write-back costs what
			// a foreground write costs; aged random pages cannot be coalesced, and a burst of
			// them written with every worker stalled the next writer for seconds in make
			// bench). Completions kick the workers again.
			if c.bgJobs >= c.cfg.bgWorkers {
				return false, 0
			}
		}
		c.buildJobLocked(j, s, pg, 0, 0, (c.size-1)/c.ps)
		if !urgent {
			j.background = true
			c.bgJobs++
		}
		return true, 0
	}
	return false, 0
}

// worker is one write-back goroutine.
func (c *Cache) worker() {
	defer c.wg.Done()
	j := c.newJob()
	timer := time.NewTimer(time.Hour)
	timer.Stop()
	for {
		select {
		case <-c.stop:
			return
		default:
		}
		c.dmu.Lock()
		ok, wait := c.pickJobLocked(j)
		c.dmu.Unlock()
		if ok {
			c.doKick() // let another worker look for more
			_ = c.runJob(c.bgCtx, j, 0, true)
			continue
		}
		if wait > 0 {
			timer.Reset(wait)
		}
		select {
		case <-c.kick:
		case <-timer.C:
		case <-c.stop:
			timer.Stop()
			return
		}
		timer.Stop()
	}
}
