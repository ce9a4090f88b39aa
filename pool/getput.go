package pool

// The hot path: Get, TryGet and Put, and how a Get waits at the bound for a Put.

import (
	"context"
	"fmt"
	"sync/atomic"
	"unsafe"
)

// Get returns a buffer with len n and cap equal to its size class. When the pool is at its bound
// it waits for a Put (or ctx). The contents are whatever the previous owner left.
func (p *Pool) Get(ctx context.Context, n int) ([]byte, error) {
	if n < 0 || n > p.maxClass {
		return nil, fmt.Errorf("pool: Get(%d): %w (%d)", n, ErrTooLarge, p.maxClass)
	}
	ci := p.classFor(n)
	waited := false
	for {
		if b, ok := p.pop(ci); ok {
			return p.handOut(b, n), nil
		}
		if p.closed.Load() {
			return nil, ErrClosed
		}
		grown, err := p.grow(ci)
		if err != nil {
			return nil, err
		}
		if grown {
			continue
		}
		// Announce the wait before the last look, so that a Put that lands in between either is
		// seen by the look or sees the waiter and wakes it.
		ch := p.prepareWait()
		if b, ok := p.pop(ci); ok {
			p.waiters.Add(-1)
			return p.handOut(b, n), nil
		}
		if grown, err = p.grow(ci); err != nil || grown {
			p.waiters.Add(-1)
			if err != nil {
				return nil, err
			}
			continue
		}
		if !waited {
			waited = true
			p.waits.Add(1)
		}
		select {
		case <-ch:
			p.waiters.Add(-1)
		case <-ctx.Done():
			p.waiters.Add(-1)
			return nil, fmt.Errorf("pool: waiting for a %d-byte buffer: %w", p.classes[ci].size, ctx.Err())
		}
	}
}

// TryGet is Get without waiting: ok is false when no buffer is free and the pool cannot grow
// (or n is out of range, or the pool is closed). For callers that must not block, such as a
// frontend's request reader serving cache hits inline.
func (p *Pool) TryGet(n int) (b []byte, ok bool) {
	if n < 0 || n > p.maxClass || p.closed.Load() {
		return nil, false
	}
	ci := p.classFor(n)
	for {
		if b, ok := p.pop(ci); ok {
			return p.handOut(b, n), true
		}
		if grown, err := p.grow(ci); err != nil || !grown {
			return nil, false
		}
	}
}

func (p *Pool) handOut(b []byte, n int) []byte {
	p.gets.Add(1)
	p.out.Add(1)
	p.inUse.Add(int64(cap(b)))
	return b[:n]
}

func (p *Pool) prepareWait() chan struct{} {
	p.waiters.Add(1)
	p.notifyMu.Lock()
	if p.notify == nil {
		p.notify = make(chan struct{})
	}
	ch := p.notify
	p.notifyMu.Unlock()
	return ch
}

func (p *Pool) wake() {
	p.notifyMu.Lock()
	if p.notify != nil {
		close(p.notify)
		p.notify = nil
	}
	p.notifyMu.Unlock()
}

// Put returns a buffer obtained from Get. It panics if b is not the start of a buffer of this
// pool that is currently out: that is a bug in the caller, and carrying on would corrupt memory.
func (p *Pool) Put(b []byte) {
	u, ci, ok := p.unitOf(b)
	if !ok {
		panic(fmt.Sprintf("pool: Put of a slice (%p, cap %d) that is not a buffer of this pool", unsafe.SliceData(b), cap(b)))
	}
	if !atomic.CompareAndSwapUint32(&p.state[u], stateOut, stateFree) {
		panic(fmt.Sprintf("pool: Put of a buffer (%p) that is not out (double Put?)", unsafe.SliceData(b)))
	}
	p.push(ci, int32(u))
	p.puts.Add(1)
	p.out.Add(^uint64(0))
	p.inUse.Add(-int64(p.classes[ci].size))
	if p.waiters.Load() > 0 {
		p.wake()
	}
}

// unitOf maps a buffer to its unit index and class, checking that it starts a carved buffer.
func (p *Pool) unitOf(b []byte) (unit int, ci int, ok bool) {
	if cap(b) == 0 {
		return 0, 0, false
	}
	r, off, ok := p.find(uintptr(unsafe.Pointer(unsafe.SliceData(b))))
	if !ok {
		return 0, 0, false
	}
	slabInRegion := off / p.slabSize
	slab := r.Index*p.slabsPerReg + slabInRegion
	c := atomic.LoadInt32(&p.slabClass[slab])
	if c < 0 {
		return 0, 0, false
	}
	size := p.classes[c].size
	offInSlab := off - slabInRegion*p.slabSize
	if offInSlab%size != 0 || offInSlab/size >= p.classes[c].perSlab || cap(b) > size {
		return 0, 0, false
	}
	return slab*p.unitsPerSlab + offInSlab/p.unit, int(c), true
}
