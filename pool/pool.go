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
//
// # Files
//
// pool.go holds the type, its configuration, New, Stats and Close; sizeclass.go the size classes;
// getput.go the hot path (Get, TryGet, Put); freelist.go the per-class lock-free stacks and buffer
// states; slabs.go how a class grows (carving and reclaiming slabs); regions.go the mmap'd regions
// and the buffer-to-region lookup; registration.go the OnRegion hook and Lookup that an RDMA
// transport uses.
package pool

import (
	"errors"
	"fmt"
	"sync"
	"sync/atomic"

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

// slabFor is the slab size of a pool bounded by maxBytes whose largest class is maxClass.
func slabFor(maxBytes int64, maxClass int) int {
	slab := maxClass
	if slab < defaultSlabSize {
		slab = (defaultSlabSize + maxClass - 1) / maxClass * maxClass
	}
	for int64(slab) > maxBytes && slab > maxClass {
		slab -= maxClass
	}
	return slab
}

// Usable is how many bytes a pool with MaxBytes maxBytes and the one size class class can hand
// out: maxBytes rounded down to whole slabs. A caller that takes all its buffers up front (the
// cache's pages) sizes itself with it, or its last Get would wait forever.
func Usable(maxBytes int64, class int) int64 {
	if maxBytes < int64(class) {
		return 0
	}
	slab := int64(slabFor(maxBytes, class))
	return maxBytes / slab * slab
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
	slab := slabFor(cfg.MaxBytes, maxClass)
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
