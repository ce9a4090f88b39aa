package journal

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/iser-blk/iser-blk/block"
)

// appendReq is one entry waiting for the batch writer.
type appendReq struct {
	lba    uint64
	blocks uint32
	data   []byte // nil: an invalidation
	part   int    // >= 0: data is part of unit lba at this offset, to merge with its contents; -1: whole units
	err    error
	done   chan struct{}
	lead   bool // done was signalled to make this append's caller the batch writer (tryAppend)
}

var reqPool = sync.Pool{New: func() any { return &appendReq{done: make(chan struct{}, 1)} }}

// append logs one entry and returns once the batch carrying it is written to the cache device
// and applied to the index (durable at the next Flush). Appends that arrive while a batch is
// being written wait and go together into the next one: the first of them writes it (group
// commit, one system call per batch).
func (j *Journal) append(lba uint64, blocks uint32, data []byte) error {
	return j.queue(lba, blocks, data, -1)
}

// appendMerge logs the bytes data at offset part of unit lba, merged with the unit's current
// contents (from the log, else from the target). The batch writer does the merge, one such
// append per batch, so that no other write to the unit comes between the read and the append.
func (j *Journal) appendMerge(lba uint64, part int, data []byte) error {
	return j.queue(lba, 1, data, part)
}

func (j *Journal) queue(lba uint64, blocks uint32, data []byte, part int) error {
	r := reqPool.Get().(*appendReq)
	r.lba, r.blocks, r.data, r.part, r.err = lba, blocks, data, part, nil
	j.amu.Lock()
	j.pending = append(j.pending, r)
	if j.writing {
		j.amu.Unlock()
	} else {
		j.writing = true
		j.writeLoop()
	}
	<-r.done
	if r.lead { // tryAppend handed the batch writer's role over: r is still pending
		r.lead = false
		j.amu.Lock()
		j.writeLoop()
		<-r.done
	}
	err := r.err
	r.data = nil
	reqPool.Put(r)
	return err
}

// writeLoop writes batches until no append waits. amu is held on entry and released on return.
func (j *Journal) writeLoop() {
	for len(j.pending) > 0 {
		reqs := j.pending
		j.pending = j.spare[:0]
		j.amu.Unlock()
		for len(reqs) > 0 {
			k := batchLen(reqs)
			err := j.writeBatch(reqs[:k], true)
			for _, r := range reqs[:k] {
				r.err = err
				r.done <- struct{}{}
			}
			reqs = reqs[k:]
		}
		j.amu.Lock()
		j.spare = reqs[:0]
	}
	j.writing = false
	j.amu.Unlock()
}

// errNoRoom is reserve's answer, without wait, when the ring is too full for the batch.
var errNoRoom = errors.New("journal: no room in the ring without waiting for write-back")

// tryAppend is append for a caller that must not wait (WriteCached): it logs whole units as a
// batch of their own when no batch is being written and the ring has room now, and reports false
// having logged nothing otherwise, or when the batch failed (the caller's WriteAt then meets the
// error). Appends that queue meanwhile are written after it by the first of their callers, who
// is woken to take over as batch writer, so that the caller never writes batches for others.
func (j *Journal) tryAppend(lba uint64, blocks uint32, data []byte) bool {
	j.amu.Lock()
	if j.writing {
		j.amu.Unlock()
		return false
	}
	j.writing = true
	j.amu.Unlock()
	r := &j.tryReq
	r.lba, r.blocks, r.data, r.part = lba, blocks, data, -1
	j.tryReqs[0] = r
	err := j.writeBatch(j.tryReqs[:], false)
	r.data = nil
	j.amu.Lock()
	if len(j.pending) > 0 {
		next := j.pending[0]
		next.lead = true
		j.amu.Unlock()
		next.done <- struct{}{}
	} else {
		j.writing = false
		j.amu.Unlock()
	}
	return err == nil
}

// batchLen is how many of reqs (at least one) fit one batch. A merge goes alone.
func batchLen(reqs []*appendReq) int {
	if reqs[0].part >= 0 {
		return 1
	}
	data := 0
	for i, r := range reqs {
		if i == MaxEntries || r.part >= 0 || (i > 0 && data+len(r.data) > maxBatchData) {
			return i
		}
		data += len(r.data)
	}
	return len(reqs)
}

// merged is the unit r names with r's bytes copied in, in the batch writer's buffer.
func (j *Journal) merged(r *appendReq) ([]byte, error) {
	buf := j.mergeBuf
	j.rmu.RLock()
	j.mu.Lock()
	ru, ok := j.idx.get(r.lba)
	j.mu.Unlock()
	var err error
	if ok {
		_, err = j.m.ReadAt(buf, j.unitOff(ru))
		j.rmu.RUnlock()
		if err != nil {
			return nil, &ioError{fmt.Errorf("journal: reading the cache device: %w", err)}
		}
	} else {
		j.rmu.RUnlock()
		if err = j.be.ReadAt(context.Background(), buf, int64(r.lba)*j.u); err != nil {
			return nil, fmt.Errorf("journal: reading the rest of a block for a partial write: %w", err)
		}
	}
	copy(buf[r.part:], r.data)
	return buf, nil
}

// writeBatch writes one batch (with a wrap before it when it does not fit the rest of the ring),
// waiting for write-back to free room (without wait: errNoRoom instead), and applies it to the
// index.
func (j *Journal) writeBatch(reqs []*appendReq, wait bool) error {
	h := &j.hdr
	h.Kind, h.DataUnits, h.Entries = kindData, 0, h.Entries[:0]
	j.iov = append(j.iov[:0], j.hdrBuf)
	for _, r := range reqs {
		e := Entry{LBA: r.lba, Blocks: r.blocks, Flags: entryInvalidate}
		if r.data != nil {
			data := r.data
			if r.part >= 0 {
				var err error
				if data, err = j.merged(r); err != nil {
					return err
				}
			}
			e.Flags, e.CRC = entryData, checksum(data)
			h.DataUnits += r.blocks
			j.iov = append(j.iov, data)
		}
		h.Entries = append(h.Entries, e)
	}
	need := j.hdrU + uint64(h.DataUnits)
	phys, err := j.reserve(need, wait)
	if err != nil {
		clear(j.iov)
		return err
	}
	j.mu.Lock()
	h.Instance, h.Seq, h.PrevSeq = j.inst, j.seq, j.prevSeq
	j.mu.Unlock()
	MarshalHeader(h, j.hdrBuf)
	if err := j.m.WriteVAt(j.iov, j.unitOff(phys)); err != nil {
		return j.fail(err)
	}
	clear(j.iov)
	j.mu.Lock()
	j.apply(h, phys+j.hdrU)
	if j.dirtySince.IsZero() {
		j.dirtySince = time.Now()
	}
	j.head += need
	j.prevSeq, j.seq = h.Seq, h.Seq+1
	quarter := (j.head-j.tail)*4 >= j.n
	j.mu.Unlock()
	if quarter {
		j.kickClean()
	}
	j.appended.Add(1)
	j.st.batches.Add(1)
	return nil
}

// reserve waits until the ring has need contiguous free units at its head and returns the first
// one (without wait it returns errNoRoom instead of waiting). When the rest of the ring is too
// short it skips it first: with a wrap batch when a header fits there, silently otherwise
// (recovery skips such a stub the same way).
func (j *Journal) reserve(need uint64, wait bool) (uint64, error) {
	j.mu.Lock()
	defer j.mu.Unlock()
	for {
		if j.failed != nil {
			return 0, &ioError{j.failed}
		}
		phys := j.head % j.n
		skip := uint64(0)
		if j.n-phys < need {
			skip = j.n - phys
		}
		if j.head+skip+need-j.tail <= j.n {
			if skip == 0 {
				return phys, nil
			}
			if err := j.wrapLocked(phys, skip); err != nil {
				return 0, err
			}
			continue
		}
		if !wait {
			return 0, errNoRoom
		}
		j.st.waits.Add(1)
		ch := j.changed.wait()
		j.mu.Unlock()
		j.kickClean()
		select {
		case <-ch:
		case <-j.stop:
			j.mu.Lock()
			return 0, fmt.Errorf("journal: %w", block.ErrClosed)
		}
		j.mu.Lock()
	}
}

// wrapLocked ends the ring's lap at phys. mu is held; the batch writer is the only writer.
func (j *Journal) wrapLocked(phys, skip uint64) error {
	if skip >= j.hdrU {
		w := Header{Instance: j.inst, Seq: j.seq, PrevSeq: j.prevSeq, Kind: kindWrap}
		MarshalHeader(&w, j.wrapBuf)
		if err := j.m.WriteVAt([][]byte{j.wrapBuf}, j.unitOff(phys)); err != nil {
			j.mu.Unlock()
			err = j.fail(err)
			j.mu.Lock()
			return err
		}
		j.prevSeq, j.seq = j.seq, j.seq+1
	}
	j.head += skip
	return nil
}
