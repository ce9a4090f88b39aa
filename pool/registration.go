package pool

// The registration hook: how an RDMA transport learns of every region before a buffer from it
// is handed out, and finds a buffer's region (and its memory key) again without allocating.

import (
	"errors"
	"fmt"
	"unsafe"
)

// Lookup finds the region of a buffer from this pool, the handle its OnRegion hook returned, and
// the buffer's offset within the region. It does not allocate.
func (p *Pool) Lookup(b []byte) (r Region, handle any, off int, ok bool) {
	if cap(b) == 0 {
		return Region{}, nil, 0, false
	}
	reg, off, ok := p.find(uintptr(unsafe.Pointer(unsafe.SliceData(b))))
	if !ok {
		return Region{}, nil, 0, false
	}
	return reg.Region, reg.handle, off, true
}

// OnRegion installs the registration hook (only one may be installed). fn is called at once for
// every region that exists and then for each new region before any buffer from it is handed out;
// its handle is stored with the region and returned by Lookup. If fn fails for an existing region
// the hook is not installed; if it fails for a new region, the Get that needed the region fails.
func (p *Pool) OnRegion(fn func(r Region) (handle any, err error)) error {
	if fn == nil {
		return errors.New("pool: OnRegion(nil)")
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.hook != nil {
		return errors.New("pool: a region hook is already installed")
	}
	regs := p.regions.Load().byIndex
	handles := make([]any, len(regs))
	for i, r := range regs {
		h, err := fn(r.Region)
		if err != nil {
			return fmt.Errorf("pool: registering region %d (%d bytes): %w", r.Index, r.Len, err)
		}
		handles[i] = h
	}
	// Publish the handles with a fresh snapshot so that concurrent Lookups never race on them.
	fresh := make([]*region, len(regs))
	for i, r := range regs {
		c := *r
		c.handle = handles[i]
		fresh[i] = &c
	}
	p.regions.Store(newRegionSet(fresh))
	p.hook = fn
	return nil
}
