package pool

// Slabs: how a class gets more buffers (an unowned slab, a freshly carved one, or one reclaimed
// from another class whose buffers in it are all free).

import (
	"sync/atomic"
)

// grow gives class ci more free buffers: an unowned slab, a freshly carved one (mapping a new
// region if needed), or one reclaimed from another class. It reports false when the pool is at
// its bound and nothing could be reclaimed.
func (p *Pool) grow(ci int) (bool, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed.Load() {
		return false, ErrClosed
	}
	if p.classes[ci].head.Load()&0xffffffff != 0 {
		return true, nil // someone refilled it while we waited for the lock
	}
	if n := len(p.freeSlabs); n > 0 {
		s := p.freeSlabs[n-1]
		p.freeSlabs = p.freeSlabs[:n-1]
		p.assignSlab(int(s), ci)
		return true, nil
	}
	if p.carved < p.totalSlabs {
		if p.carved == p.mappedSlabs {
			if err := p.mapRegion(); err != nil {
				return false, err
			}
		}
		s := p.carved
		p.carved++
		p.assignSlab(s, ci)
		return true, nil
	}
	if p.reclaim(ci) {
		n := len(p.freeSlabs)
		s := p.freeSlabs[n-1]
		p.freeSlabs = p.freeSlabs[:n-1]
		p.assignSlab(int(s), ci)
		return true, nil
	}
	return false, nil
}

// assignSlab gives slab s to class ci and pushes its buffers. Called with p.mu held.
func (p *Pool) assignSlab(s, ci int) {
	atomic.StoreInt32(&p.slabClass[s], int32(ci))
	c := &p.classes[ci]
	base := s * p.unitsPerSlab
	step := c.size / p.unit
	for k := c.perSlab - 1; k >= 0; k-- {
		u := base + k*step
		atomic.StoreUint32(&p.state[u], stateFree)
		p.push(ci, int32(u))
	}
}

// reclaim looks for slabs owned by other classes whose buffers are all free, takes them back and
// appends them to p.freeSlabs. Called with p.mu held. Each class's whole free chain is detached
// atomically, so the walk owns it exclusively; buffers of slabs that stay are pushed back.
func (p *Pool) reclaim(want int) bool {
	// A slab can only be free if at least a slab's worth of carved memory is not out; this keeps
	// waiters that are woken by every Put at the bound from walking the free lists in vain.
	if int64(p.carved)*int64(p.slabSize)-p.inUse.Load() < int64(p.slabSize) {
		return false
	}
	found := false
	for ci := range p.classes {
		if ci == want {
			continue
		}
		c := &p.classes[ci]
		var h uint64
		for {
			h = c.head.Load()
			if uint32(h) == 0 || c.head.CompareAndSwap(h, (h>>32+1)<<32) {
				break
			}
		}
		first := int32(uint32(h)) - 1
		if first < 0 {
			continue
		}
		touched := p.touched[:0]
		for u := first; u >= 0; u = atomic.LoadInt32(&p.next[u]) {
			s := int(u) / p.unitsPerSlab
			if p.scratch[s] == 0 {
				touched = append(touched, int32(s))
			}
			p.scratch[s]++
		}
		var keep int32 = -1
		for u := first; u >= 0; {
			nxt := atomic.LoadInt32(&p.next[u])
			s := int(u) / p.unitsPerSlab
			if int(p.scratch[s]) == c.perSlab {
				atomic.StoreUint32(&p.state[u], stateNone)
			} else {
				atomic.StoreInt32(&p.next[u], keep)
				keep = u
			}
			u = nxt
		}
		for _, s := range touched {
			if p.scratch[s] == int32(c.perSlab) {
				atomic.StoreInt32(&p.slabClass[s], -1)
				p.freeSlabs = append(p.freeSlabs, s)
				p.reclaims.Add(1)
				found = true
			}
			p.scratch[s] = 0
		}
		for u := keep; u >= 0; {
			nxt := atomic.LoadInt32(&p.next[u])
			p.push(ci, u)
			u = nxt
		}
	}
	return found
}
