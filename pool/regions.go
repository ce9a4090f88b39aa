package pool

// Regions: the mmap'd areas slabs are carved from, mapped lazily up to the bound, and the
// address lookup from a buffer to its region.

import (
	"fmt"
	"sort"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Region is one mmap'd area of the pool: the unit an RDMA transport registers.
type Region struct {
	Index int
	Base  unsafe.Pointer
	Len   int
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

func newRegionSet(byIndex []*region) *regionSet {
	byAddr := append([]*region(nil), byIndex...)
	sort.Slice(byAddr, func(i, j int) bool { return byAddr[i].addr < byAddr[j].addr })
	return &regionSet{byAddr: byAddr, byIndex: byIndex}
}
