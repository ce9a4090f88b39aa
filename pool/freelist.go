package pool

// Free lists: one lock-free Treiber stack of buffer indices per class, and each buffer's
// state (not carved, free, out), which Put checks so a foreign or double Put cannot corrupt it.

import (
	"sync/atomic"
)

// buffer states, one per unit (smallest class) at the start of each buffer.
const (
	stateNone uint32 = iota // not the start of a carved buffer
	stateFree
	stateOut
)

// pop takes a free buffer of class ci from its stack.
func (p *Pool) pop(ci int) ([]byte, bool) {
	c := &p.classes[ci]
	for {
		h := c.head.Load()
		idx := uint32(h)
		if idx == 0 {
			return nil, false
		}
		u := int32(idx - 1)
		nxt := atomic.LoadInt32(&p.next[u])
		nh := (h>>32+1)<<32 | uint64(uint32(nxt+1))
		if c.head.CompareAndSwap(h, nh) {
			if !atomic.CompareAndSwapUint32(&p.state[u], stateFree, stateOut) {
				panic("pool: free list corrupted (buffer on a free list is not free)")
			}
			return p.bufferAt(int(u), c.size), true
		}
	}
}

func (p *Pool) push(ci int, u int32) {
	c := &p.classes[ci]
	for {
		h := c.head.Load()
		atomic.StoreInt32(&p.next[u], int32(uint32(h))-1)
		nh := (h>>32+1)<<32 | uint64(uint32(u+1))
		if c.head.CompareAndSwap(h, nh) {
			return
		}
	}
}

// bufferAt returns the buffer of the given size that starts at unit u.
func (p *Pool) bufferAt(u, size int) []byte {
	slab := u / p.unitsPerSlab
	ri := slab / p.slabsPerReg
	r := p.regions.Load().byIndex[ri]
	off := (slab-ri*p.slabsPerReg)*p.slabSize + (u%p.unitsPerSlab)*p.unit
	return r.mem[off : off+size : off+size]
}
