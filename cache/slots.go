package cache

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"

	"github.com/iser-blk/iser-blk/block"
)

const nShards = 256

// shardRun consecutive pages share a shard (a power of two): a large read or write-back then
// takes one shard lock per run instead of one per page, while random pages still spread over
// every shard.
const shardRun = 16

type shard struct {
	mu   sync.Mutex
	m    map[int64]int32 // page number → slot
	hits uint64          // pages served from this shard (guarded by mu: no shared counter on the hit path)
	_    [32]byte
}

type slot struct {
	page int64 // written under allocMu; -1 while free or being inserted

	// guarded by the shard lock of page
	valid    uint64
	pins     int32
	ref      bool
	filling  bool // a miss is reading this (new) page from the backend
	invalSeq uint32

	busy atomic.Uint32 // dirty != 0 || inflight; written under dmu (and the shard lock when set)

	// guarded by dmu
	dirty      uint64
	gen        uint64
	inflight   bool
	dirtySeq   uint64
	dirtyAt    int64 // monotonic nanoseconds
	prev, next int32 // FIFO links, -1 terminated
	// superseded is the token of the write-around (or other direct operation) that last
	// superseded the page's dirty data, 0 once anything else modified it (cleanSuperseded).
	superseded uint64
}

// allocSlot returns a free slot for page pg, evicting a clean page with the CLOCK algorithm, or
// -1 if every page is dirty, in write-back or pinned. fresh is true the first time a slot is
// handed out: its page memory has never been written, so its first write faults it in (submit.go).
func (c *Cache) allocSlot(pg int64) (s int32, fresh bool) {
	c.allocMu.Lock()
	defer c.allocMu.Unlock()
	if n := len(c.freeSlots); n > 0 {
		s = c.freeSlots[n-1]
		c.freeSlots = c.freeSlots[:n-1]
		// New stacks the slots so that they come out in ascending order and a released slot
		// goes on top: a slot at or past nextFresh has never been handed out.
		fresh = s >= c.nextFresh
		if fresh {
			c.nextFresh = s + 1
		}
		c.slots[s].page = pg
		return s, fresh
	}
	for i := 0; i < 2*len(c.slots); i++ {
		s := int32(c.hand)
		c.hand++
		if c.hand == len(c.slots) {
			c.hand = 0
		}
		sl := &c.slots[s]
		if sl.page < 0 {
			continue
		}
		sh := c.shard(sl.page)
		sh.mu.Lock()
		if cur, ok := sh.m[sl.page]; !ok || cur != s || sl.pins > 0 || sl.busy.Load() != 0 {
			sh.mu.Unlock()
			continue
		}
		if sl.ref && sl.valid != 0 {
			sl.ref = false
			sh.mu.Unlock()
			continue
		}
		delete(sh.m, sl.page)
		sl.valid = 0
		sl.invalSeq++
		sh.mu.Unlock()
		c.st.evictions.Add(1)
		sl.page = pg
		return s, false
	}
	return -1, false
}

// insertPage enters slot s (just handed out by allocSlot) into the index as page pg with no valid
// sectors: pinned and marked filling for a miss (fill), referenced for a write. If another
// goroutine inserted pg meanwhile, s goes back to the free list and ok is false (the caller looks
// the page up again). invalSeq is the new page's, read under the shard lock.
func (c *Cache) insertPage(pg int64, s int32, fill bool) (invalSeq uint32, ok bool) {
	sh := c.shard(pg)
	sh.mu.Lock()
	if _, ok := sh.m[pg]; ok {
		sh.mu.Unlock()
		c.freeSlot(s)
		return 0, false
	}
	sl := &c.slots[s]
	sl.valid, sl.ref, sl.filling = 0, !fill, fill
	sl.pins = 0
	if fill {
		sl.pins = 1
	}
	sh.m[pg] = s
	invalSeq = sl.invalSeq
	sh.mu.Unlock()
	return invalSeq, true
}

// freeSlot returns slot s, whose page is not in the index, to the free list.
func (c *Cache) freeSlot(s int32) {
	c.releaseSlots([]int32{s})
}

// releaseSlots returns slots whose pages the caller removed from the index (under their shard
// lock, not held now) to the free list. An allocSlot sweep that meets one before finds its page
// gone from the index and passes it by.
func (c *Cache) releaseSlots(ss []int32) {
	c.allocMu.Lock()
	for _, s := range ss {
		c.slots[s].page = -1
		c.freeSlots = append(c.freeSlots, s)
	}
	c.allocMu.Unlock()
}

// runLast is the last page of the shard run that page pg is in.
func runLast(pg int64) int64 { return pg | (shardRun - 1) }

func (c *Cache) allocSlotWait(ctx context.Context, page int64) (int32, error) {
	for {
		ch := c.progress.wait()
		if s, _ := c.allocSlot(page); s >= 0 {
			return s, nil
		}
		c.doKick()
		select {
		case <-ch:
		case <-ctx.Done():
			return -1, fmt.Errorf("cache: waiting for a free page: %w", block.ContextError(ctx.Err()))
		case <-c.stop:
			return -1, fmt.Errorf("cache: %w", block.ErrClosed)
		}
	}
}
