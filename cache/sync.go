package cache

import (
	"context"
	"fmt"
	"time"

	"github.com/iser-blk/iser-blk/block"
)

// syncRange writes back every dirty page in [off, off+length) and returns when those write-backs
// completed (with FUA when fua is set, emulated with a backend Flush if need be).
func (c *Cache) syncRange(ctx context.Context, off, length int64, fua bool) error {
	first, last := off/c.ps, (off+length-1)/c.ps
	j := c.jobs.Get().(*job)
	defer c.jobs.Put(j)
	var flags block.WriteFlags
	needFlush := false
	if fua {
		if c.lim.CanFUA {
			flags = block.FUA
		} else {
			needFlush = c.lim.CanFlush
		}
	}
	// Bytes of the range that another write-back (without FUA) carried to the backend are not
	// durable until the backend flushes; count what our own jobs covered.
	rangeEnd := off + length
	covered := int64(0)
	pg, sec := first, 0
	for pg <= last {
		ch := c.progress.wait()
		c.dmu.Lock()
		s, dirty, busy := c.jobStartLocked(pg, sec)
		if !dirty {
			c.dmu.Unlock()
			pg, sec = pg+1, 0
			continue
		}
		if busy {
			c.dmu.Unlock()
			c.doKick()
			select {
			case <-ch:
				continue
			case <-ctx.Done():
				return fmt.Errorf("cache: waiting for write-back: %w", block.ContextError(ctx.Err()))
			case <-c.stop:
				return fmt.Errorf("cache: %w", block.ErrClosed)
			}
		}
		c.buildJobLocked(j, s, pg, sec, first, last)
		c.dmu.Unlock()
		cursor := max(pg*c.ps+int64(sec)*c.bs, off)
		if err := c.runJob(ctx, j, flags, false); err != nil {
			return err
		}
		if lo, hi := max(j.off, cursor), min(j.end, rangeEnd); hi > lo {
			covered += hi - lo
		}
		pg, sec = c.after(j)
	}
	if fua && covered < length && c.lim.CanFlush {
		needFlush = true
	}
	if needFlush {
		if err := c.be.Flush(ctx); err != nil {
			return fmt.Errorf("cache: flush for FUA emulation: %w", err)
		}
	}
	return nil
}

// jobStartLocked looks at page pg from sector sec on (dmu held): dirty when it has dirty sectors
// there, busy when they are in flight or blocked by a direct operation. s is the page's slot.
func (c *Cache) jobStartLocked(pg int64, sec int) (s int32, dirty, busy bool) {
	s, ok := c.dirtyIdx.get(pg)
	if !ok || c.slots[s].dirty>>uint(sec) == 0 {
		return s, false, false
	}
	return s, true, c.slots[s].inflight || c.blockedLocked(pg)
}

// after is where a range's walk goes on after job j: the page and sector its last page ended at.
func (c *Cache) after(j *job) (int64, int) {
	if j.endSec == c.cfg.spp {
		return j.endPage + 1, 0
	}
	return j.endPage, j.endSec
}

// Flush returns once every write acknowledged before it was called is on the backend and the
// backend's own Flush succeeded. See the package comment.
func (c *Cache) Flush(ctx context.Context) error {
	if err := c.enter(); err != nil {
		return err
	}
	defer c.exit()
	err := c.flush(ctx)
	c.st.flushes.Add(1)
	if err != nil {
		c.st.flushErrors.Add(1)
	}
	return err
}

func (c *Cache) flush(ctx context.Context) error {
	c.dmu.Lock()
	snap := c.seq
	startJobs := c.jobSeq
	if snap > c.flushTarget {
		c.flushTarget = snap
	}
	c.backoffUntil = time.Time{} // a Flush retries at once
	clean := c.head < 0 || c.slots[c.head].dirtySeq > snap
	c.dmu.Unlock()
	if !clean { // nothing to write back (write-through, an idle cache): no flusher to wake
		c.doKick()
	}
	for {
		ch := c.progress.wait()
		c.dmu.Lock()
		if c.failSeq > startJobs {
			err := c.lastErr
			c.dmu.Unlock()
			return &writeBackError{cause: err}
		}
		done := c.head < 0 || c.slots[c.head].dirtySeq > snap
		c.dmu.Unlock()
		if done {
			break
		}
		select {
		case <-ch:
		case <-ctx.Done():
			return fmt.Errorf("cache: flush: %w", block.ContextError(ctx.Err()))
		case <-c.stop:
			return fmt.Errorf("cache: flush: %w", block.ErrClosed)
		}
	}
	if c.lim.CanFlush {
		if err := c.be.Flush(ctx); err != nil {
			return fmt.Errorf("cache: backend flush: %w", err)
		}
	}
	return nil
}

// writeBackError reports a failed write-back at Flush. It satisfies block.ErrIO and unwraps to
// the backend's error.
type writeBackError struct{ cause error }

func (e *writeBackError) Error() string {
	return "cache: flush: an earlier write-back failed (the data is still cached and retried): " + e.cause.Error()
}
func (e *writeBackError) Is(target error) bool { return target == block.ErrIO }
func (e *writeBackError) Unwrap() error        { return e.cause }
