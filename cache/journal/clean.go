package journal

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"sync"
	"time"

	"go.uber.org/zap"

	"github.com/iser-blk/iser-blk/block"
)

// The write-back ("cleaning") of the log to the target. A round takes the batches from the
// checkpoint on (up to Options.RoundBytes), collects the blocks of them that are still the newest
// copy of their LBA, writes those to the target in LBA order (adjacent blocks coalesced, Workers
// writes in flight), flushes the target, and only then records the new checkpoint in the
// superblock and frees the round's units. A crash at any point leaves the checkpoint where it was
// or where it now durably is: the target has everything before it, the log everything after it.

// blockRef is a block the round writes back: its LBA and the ring unit holding its data.
type blockRef struct{ lba, unit uint64 }

func (j *Journal) kickClean() {
	select {
	case j.kick <- struct{}{}:
	default:
	}
}

// cleaner writes the log back once its oldest data has waited CleanAfter, and at once when
// kicked (the log a quarter full, a writer waiting for room); then until the log is empty. A
// failed round is retried with back-off.
func (j *Journal) cleaner() {
	defer j.wg.Done()
	t := time.NewTicker(min(j.opt.CleanAfter/4, time.Second))
	defer t.Stop()
	backoff := 10 * time.Millisecond
	for {
		select {
		case <-j.stop:
			return
		case <-j.kick:
		case <-t.C:
			if !j.due() {
				continue
			}
		}
		for !j.empty() {
			if err := j.cleanRound(context.Background()); err != nil {
				j.st.cleanErrors.Add(1)
				j.log.Warn("write-back to the target failed; retrying", zap.Error(err), zap.Duration("in", backoff))
				select {
				case <-j.stop:
					return
				case <-time.After(backoff):
				}
				backoff = min(2*backoff, time.Second)
				break
			}
			backoff = 10 * time.Millisecond
		}
	}
}

// due reports whether the log holds data older than CleanAfter: since it last became non-empty
// (a round that leaves data behind is followed by the next at once, so that is the oldest).
func (j *Journal) due() bool {
	j.mu.Lock()
	defer j.mu.Unlock()
	return !j.dirtySince.IsZero() && time.Since(j.dirtySince) >= j.opt.CleanAfter
}

func (j *Journal) empty() bool {
	j.mu.Lock()
	defer j.mu.Unlock()
	return j.head == j.tail || j.failed != nil
}

// drainAll writes back everything, retrying failed rounds until ctx is done.
func (j *Journal) drainAll(ctx context.Context) error {
	backoff := 10 * time.Millisecond
	for !j.empty() {
		err := j.cleanRound(ctx)
		if err == nil {
			continue
		}
		j.log.Warn("write-back at detach failed; retrying", zap.Error(err))
		select {
		case <-ctx.Done():
			return fmt.Errorf("journal: write-back at close: %w (last: %w)", block.ContextError(ctx.Err()), err)
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, time.Second)
	}
	return j.failure()
}

// cleanRound runs one round (see above). Rounds are serialised.
func (j *Journal) cleanRound(ctx context.Context) error {
	j.cleanMu.Lock()
	defer j.cleanMu.Unlock()
	j.mu.Lock()
	start, end := j.tail, j.head
	j.mu.Unlock()
	refs, stop, err := j.collect(start, end)
	if err != nil {
		return err
	}
	stop, seq, err := j.checkpointAt(stop)
	if err != nil {
		return err
	}
	written, err := j.writeBack(ctx, refs)
	if err != nil {
		return err
	}
	if j.beLim.CanFlush {
		if err := j.be.Flush(ctx); err != nil {
			return fmt.Errorf("journal: flushing the target after write-back: %w", err)
		}
	}
	// The round skipped blocks that a newer batch (or an invalidation) superseded, and that
	// batch may still be only in the page cache: it must be durable before the checkpoint that
	// drops the older copy can be, since the device may persist the superblock write first.
	if err := j.m.Sync(); err != nil {
		return j.fail(err)
	}
	s := j.super
	s.TailPos, s.TailSeq, s.Cleaned = stop, seq, s.Cleaned+uint64(written)
	if err := j.writeSuper(&s); err != nil {
		return j.fail(err)
	}
	j.rmu.Lock()
	j.mu.Lock()
	for p := start; p < stop; p++ {
		j.idx.dropUnit(p % j.n)
	}
	j.tail, j.tailSeq = stop, seq
	if j.tail == j.head {
		j.dirtySince = time.Time{}
	}
	j.mu.Unlock()
	j.rmu.Unlock()
	j.changed.broadcast()
	j.st.rounds.Add(1)
	j.st.cleaned.Add(uint64(written))
	return nil
}

// collect walks the batches of [start, end) up to RoundBytes and returns the blocks among them
// that are the newest copy of their LBA, sorted by LBA, and where the walk stopped.
func (j *Journal) collect(start, end uint64) ([]blockRef, uint64, error) {
	refs := j.refs[:0]
	var h Header
	pos := start
	for pos < end && int64(pos-start)*j.u < j.opt.RoundBytes {
		phys := pos % j.n
		if j.n-phys < j.hdrU {
			pos += j.n - phys
			continue
		}
		if _, err := j.m.ReadAt(j.cleanHdr, j.unitOff(phys)); err != nil {
			return nil, 0, j.fail(fmt.Errorf("reading the log at unit %d: %w", phys, err))
		}
		if err := UnmarshalHeader(j.cleanHdr, &h); err != nil {
			return nil, 0, j.fail(fmt.Errorf("the log at unit %d changed under the journal: %w", phys, err))
		}
		if h.Kind == kindWrap {
			pos += j.n - phys
			continue
		}
		u := phys + j.hdrU
		j.mu.Lock()
		for _, e := range h.Entries {
			if e.Flags != entryData {
				continue
			}
			for range e.Blocks {
				if lba, ok := j.idx.liveAt(u); ok {
					refs = append(refs, blockRef{lba, u})
				}
				u++
			}
		}
		j.mu.Unlock()
		pos += j.hdrU + uint64(h.DataUnits)
	}
	if pos < end && j.n-pos%j.n < j.hdrU {
		pos += j.n - pos%j.n
	}
	slices.SortFunc(refs, func(a, b blockRef) int { return cmp.Compare(a.lba, b.lba) })
	j.refs = refs
	return refs, pos, nil
}

// checkpointAt is the checkpoint for a round that ends at ring position pos: the position of the
// next batch (past a stub at the end of the ring that the writer has skipped meanwhile) and its
// sequence number, read from its header, or the next one to be assigned when it is not written
// yet.
func (j *Journal) checkpointAt(pos uint64) (uint64, uint64, error) {
	j.mu.Lock()
	if pos < j.head && j.n-pos%j.n < j.hdrU {
		pos += j.n - pos%j.n
	}
	if pos == j.head {
		defer j.mu.Unlock()
		return pos, j.seq, nil
	}
	j.mu.Unlock()
	var h Header
	if _, err := j.m.ReadAt(j.cleanHdr, j.unitOff(pos%j.n)); err != nil {
		return 0, 0, j.fail(err)
	}
	if err := UnmarshalHeader(j.cleanHdr, &h); err != nil {
		return 0, 0, j.fail(fmt.Errorf("the log at unit %d changed under the journal: %w", pos%j.n, err))
	}
	return pos, h.Seq, nil
}

// writeBack writes refs (sorted by LBA) to the target in runs of adjacent blocks, Workers at a
// time, and returns the bytes written.
func (j *Journal) writeBack(ctx context.Context, refs []blockRef) (int64, error) {
	maxRun := int(min(max(j.beLim.MaxTransfer, 0), 1<<20) / j.u)
	if maxRun == 0 {
		maxRun = int((1 << 20) / j.u)
	}
	runs := make(chan []blockRef)
	var (
		wg      sync.WaitGroup
		mu      sync.Mutex
		first   error
		written int64
	)
	for range min(j.opt.Workers, max(1, len(refs)/maxRun+1)) {
		wg.Go(func() {
			buf := make([]byte, maxRun*int(j.u))
			for run := range runs {
				n, err := j.writeRun(ctx, run, buf)
				mu.Lock()
				written += n
				if err != nil && first == nil {
					first = err
				}
				mu.Unlock()
			}
		})
	}
	for i := 0; i < len(refs); {
		k := i + 1
		for k < len(refs) && k-i < maxRun && refs[k].lba == refs[k-1].lba+1 {
			k++
		}
		runs <- refs[i:k]
		i = k
	}
	close(runs)
	wg.Wait()
	return written, first
}

// writeRun writes the blocks of run that are still the newest copy of their LBA (a newer write
// or an invalidation may have come since collect) to the target. While it does, their range is
// registered in cleaning, so that an operation that goes around the log waits for it.
func (j *Journal) writeRun(ctx context.Context, run []blockRef, buf []byte) (int64, error) {
	var written int64
	for len(run) > 0 {
		j.mu.Lock()
		for len(run) > 0 && !j.isNewest(run[0]) {
			run = run[1:]
		}
		k := 0
		for k < len(run) && j.isNewest(run[k]) {
			k++
		}
		if k == 0 {
			j.mu.Unlock()
			break
		}
		r := lbaRange{run[0].lba, run[0].lba + uint64(k)}
		j.cleaning = append(j.cleaning, r)
		j.mu.Unlock()
		err := j.writeRefs(ctx, run[:k], buf)
		j.mu.Lock()
		if i := slices.Index(j.cleaning, r); i >= 0 {
			j.cleaning = slices.Delete(j.cleaning, i, i+1)
		}
		j.mu.Unlock()
		j.changed.broadcast()
		if err != nil {
			return written, err
		}
		written += int64(k) * j.u
		run = run[k:]
	}
	return written, nil
}

func (j *Journal) isNewest(r blockRef) bool {
	u, ok := j.idx.get(r.lba)
	return ok && u == r.unit
}

// writeRefs reads the data of refs (adjacent LBAs) from the log and writes it to the target.
func (j *Journal) writeRefs(ctx context.Context, refs []blockRef, buf []byte) error {
	buf = buf[:int64(len(refs))*j.u]
	for i := 0; i < len(refs); {
		k := i + 1
		for k < len(refs) && refs[k].unit == refs[k-1].unit+1 {
			k++
		}
		if _, err := j.m.ReadAt(buf[int64(i)*j.u:int64(k)*j.u], j.unitOff(refs[i].unit)); err != nil {
			return j.fail(fmt.Errorf("reading the log for write-back: %w", err))
		}
		i = k
	}
	if err := j.be.WriteAt(ctx, buf, int64(refs[0].lba)*j.u, 0); err != nil {
		return fmt.Errorf("journal: write-back: %w", err)
	}
	return nil
}
