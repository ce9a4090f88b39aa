package cache

import "time"

// Stats is a snapshot of the cache's counters.
type Stats struct {
	Mode             string
	SizeBytes        int64  // page budget
	CachedBytes      int64  // pages holding data
	DirtyBytes       int64  // dirty pages × page size (what Flush still has to write)
	DirtyLimitBytes  int64  // high watermark
	Hits, Misses     uint64 // pages served from cache / read from the backend
	ReadAheadBytes   uint64
	WriteBackBytes   uint64
	WriteBackErrors  uint64
	WriteAroundBytes uint64 // written straight to the backend (Config.WriteAround)
	ReadAroundBytes  uint64 // read straight from the backend (Config.ReadAround)
	OverlaidPages    uint64 // dirty pages copied over a read-around's data (readaround.go)
	// SupersededCleaned counts dirty pages a write-around cleaned because it wrote their data
	// (cleanSuperseded).
	SupersededCleaned uint64
	Flushes           uint64
	FlushErrors       uint64
	ThrottledWrites   uint64        // writes that waited for dirty room
	ThrottledNow      int           // writers waiting for dirty room right now
	ThrottledTime     time.Duration // time writers spent waiting for dirty room, summed over writers
	// LastWriteBackError is the error of the latest failed write-back ("" before the first),
	// LastWriteBackErrorAt when it failed.
	LastWriteBackError   string
	LastWriteBackErrorAt time.Time
	Evictions            uint64
}

// Stats returns a snapshot of the counters.
func (c *Cache) Stats() Stats {
	c.allocMu.Lock()
	cached := int64(len(c.slots)-len(c.freeSlots)) * c.ps
	c.allocMu.Unlock()
	var lastErr string
	var lastAt time.Time
	if f := c.st.lastWBFailure.Load(); f != nil {
		lastErr, lastAt = f.err, f.at
	}
	return Stats{
		Mode:                 c.cfg.Mode.String(),
		SizeBytes:            int64(len(c.slots)) * c.ps,
		CachedBytes:          cached,
		DirtyBytes:           c.dirtyPages.Load() * c.ps,
		DirtyLimitBytes:      c.cfg.limitPages * c.ps,
		Hits:                 c.hits(),
		Misses:               c.st.misses.Load(),
		ReadAheadBytes:       c.st.readAhead.Load(),
		WriteBackBytes:       c.st.wbBytes.Load(),
		WriteBackErrors:      c.st.wbErrors.Load(),
		WriteAroundBytes:     c.st.writeAround.Load(),
		ReadAroundBytes:      c.st.readAround.Load(),
		OverlaidPages:        c.st.overlaid.Load(),
		SupersededCleaned:    c.st.supersededClean.Load(),
		Flushes:              c.st.flushes.Load(),
		FlushErrors:          c.st.flushErrors.Load(),
		ThrottledWrites:      c.st.throttledWrites.Load(),
		ThrottledNow:         int(c.throttled.Load()),
		ThrottledTime:        time.Duration(c.st.throttledNanos.Load()),
		LastWriteBackError:   lastErr,
		LastWriteBackErrorAt: lastAt,
		Evictions:            c.st.evictions.Load(),
	}
}

func (c *Cache) hits() uint64 {
	var n uint64
	for i := range c.shards {
		sh := &c.shards[i]
		sh.mu.Lock()
		n += sh.hits
		sh.mu.Unlock()
	}
	return n
}

// DirtyBytes is what a Flush (or Close) still has to write back; cheap enough to poll for a
// shutdown progress line.
func (c *Cache) DirtyBytes() int64 { return c.dirtyPages.Load() * c.ps }
