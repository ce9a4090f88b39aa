package cache

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/dustin/go-humanize"

	"github.com/iser-blk/iser-blk/internal/modes"
	"github.com/iser-blk/iser-blk/pool"
)

// Mode selects how writes are treated: the one cache-mode type of the tree (internal/modes),
// shared with the state file and the status schema.
type Mode = modes.Cache

// The modes (see modes.Cache).
const (
	WriteBack    = modes.WriteBack    // the default: acknowledged once in cache pages; Flush and FUA make durable
	WriteThrough = modes.WriteThrough // acknowledged once the backend accepted the write; reads are cached
	Off          = modes.Off          // no cache: Wrap returns the backend itself
)

// ParseMode parses the value of --cache.
func ParseMode(s string) (Mode, error) { return modes.ParseCache(s) }

// Defaults for the fields of Config left zero.
const (
	DefaultSize        = 1 << 30
	DefaultDirtyPct    = 50
	DefaultPageSize    = 4096
	DefaultMaxDirtyAge = 10 * time.Second
	DefaultWorkers     = 16      // random write-back is one page per request: keep the target's queue busy
	DefaultWriteBack   = 1 << 20 // largest write-back when the backend sets no MaxTransfer
	maxWriteBackCap    = 8 << 20
	DefaultReadAhead   = 512 << 10
	// DefaultWriteAround is the smallest write that goes around the pages: at 256 KiB a backend
	// write is already as large as a coalesced write-back needs to be for the wire, and below it
	// random and small sequential writes keep the cache's coalescing and early acks.
	DefaultWriteAround = 256 << 10
	// DefaultReadAround is the smallest read miss that goes around the pages, for the same
	// reason: filling pages would cost a second copy and a page booking per 4 KiB of a request
	// that the wire already moves efficiently.
	DefaultReadAround = 256 << 10
)

// Bounds of SizeFor: a sixteenth of the host's memory, at least MinAutoSize and at most
// DefaultSize.
const (
	MinAutoSize = 64 << 20
	autoDivisor = 16
)

// SizeFor is the default cache size for a process that may use memLimit bytes of memory
// (internal/memlimit: MemTotal or its cgroups' limit; 0 when unknown, which gives DefaultSize):
// a sixteenth of it, between 64 MiB and 1 GiB. A fixed 1 GiB (plus the NBD buffers) would be
// most of a small VM's memory; a sixteenth reaches the 1 GiB cap at 16 GiB. It is rounded down
// to a whole MiB, so that --cache-size's default, shown humanized in --help, is exactly the size
// used (a 2 GiB guest's MemTotal of 1.97 GiB gave 123.24 MiB, shown and parsed back as 123 MiB).
func SizeFor(memLimit int64) int64 {
	if memLimit <= 0 {
		return DefaultSize
	}
	return min(max(memLimit/autoDivisor, MinAutoSize), DefaultSize) &^ (1<<20 - 1)
}

// Config configures a cache. The zero value of every field means its default.
type Config struct {
	Mode Mode
	// Size is the memory budget for cache pages in bytes (--cache-size). Default 1 GiB.
	Size int64
	// DirtyLimit is the most dirty data the cache holds, in bytes (--cache-dirty): writers that
	// would exceed it wait for write-back (the high watermark). Default 50 % of Size.
	DirtyLimit int64
	// LowWater is the dirty level above which the flusher writes back in the background without a
	// reason (age, Flush, throttled writers). Default: a quarter of DirtyLimit, but at least two
	// full write-backs so that sequential writes are coalesced.
	LowWater int64
	// MaxDirtyAge bounds how long a page stays dirty before it is written back. Default 10 s.
	MaxDirtyAge time.Duration
	// Workers is the number of concurrent write-backs. Default 16: random dirty pages cannot be
	// coalesced, so write-back throughput then depends on the queue depth offered to the target.
	Workers int
	// MaxWriteBack caps one coalesced write-back in bytes. Default: the backend's MaxTransfer
	// (1 MiB when it has none), at most 8 MiB.
	MaxWriteBack int64
	// ReadAhead is the window read past a sequential miss. Default 512 KiB; negative disables.
	ReadAhead int64
	// WriteAround is the size from which a write goes straight from the caller's buffer to the
	// backend instead of through the pages, as with bcache's sequential cutoff: a large write is
	// not copied twice nor booked page by page, and is acknowledged when the backend accepted it.
	// A write of at least a quarter of it goes around too when it continues a sequential stream
	// that has written WriteAround bytes in a row. Dirty pages it overlaps take its data (they
	// never overwrite it later). Default 256 KiB; negative disables (every write is cached).
	WriteAround int64
	// ReadAround is the size from which a read goes from the backend straight into the caller's
	// buffer instead of through the pages (what WriteAround is for writes), even where its pages
	// are cached, and a miss of at least a quarter of it continuing a sequential stream too. Such a
	// read is not cached; the dirty pages of its range are copied over what the backend returned,
	// so that it returns what the cache holds. Default 256 KiB; negative disables.
	ReadAround int64
	// PageSize is the cache page size: a multiple of the backend's block size holding at most
	// 64 blocks. Default 4 KiB (or the block size if larger).
	PageSize int
	// HugePages asks the page pool for MAP_HUGETLB memory.
	HugePages bool
	// IOPool, when set, supplies staging buffers for backend I/O (so that an RDMA backend gets
	// registered memory). Otherwise staging buffers come from the Go heap.
	IOPool *pool.Pool

	dirtyPct float64 // set by ParseConfig for a percentage; resolved against Size
}

// ParseConfig turns the strings of --cache, --cache-size and --cache-dirty into a Config.
// Sizes are humanized ("1GiB", "512M", "1073741824"); the dirty limit is a percentage of the
// cache size ("50%") or a size. Empty strings mean the defaults.
func ParseConfig(mode, size, dirty string) (Config, error) {
	var cfg Config
	var err error
	if cfg.Mode, err = ParseMode(mode); err != nil {
		return Config{}, err
	}
	cfg.Size = DefaultSize
	if strings.TrimSpace(size) != "" {
		n, err := humanize.ParseBytes(strings.TrimSpace(size))
		if err != nil {
			return Config{}, fmt.Errorf("--cache-size %q: %w", size, err)
		}
		if n == 0 || n > 1<<50 {
			return Config{}, fmt.Errorf("--cache-size %q: out of range", size)
		}
		cfg.Size = int64(n)
	}
	d := strings.TrimSpace(dirty)
	switch {
	case d == "":
		cfg.dirtyPct = DefaultDirtyPct
	case strings.HasSuffix(d, "%"):
		pct, err := strconv.ParseFloat(strings.TrimSpace(strings.TrimSuffix(d, "%")), 64)
		if err != nil || pct <= 0 || pct > 100 {
			return Config{}, fmt.Errorf("--cache-dirty %q: want a percentage in (0, 100] or a size", dirty)
		}
		cfg.dirtyPct = pct
	default:
		n, err := humanize.ParseBytes(d)
		if err != nil {
			return Config{}, fmt.Errorf("--cache-dirty %q: %w", dirty, err)
		}
		if n == 0 {
			return Config{}, errors.New("--cache-dirty: must be positive")
		}
		if n > uint64(cfg.Size) { // compared unsigned: "10e" (10 EB) would wrap int64 negative
			return Config{}, fmt.Errorf("--cache-dirty %s is larger than --cache-size %s",
				humanize.IBytes(n), humanize.IBytes(uint64(cfg.Size)))
		}
		cfg.DirtyLimit = int64(n)
	}
	if cfg.dirtyPct > 0 {
		cfg.DirtyLimit = int64(float64(cfg.Size) * cfg.dirtyPct / 100)
		if cfg.DirtyLimit < 1 {
			return Config{}, fmt.Errorf("--cache-dirty %q of a %d-byte cache is nothing", dirty, cfg.Size)
		}
	}
	return cfg, nil
}

// resolved is a Config with every default filled in for a given backend.
type resolved struct {
	Config
	blockSize  int
	spp        int   // sectors (blocks) per page
	nPages     int   // cache slots
	limitPages int64 // dirty limit in pages
	lowPages   int64
	bgWorkers  int   // write-backs in flight for no reason but the low watermark
	maxJob     int64 // bytes per write-back
	raPages    int64
}

func resolve(cfg Config, bs int, backendMaxTransfer int64) (resolved, error) {
	r := resolved{Config: cfg, blockSize: bs}
	if bs < 512 || bs&(bs-1) != 0 {
		return r, fmt.Errorf("cache: backend block size %d is not a power of two >= 512", bs)
	}
	if r.PageSize == 0 {
		r.PageSize = DefaultPageSize
		if bs > r.PageSize {
			r.PageSize = bs
		}
	}
	if r.PageSize%bs != 0 || r.PageSize/bs > 64 {
		return r, fmt.Errorf("cache: page size %d must be a multiple of the block size %d and hold at most 64 blocks", r.PageSize, bs)
	}
	r.spp = r.PageSize / bs
	if r.Size == 0 {
		r.Size = DefaultSize
	}
	if r.DirtyLimit == 0 {
		pct := cfg.dirtyPct
		if pct == 0 {
			pct = DefaultDirtyPct
		}
		r.DirtyLimit = int64(float64(r.Size) * pct / 100)
	}
	if err := r.resolveWriteBack(backendMaxTransfer); err != nil {
		return r, err
	}
	// The page pool maps whole slabs: pages past the last whole one would never come.
	r.nPages = int(pool.Usable(r.Size, r.PageSize) / int64(r.PageSize))
	if r.nPages < 16 {
		return r, fmt.Errorf("cache: --cache-size %s holds fewer than 16 pages", humanize.IBytes(uint64(r.Size)))
	}
	r.limitPages = r.DirtyLimit / int64(r.PageSize)
	if r.limitPages < 1 || r.limitPages > int64(r.nPages) {
		return r, fmt.Errorf("cache: dirty limit %d must be between one page and the cache size %d", r.DirtyLimit, r.Size)
	}
	if r.LowWater == 0 {
		r.LowWater = r.DirtyLimit / 4
		if floor := min(2*r.maxJob, r.DirtyLimit/2); r.LowWater < floor {
			r.LowWater = floor
		}
	}
	r.lowPages = r.LowWater / int64(r.PageSize)
	if r.lowPages >= r.limitPages {
		r.lowPages = r.limitPages - 1
	}
	if r.MaxDirtyAge == 0 {
		r.MaxDirtyAge = DefaultMaxDirtyAge
	}
	if r.Workers == 0 {
		r.Workers = DefaultWorkers
	}
	r.bgWorkers = max(1, r.Workers/8)
	if r.ReadAhead == 0 {
		r.ReadAhead = DefaultReadAhead
	}
	if r.WriteAround == 0 {
		r.WriteAround = DefaultWriteAround
	}
	if r.ReadAround == 0 {
		r.ReadAround = DefaultReadAround
	}
	if r.ReadAhead > 0 {
		r.raPages = r.ReadAhead / int64(r.PageSize)
	}
	return r, nil
}

// resolveWriteBack sets the bytes one write-back carries: MaxWriteBack (the backend's transfer
// limit by default), at most that limit and maxWriteBackCap, in whole pages.
func (r *resolved) resolveWriteBack(backendMaxTransfer int64) error {
	if r.MaxWriteBack == 0 {
		r.MaxWriteBack = backendMaxTransfer
		if r.MaxWriteBack == 0 {
			r.MaxWriteBack = DefaultWriteBack
		}
	}
	if backendMaxTransfer > 0 && r.MaxWriteBack > backendMaxTransfer {
		r.MaxWriteBack = backendMaxTransfer
	}
	if r.MaxWriteBack > maxWriteBackCap {
		r.MaxWriteBack = maxWriteBackCap
	}
	r.MaxWriteBack = r.MaxWriteBack / int64(r.PageSize) * int64(r.PageSize)
	if r.MaxWriteBack < int64(r.PageSize) {
		return fmt.Errorf("cache: write-back size %d is smaller than a page (%d)", r.MaxWriteBack, r.PageSize)
	}
	r.maxJob = r.MaxWriteBack
	return nil
}
