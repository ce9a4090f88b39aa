package journal

import (
	"cmp"
	"context"
	"fmt"
	"slices"

	"github.com/iser-blk/iser-blk/block"
)

// WriteAt logs p and returns once it is in the log (durable at the next Flush, at once with
// FUA). A write of Options.WriteAround bytes or more goes to the target instead (invalidate).
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
	if (j.opt.WriteAround > 0 && int64(len(p)) >= j.opt.WriteAround) || len(p) > maxBatchData {
		return j.writeAround(ctx, p, off, flags)
	}
	if err := j.append(uint64(off/j.bs), uint32(int64(len(p))/j.bs), p); err != nil {
		return err
	}
	j.st.logged.Add(uint64(len(p)))
	if flags&block.FUA != 0 {
		return j.flush(ctx)
	}
	return nil
}

// writeAround sends a large write to the target, after making sure that no older copy of its
// range in the log is served or written back over it, now or after a crash.
func (j *Journal) writeAround(ctx context.Context, p []byte, off int64, flags block.WriteFlags) error {
	lba, n := uint64(off/j.bs), uint64(int64(len(p))/j.bs)
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
	if n <= j.n {
		for i := range n {
			if u, ok := j.idx.get(lba + i); ok {
				refs = append(refs, blockRef{lba + i, u})
			}
		}
	} else {
		for u := range j.idx.rev {
			if b, ok := j.idx.liveAt(uint64(u)); ok && b >= lba && b-lba < n {
				refs = append(refs, blockRef{b, uint64(u)})
			}
		}
		slices.SortFunc(refs, func(a, b blockRef) int { return cmp.Compare(a.lba, b.lba) })
	}
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
	if j.idx.live == 0 {
		return false
	}
	if n <= j.n {
		for i := range n {
			if _, ok := j.idx.get(lba + i); ok {
				return true
			}
		}
		return false
	}
	for _, b := range j.idx.rev {
		if b != noLBA && b >= lba && b-lba < n {
			return true
		}
	}
	return false
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
	return j.direct(ctx, off, length, func() error { return j.be.Discard(ctx, off, length) })
}

// WriteZeroes passes the request to the target (invalidate).
func (j *Journal) WriteZeroes(ctx context.Context, off, length int64, flags block.ZeroFlags) error {
	if !j.beLim.CanWriteZeroes || (flags&block.FastOnly != 0 && !j.beLim.CanFastZero) {
		return fmt.Errorf("journal: write zeroes: %w", block.ErrNotSupported)
	}
	return j.direct(ctx, off, length, func() error { return j.be.WriteZeroes(ctx, off, length, flags) })
}

func (j *Journal) direct(ctx context.Context, off, length int64, op func() error) error {
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
	if err := j.invalidate(ctx, uint64(off/j.bs), uint64(length/j.bs)); err != nil {
		return err
	}
	j.directs.Add(1)
	return op()
}

// ReadAt reads p: the blocks the log holds from the cache device, the others from the target.
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
	plan = j.planRead(plan, uint64(off/j.bs), uint64(int64(len(p))/j.bs))
	j.mu.Unlock()
	var err error
	for _, s := range plan {
		if s.inLog {
			if _, err = j.m.ReadAt(p[s.i*j.bs:(s.i+s.n)*j.bs], j.unitOff(s.unit)); err != nil {
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
			if err := j.be.ReadAt(ctx, p[s.i*j.bs:(s.i+s.n)*j.bs], off+s.i*j.bs); err != nil {
				return err
			}
		}
	}
	return nil
}

// segment is a run of a read's blocks: from ring unit unit on when inLog, else from the target.
type segment struct {
	i, n  int64 // first block of the read, count
	unit  uint64
	inLog bool
}

// planRead cuts the read of n blocks at lba into runs from the log and from the target. mu is
// held.
func (j *Journal) planRead(plan []segment, lba, n uint64) []segment {
	if j.idx.live == 0 {
		return append(plan, segment{n: int64(n)})
	}
	for i := range n {
		u, ok := j.idx.get(lba + i)
		if k := len(plan) - 1; k >= 0 {
			last := &plan[k]
			if last.inLog == ok && (!ok || last.unit+uint64(last.n) == u) {
				last.n++
				continue
			}
		}
		plan = append(plan, segment{i: int64(i), n: 1, unit: u, inLog: ok})
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
