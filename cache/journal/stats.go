package journal

import (
	"sync/atomic"

	"github.com/iser-blk/iser-blk/internal/status"
)

type stats struct {
	batches, logged, around, flushes, syncs, waits atomic.Uint64
	rounds, cleaned, cleanErrors                   atomic.Uint64
}

// Stats is what status and metrics show of the cache device.
type Stats struct {
	Capacity    uint64 // bytes of the log ring
	LogBytes    uint64 // bytes of the ring in use: not yet written back (dirty data, superseded copies, headers)
	DirtyBytes  uint64 // bytes of data the target does not have yet
	IndexMemory uint64 // bytes of RAM the index takes
	Logged      uint64 // bytes written to the log since open
	Around      uint64 // bytes written to the target around the log
	Cleaned     uint64 // bytes written back to the target since open
	Rounds      uint64 // write-back rounds completed
	CleanErrors uint64 // write-back rounds failed
	Batches     uint64 // log batches written (system calls)
	Syncs       uint64 // fdatasyncs of the cache device
	Flushes     uint64
	Waits       uint64 // batches that waited for room in the ring
	Failed      string // why the cache device failed, or ""
}

// Stats returns the current counters.
func (j *Journal) Stats() Stats {
	j.mu.Lock()
	s := Stats{
		Capacity:   j.n * uint64(j.u),
		LogBytes:   (j.head - j.tail) * uint64(j.u),
		DirtyBytes: uint64(j.idx.live) * uint64(j.u),
	}
	if j.failed != nil {
		s.Failed = j.failed.Error()
	}
	j.mu.Unlock()
	s.IndexMemory = uint64(memoryFor(j.n))
	s.Logged, s.Around, s.Cleaned = j.st.logged.Load(), j.st.around.Load(), j.st.cleaned.Load()
	s.Rounds, s.CleanErrors, s.Batches = j.st.rounds.Load(), j.st.cleanErrors.Load(), j.st.batches.Load()
	s.Syncs, s.Flushes, s.Waits = j.st.syncs.Load(), j.st.flushes.Load(), j.st.waits.Load()
	return s
}

// DirtyBytes implements block.DirtyReporter: data the target does not have yet.
func (j *Journal) DirtyBytes() int64 { return int64(j.Stats().DirtyBytes) }

// CacheDeviceStatus is the cache device's part of `iser-blk status` and of the metrics (the RAM
// cache above includes it in its own).
func (j *Journal) CacheDeviceStatus() status.CacheDevice {
	s := j.Stats()
	return status.CacheDevice{Path: j.opt.Path, CapacityBytes: s.Capacity, LogBytes: s.LogBytes,
		DirtyBytes: s.DirtyBytes, IndexMemoryBytes: s.IndexMemory, WrittenBackBytes: s.Cleaned,
		WriteBackErrors: s.CleanErrors, Syncs: s.Syncs, Failed: s.Failed}
}
