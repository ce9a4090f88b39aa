package journal

import (
	"cmp"
	"context"
	"fmt"
	"slices"

	"github.com/iser-blk/iser-blk/block"
)

// WriteAt logs p and returns once it is in the log (durable at the next Flush, at once with
// FUA). The whole units of a write of Options.WriteAround bytes or more go to the target instead
// (writeAround); parts of units are merged with the unit's current contents (append.go).
func (j *Journal) WriteAt(ctx context.Context, p []byte, off int64, flags block.WriteFlags) error {
	if err := j.enter(); err != nil {
		return err
	}
	defer j.exit()
	if err := block.CheckRange(j, off, int64(len(p))); err != nil {
		return err
	}
	if len(p) == 0 {
		return nil
	}
	err := j.edges(off, int64(len(p)), func(o, n int64) error {
		return j.appendPart(ctx, o, p[o-off:o-off+n])
	}, func(o, n int64) error {
		return j.writeUnits(ctx, p[o-off:o-off+n], o, flags)
	})
	if err != nil {
		return err
	}
	if flags&block.FUA != 0 {
		return j.flush(ctx)
	}
	return nil
}

// WriteCached implements block.CachedWriter: it logs p as WriteAt without flags would, when that
// needs no waiting: p is whole units below Options.WriteAround and one batch long, no batch is
// being written, and the ring has room now. It declines (false, nothing logged) otherwise; the
// caller's WriteAt then logs p. The RAM cache above calls it from its own WriteCached in
// write-through mode, so that a write is logged on the frontend's reading goroutine instead of
// being handed to a worker and back (two wake-ups: most of a commit's latency on a fast local
// device).
func (j *Journal) WriteCached(p []byte, off int64) bool {
	n := int64(len(p))
	if n == 0 || off%j.u != 0 || n%j.u != 0 || n > maxBatchData ||
		(j.opt.WriteAround > 0 && n >= j.opt.WriteAround) {
		return false
	}
	if j.enter() != nil {
		return false
	}
	defer j.exit()
	if block.CheckRange(j, off, n) != nil || !j.tryAppend(uint64(off/j.u), uint32(n/j.u), p) {
		return false
	}
	j.st.logged.Add(uint64(n))
	return true
}

var _ block.CachedWriter = (*Journal)(nil)

// edges cuts [off, off+n) at unit boundaries: part runs for the bytes of a unit the range covers
// only in part (at most one at each end), whole for the whole units between them.
func (j *Journal) edges(off, n int64, part, whole func(o, n int64) error) error {
	end := off + n
	lo := min((off+j.u-1)/j.u*j.u, end)
	hi := max(end/j.u*j.u, lo)
	if lo > off {
		if err := part(off, lo-off); err != nil {
			return err
		}
	}
	if hi > lo {
		if err := whole(lo, hi-lo); err != nil {
			return err
		}
	}
	if end > hi {
		return part(hi, end-hi)
	}
	return nil
}

// writeUnits writes whole units: around the log from Options.WriteAround bytes on, else into it
// in appends of at most maxBatchData.
func (j *Journal) writeUnits(ctx context.Context, p []byte, off int64, flags block.WriteFlags) error {
	if j.opt.WriteAround > 0 && int64(len(p)) >= j.opt.WriteAround {
		return j.writeAround(ctx, p, off, flags)
	}
	for len(p) > 0 {
		c := min(len(p), maxBatchData)
		if err := j.append(uint64(off/j.u), uint32(int64(c)/j.u), p[:c]); err != nil {
			return err
		}
		j.st.logged.Add(uint64(c))
		p, off = p[c:], off+int64(c)
	}
	return nil
}

// appendPart logs the bytes p at off, within one unit, merged with the unit's contents. The unit
// is claimed for the merge (claims.go).
func (j *Journal) appendPart(ctx context.Context, off int64, p []byte) error {
	lba := uint64(off / j.u)
	c, err := j.claim(ctx, lba, lba+1, claimMerge)
	if err != nil {
		return err
	}
	defer j.release(c)
	if err := j.appendMerge(lba, int(off%j.u), p); err != nil {
		return err
	}
	j.st.logged.Add(uint64(len(p)))
	return nil
}

// writeAround sends whole units to the target, after making sure that no older copy of their
// range in the log is served or written back over them, now or after a crash.
func (j *Journal) writeAround(ctx context.Context, p []byte, off int64, flags block.WriteFlags) error {
	lba, n := uint64(off/j.u), uint64(int64(len(p))/j.u)
	c, err := j.claim(ctx, lba, lba+n, claimDirect)
	if err != nil {
		return err
	}
	defer j.release(c)
	if err := j.invalidate(ctx, lba, n); err != nil {
		return err
	}
	j.directs.Add(1)
	j.st.around.Add(uint64(len(p)))
	if err := j.be.WriteAt(ctx, p, off, flags&^block.FUA|j.beFUA(flags)); err != nil {
		return err
	}
	if flags&block.FUA != 0 && !j.beLim.CanFUA && j.beLim.CanFlush {
		return j.be.Flush(ctx)
	}
	return nil
}

func (j *Journal) beFUA(flags block.WriteFlags) block.WriteFlags {
	if j.beLim.CanFUA {
		return flags & block.FUA
	}
	return 0
}

// invalidate prepares [lba, lba+n) for an operation that goes to the target around the log. When
// the log holds data of the range, that data is first written back to the target and the target
// flushed, then an invalidation entry is logged (so that recovery never replays that older data
// over the operation) and the index drops it (so that reads go to the target). Then it waits for
// write-backs of the range in flight, which carry older data.
//
// The write-back comes first because the invalidation can become durable on the cache device (at
// any sync: a Flush, a checkpoint) before the operation is durable on the target: after a power
// cut of both, the log no longer has the range's data and the target must have it.
func (j *Journal) invalidate(ctx context.Context, lba, n uint64) error {
	j.mu.Lock()
	has := j.holdsAny(lba, n)
	j.mu.Unlock()
	if has {
		if err := j.writeBackRange(ctx, lba, n); err != nil {
			return err
		}
	}
	for i := uint64(0); has && i < n; {
		c := min(n-i, 1<<31)
		if err := j.append(lba+i, uint32(c), nil); err != nil {
			return err
		}
		i += c
	}
	j.mu.Lock()
	defer j.mu.Unlock()
	for j.cleaningOverlaps(lba, lba+n) {
		ch := j.changed.wait()
		j.mu.Unlock()
		select {
		case <-ch:
		case <-ctx.Done():
			j.mu.Lock()
			return fmt.Errorf("journal: waiting for write-back: %w", block.ContextError(ctx.Err()))
		}
		j.mu.Lock()
	}
	return nil
}

// writeBackRange writes the log's data of [lba, lba+n) to the target and flushes the target. It
// excludes cleaning rounds, so that no unit it reads is reclaimed meanwhile and no round writes
// the same blocks at the same time.
func (j *Journal) writeBackRange(ctx context.Context, lba, n uint64) error {
	j.cleanMu.Lock()
	defer j.cleanMu.Unlock()
	var refs []blockRef
	j.mu.Lock()
	j.idx.each(lba, n, func(b, u uint64) bool {
		refs = append(refs, blockRef{b, u})
		return true
	})
	slices.SortFunc(refs, func(a, b blockRef) int { return cmp.Compare(a.lba, b.lba) })
	j.mu.Unlock()
	if len(refs) == 0 {
		return nil
	}
	if _, err := j.writeBack(ctx, refs); err != nil {
		return err
	}
	if j.beLim.CanFlush {
		if err := j.be.Flush(ctx); err != nil {
			return fmt.Errorf("journal: flushing the target after write-back: %w", err)
		}
	}
	return nil
}

// holdsAny reports whether the index maps a block of [lba, lba+n). mu is held.
func (j *Journal) holdsAny(lba, n uint64) bool {
	found := false
	j.idx.each(lba, n, func(_, _ uint64) bool {
		found = true
		return false
	})
	return found
}

func (j *Journal) cleaningOverlaps(lo, hi uint64) bool {
	for _, r := range j.cleaning {
		if r.overlaps(lo, hi) {
			return true
		}
	}
	return false
}

// Discard passes the discard to the target (invalidate).
func (j *Journal) Discard(ctx context.Context, off, length int64) error {
	if !j.beLim.CanDiscard {
		return fmt.Errorf("journal: discard: %w", block.ErrNotSupported)
	}
	return j.direct(ctx, off, length, func(o, n int64) error { return j.be.Discard(ctx, o, n) })
}

// WriteZeroes passes the request to the target (invalidate).
func (j *Journal) WriteZeroes(ctx context.Context, off, length int64, flags block.ZeroFlags) error {
	if !j.beLim.CanWriteZeroes || (flags&block.FastOnly != 0 && !j.beLim.CanFastZero) {
		return fmt.Errorf("journal: write zeroes: %w", block.ErrNotSupported)
	}
	return j.direct(ctx, off, length, func(o, n int64) error { return j.be.WriteZeroes(ctx, o, n, flags) })
}

// direct runs op on the whole units of [off, off+length) after invalidating them; the parts of
// units at its ends are written with zeroes through the log instead (a discard that advertises
// zeroes, and a write-zeroes, read back as zeroes; the log's newer data of the rest of such a
// unit must stay).
func (j *Journal) direct(ctx context.Context, off, length int64, op func(o, n int64) error) error {
	if err := j.enter(); err != nil {
		return err
	}
	defer j.exit()
	if err := block.CheckRange(j, off, length); err != nil {
		return err
	}
	if length == 0 {
		return nil
	}
	return j.edges(off, length, func(o, n int64) error {
		return j.appendPart(ctx, o, j.zeroes[:n])
	}, func(o, n int64) error {
		lba, units := uint64(o/j.u), uint64(n/j.u)
		c, err := j.claim(ctx, lba, lba+units, claimDirect)
		if err != nil {
			return err
		}
		defer j.release(c)
		if err := j.invalidate(ctx, lba, units); err != nil {
			return err
		}
		j.directs.Add(1)
		return op(o, n)
	})
}

// ReadAt reads p: what the log holds from the cache device, the rest from the target.
func (j *Journal) ReadAt(ctx context.Context, p []byte, off int64) error {
	if err := j.enter(); err != nil {
		return err
	}
	defer j.exit()
	if err := block.CheckRange(j, off, int64(len(p))); err != nil {
		return err
	}
	var segs [16]segment
	plan := segs[:0]
	j.rmu.RLock()
	j.mu.Lock()
	plan = j.planRead(plan, off, int64(len(p)))
	j.mu.Unlock()
	var err error
	for _, s := range plan {
		if s.inLog {
			if _, err = j.m.ReadAt(p[s.at:s.at+s.n], s.logOff); err != nil {
				break
			}
		}
	}
	j.rmu.RUnlock()
	if err != nil {
		return &ioError{fmt.Errorf("journal: reading the cache device: %w", err)}
	}
	for _, s := range plan {
		if !s.inLog {
			if err := j.be.ReadAt(ctx, p[s.at:s.at+s.n], off+s.at); err != nil {
				return err
			}
		}
	}
	return nil
}

// segment is a run of a read's bytes p[at:at+n]: from the cache device at logOff when inLog,
// else from the target.
type segment struct {
	at, n  int64
	logOff int64
	inLog  bool
}

// planRead cuts the read of n bytes at off into runs from the log and from the target. mu is
// held.
func (j *Journal) planRead(plan []segment, off, n int64) []segment {
	if j.idx.live == 0 {
		return append(plan, segment{n: n})
	}
	for pos, end := off, off+n; pos < end; {
		within := pos % j.u
		take := min(j.u-within, end-pos)
		ru, ok := j.idx.get(uint64(pos / j.u))
		lo := int64(0)
		if ok {
			lo = j.unitOff(ru) + within
		}
		if k := len(plan) - 1; k >= 0 && plan[k].inLog == ok && (!ok || plan[k].logOff+plan[k].n == lo) {
			plan[k].n += take
		} else {
			plan = append(plan, segment{at: pos - off, n: take, logOff: lo, inLog: ok})
		}
		pos += take
	}
	return plan
}

// Flush makes every write acknowledged before it durable: the log on the cache device
// (fdatasync), and the target when operations went to it around the log since its last flush.
// Concurrent flushes share one fdatasync.
func (j *Journal) Flush(ctx context.Context) error {
	if err := j.enter(); err != nil {
		return err
	}
	defer j.exit()
	return j.flush(ctx)
}

func (j *Journal) flush(ctx context.Context) error {
	if err := j.failure(); err != nil {
		return &ioError{err}
	}
	batches, directs := j.appended.Load(), j.directs.Load()
	j.syncMu.Lock()
	defer j.syncMu.Unlock()
	j.st.flushes.Add(1)
	if j.synced < batches {
		done := j.appended.Load()
		if err := j.m.Sync(); err != nil {
			return j.fail(err)
		}
		j.synced = done
		j.st.syncs.Add(1)
	}
	if j.dflushed < directs && j.beLim.CanFlush {
		done := j.directs.Load()
		if err := j.be.Flush(ctx); err != nil {
			return fmt.Errorf("journal: flushing the target: %w", err)
		}
		j.dflushed = done
	}
	return nil
}
