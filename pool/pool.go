// Package pool is iser-blk's buffer pool: fixed size classes of buffers carved from large mmap'd
// regions that live outside the Go heap, so that an RDMA transport may register them with the HCA
// (cgo pointer rules forbid handing Go-heap memory to a device that keeps the address) and the
// garbage collector never scans or moves them.
//
// # Layout
//
// The bound (Config.MaxBytes) is divided into slabs of slabSize bytes (at least MaxClass, normally
// 256 KiB or more), and slabs are grouped into regions of about 32 MiB. A region is one mmap
// (MAP_PRIVATE|MAP_ANONYMOUS, MAP_HUGETLB first when HugePages is set, falling back to normal pages
// with MADV_HUGEPAGE) and is the unit of RDMA registration: a handful of large regions keeps the
// number of memory registrations small (tgt and SPDK do the same), while mapping them lazily keeps
// a pool sized for the worst case from pinning memory it never uses. Regions are created on demand,
// never freed before Close, and every region is passed to the OnRegion hook before any buffer from
// it is handed out.
//
// A slab is owned by one size class at a time and cut into equal buffers of that class. Each class
// keeps its free buffers on a lock-free Treiber stack of buffer indices (the "next" links live in a
// preallocated []int32, the head packs a 32-bit ABA tag with the index), so Get and Put allocate
// nothing and take no lock in steady state.
//
// # Invariants
//
//   - Mapped memory never exceeds MaxBytes (rounded down to whole slabs); Get waits (honouring its
//     context) instead of growing past it.
//   - Every buffer is in exactly one of three states: not carved, free (on its class stack), or out
//     (handed to a caller). Put checks that the slice starts at a buffer of this pool that is out;
//     anything else (a foreign slice, an interior pointer, a double Put) panics with a clear message,
//     because silently accepting it would corrupt the free lists and later hand one buffer to two
//     owners.
//   - When every slab is owned and a class is starved, Get reclaims slabs whose buffers are all free
//     from other classes, so a workload that shifts from small to large requests cannot deadlock on
//     memory parked in another class.
package pool

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"sync"
	"sync/atomic"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Errors returned by the pool.
var (
	// ErrTooLarge: a Get asked for more than MaxClass bytes.
	ErrTooLarge = errors.New("pool: request larger than the largest size class")
	// ErrClosed: the pool was closed.
	ErrClosed = errors.New("pool: closed")
	// ErrBusy: Close found buffers still out.
	ErrBusy = errors.New("pool: buffers still out")
)

const (
	defaultMinClass   = 4 << 10
	defaultMaxClass   = 1 << 20
	defaultSlabSize   = 256 << 10
	defaultRegionSize = 32 << 20
	hugePageSize      = 2 << 20
)

// Config sizes a Pool.
type Config struct {
	// MaxBytes bounds the memory the pool maps (rounded down to whole slabs). Required.
	MaxBytes int64
	// Classes are the buffer sizes, ascending; each must be a multiple of the first. Optional:
	// the default is powers of two from 4 KiB up to MaxClass (MaxClass itself is always a class).
	Classes []int
	// MaxClass is the largest buffer Get hands out. Default: the largest of Classes, or 1 MiB.
	MaxClass int
	// HugePages tries MAP_HUGETLB for each region and falls back to normal pages (with
	// MADV_HUGEPAGE) when the system has none to give.
	HugePages bool
	// RegionSize is the target size of one mmap/registration unit. Default 32 MiB.
	RegionSize int
}

// Region is one mmap'd area of the pool: the unit an RDMA transport registers.
type Region struct {
	Index int
	Base  unsafe.Pointer
	Len   int
}

// Stats is a snapshot of the pool's counters.
type Stats struct {
	MaxBytes    int64  // the bound, after rounding to whole slabs
	MappedBytes int64  // bytes in regions mapped so far
	InUseBytes  int64  // bytes in buffers that are out (by class size)
	Regions     int    // regions mapped
	HugeRegions int    // of which backed by MAP_HUGETLB
	Gets, Puts  uint64 // completed Gets and Puts
	Waits       uint64 // Gets that had to wait for a buffer
	Reclaims    uint64 // slabs taken back from one class for another
}

// regionSet is an immutable snapshot of the mapped regions.
type regionSet struct {
	byAddr  []*region // sorted by address, for Lookup and Put
	byIndex []*region // by Region.Index, for handing out buffers
}

type region struct {
	Region
	mem    []byte // the mapping, as returned by mmap (length may exceed Len for hugetlb rounding)
	addr   uintptr
	huge   bool
	handle any
}

// buffer states, one per unit (smallest class) at the start of each buffer.
const (
	stateNone uint32 = iota // not the start of a carved buffer
	stateFree
	stateOut
)

type class struct {
	size    int
	perSlab int
	head    atomic.Uint64 // tag<<32 | (unit index + 1); low half 0 = empty
	_       [40]byte      // keep hot heads on separate cache lines
}

// Pool is a bounded, size-classed buffer pool over mmap'd memory. All methods are safe for
// concurrent use.
type Pool struct {
	classes      []class
	maxClass     int
	unit         int // smallest class: the granularity of buffer indices
	slabSize     int
	unitsPerSlab int
	slabsPerReg  int
	totalSlabs   int
	regionSize   int // slabsPerReg*slabSize: distance between region indices in the unit numbering
	hugePages    bool

	next  []int32  // free-stack links by unit index (-1: end)
	state []uint32 // stateNone/Free/Out by unit index

	slabClass []int32 // owning class index or -1, by global slab index (atomic)

	regions atomic.Pointer[regionSet] // replaced (copy-on-write) when a region is added

	mu          sync.Mutex // guards the slow path: carving, reclaim, region creation, the hook
	freeSlabs   []int32    // unowned slabs in mapped regions (reclaimed)
	carved      int        // slabs ever carved out of mapped regions (bump pointer over slab index)
	mappedSlabs int
	hook        func(Region) (any, error)
	scratch     []int32 // per-slab counters for reclaim
	touched     []int32 // slabs with a non-zero scratch counter
	closed      atomic.Bool

	waiters  atomic.Int32
	notifyMu sync.Mutex
	notify   chan struct{}

	out, gets, puts, waits, reclaims atomic.Uint64
	inUse                            atomic.Int64
	mappedBytes                      atomic.Int64
	hugeRegions                      atomic.Int32
}

// New validates cfg and returns an empty pool; memory is mapped as Gets need it.
func New(cfg Config) (*Pool, error) {
	classes, maxClass, err := normalizeClasses(cfg)
	if err != nil {
		return nil, err
	}
	if cfg.MaxBytes < int64(maxClass) {
		return nil, fmt.Errorf("pool: MaxBytes %d is smaller than the largest class %d", cfg.MaxBytes, maxClass)
	}
	slab := maxClass
	if slab < defaultSlabSize {
		slab = (defaultSlabSize + maxClass - 1) / maxClass * maxClass
	}
	for int64(slab) > cfg.MaxBytes && slab > maxClass {
		slab -= maxClass
	}
	totalSlabs64 := cfg.MaxBytes / int64(slab)
	if totalSlabs64 > 1<<30 {
		return nil, fmt.Errorf("pool: MaxBytes %d is too large", cfg.MaxBytes)
	}
	unit := classes[0]
	unitsPerSlab := slab / unit
	if int64(unitsPerSlab)*totalSlabs64 >= 1<<31-1 {
		return nil, fmt.Errorf("pool: %d bytes in %d-byte units is too many buffers", cfg.MaxBytes, unit)
	}
	regionTarget := cfg.RegionSize
	if regionTarget <= 0 {
		regionTarget = defaultRegionSize
	}
	slabsPerReg := (regionTarget + slab - 1) / slab
	if slabsPerReg < 1 {
		slabsPerReg = 1
	}
	totalSlabs := int(totalSlabs64)
	p := &Pool{
		classes:      make([]class, len(classes)),
		maxClass:     maxClass,
		unit:         unit,
		slabSize:     slab,
		unitsPerSlab: unitsPerSlab,
		slabsPerReg:  slabsPerReg,
		totalSlabs:   totalSlabs,
		regionSize:   slabsPerReg * slab,
		hugePages:    cfg.HugePages,
		next:         make([]int32, totalSlabs*unitsPerSlab),
		state:        make([]uint32, totalSlabs*unitsPerSlab),
		slabClass:    make([]int32, totalSlabs),
		scratch:      make([]int32, totalSlabs),
		touched:      make([]int32, 0, totalSlabs),
	}
	for i, size := range classes {
		p.classes[i].size = size
		p.classes[i].perSlab = slab / size
	}
	for i := range p.slabClass {
		p.slabClass[i] = -1
	}
	p.regions.Store(&regionSet{})
	return p, nil
}

func normalizeClasses(cfg Config) ([]int, int, error) {
	maxClass := cfg.MaxClass
	classes := append([]int(nil), cfg.Classes...)
	if len(classes) > 0 {
		if !sort.IntsAreSorted(classes) {
			return nil, 0, fmt.Errorf("pool: classes %v are not ascending", classes)
		}
		if maxClass == 0 {
			maxClass = classes[len(classes)-1]
		}
	} else {
		if maxClass == 0 {
			maxClass = defaultMaxClass
		}
		for c := defaultMinClass; c < maxClass; c *= 2 {
			classes = append(classes, c)
		}
	}
	for len(classes) > 0 && classes[len(classes)-1] > maxClass {
		classes = classes[:len(classes)-1]
	}
	if len(classes) == 0 || classes[len(classes)-1] != maxClass {
		classes = append(classes, maxClass)
	}
	for i, c := range classes {
		if c <= 0 {
			return nil, 0, fmt.Errorf("pool: class %d is not positive", c)
		}
		if i > 0 && (c == classes[i-1] || c%classes[0] != 0) {
			return nil, 0, fmt.Errorf("pool: class %d must be distinct and a multiple of the smallest class %d", c, classes[0])
		}
	}
	return classes, maxClass, nil
}

// MaxClass is the largest n Get accepts.
func (p *Pool) MaxClass() int { return p.maxClass }

// classFor returns the index of the smallest class that holds n bytes.
func (p *Pool) classFor(n int) int {
	for i := range p.classes {
		if p.classes[i].size >= n {
			return i
		}
	}
	return len(p.classes) - 1
}

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

// find returns the region holding addr and the offset within it.
func (p *Pool) find(addr uintptr) (*region, int, bool) {
	regs := p.regions.Load().byAddr
	// Binary search without a closure, so the lookup does not allocate.
	lo, hi := 0, len(regs)
	for lo < hi {
		mid := int(uint(lo+hi) >> 1)
		if regs[mid].addr+uintptr(regs[mid].Len) <= addr {
			lo = mid + 1
		} else {
			hi = mid
		}
	}
	if lo == len(regs) || addr < regs[lo].addr {
		return nil, 0, false
	}
	return regs[lo], int(addr - regs[lo].addr), true
}

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

// mapRegion maps the next region and runs the hook on it. Called with p.mu held.
func (p *Pool) mapRegion() error {
	regs := p.regions.Load().byIndex
	idx := len(regs)
	slabs := p.slabsPerReg
	if rest := p.totalSlabs - p.mappedSlabs; rest < slabs {
		slabs = rest
	}
	length := slabs * p.slabSize
	var mem []byte
	var err error
	huge := false
	if p.hugePages {
		mapLen := (length + hugePageSize - 1) / hugePageSize * hugePageSize
		mem, err = unix.Mmap(-1, 0, mapLen, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS|unix.MAP_HUGETLB)
		huge = err == nil
	}
	if !huge {
		mem, err = unix.Mmap(-1, 0, length, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
		if err != nil {
			return fmt.Errorf("pool: mmap of a %d-byte region: %w", length, err)
		}
		if p.hugePages {
			_ = unix.Madvise(mem, unix.MADV_HUGEPAGE) // best effort: transparent huge pages
		}
	}
	r := &region{
		Region: Region{Index: idx, Base: unsafe.Pointer(unsafe.SliceData(mem)), Len: length},
		mem:    mem,
		addr:   uintptr(unsafe.Pointer(unsafe.SliceData(mem))),
		huge:   huge,
	}
	if p.hook != nil {
		h, err := p.hook(r.Region)
		if err != nil {
			_ = unix.Munmap(mem)
			return fmt.Errorf("pool: registering region %d (%d bytes): %w", idx, length, err)
		}
		r.handle = h
	}
	fresh := make([]*region, len(regs)+1)
	copy(fresh, regs)
	fresh[idx] = r
	p.regions.Store(newRegionSet(fresh))
	p.mappedSlabs += slabs
	p.mappedBytes.Add(int64(length))
	if huge {
		p.hugeRegions.Add(1)
	}
	return nil
}

// Stats returns a snapshot of the counters.
func (p *Pool) Stats() Stats {
	return Stats{
		MaxBytes:    int64(p.totalSlabs) * int64(p.slabSize),
		MappedBytes: p.mappedBytes.Load(),
		InUseBytes:  p.inUse.Load(),
		Regions:     len(p.regions.Load().byIndex),
		HugeRegions: int(p.hugeRegions.Load()),
		Gets:        p.gets.Load(),
		Puts:        p.puts.Load(),
		Waits:       p.waits.Load(),
		Reclaims:    p.reclaims.Load(),
	}
}

// Close unmaps every region. It fails with ErrBusy (and leaves the pool usable) while buffers are
// still out; after a successful Close, Get fails with ErrClosed.
func (p *Pool) Close() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed.Load() {
		return nil
	}
	if n := p.out.Load(); n != 0 {
		return fmt.Errorf("pool: close with %d buffers out: %w", n, ErrBusy)
	}
	p.closed.Store(true)
	var first error
	for _, r := range p.regions.Load().byIndex {
		if err := unix.Munmap(r.mem); err != nil && first == nil {
			first = fmt.Errorf("pool: munmap region %d: %w", r.Index, err)
		}
	}
	p.regions.Store(&regionSet{})
	for i := range p.classes {
		p.classes[i].head.Store(0)
	}
	p.wake()
	return first
}

func newRegionSet(byIndex []*region) *regionSet {
	byAddr := append([]*region(nil), byIndex...)
	sort.Slice(byAddr, func(i, j int) bool { return byAddr[i].addr < byAddr[j].addr })
	return &regionSet{byAddr: byAddr, byIndex: byIndex}
}
