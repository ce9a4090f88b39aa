// Package cache is iser-blk's write-back / write-through cache: a block.Device that wraps a
// block.Device and behaves exactly like a disk with a volatile write cache.
//
// # Pages and their states
//
// The device is cut into pages of PageSize bytes (4 KiB by default), each made of up to 64
// logical blocks ("sectors"). Page memory comes from a private pool.Pool (mmap, outside the Go
// heap, so a 1 GiB cache costs the garbage collector almost nothing: what stays on the heap is
// about 180 bytes of pointer-free metadata per page, ~45 MiB for 1 GiB of 4 KiB pages). Backend
// I/O goes through staging buffers from Config.IOPool when set (registered memory for iSER): a
// write-back gathers its pages into one buffer, a miss reads into one and is copied into pages.
// A cached page ("slot") carries:
//
//   - valid: the sectors whose bytes in the page are the device's current content. A sector is
//     valid because it was read from the backend, or written through the cache.
//   - dirty: the valid sectors that the backend does not have yet: written and acknowledged, not
//     yet written back. A dirty page is never evicted. The dirty pages are kept in a FIFO ordered
//     by the moment they became dirty (dirtySeq), which is what Flush and the age limit use.
//   - gen: a generation number bumped by every modification of the page's dirty contents (a write,
//     a discard). A write-back records gen when it snapshots the page; when it completes, it clears
//     the dirty bits it wrote only if gen is unchanged. A write that lands on a page while the page
//     is being written back therefore keeps it dirty: the completing write-back never marks newer
//     data clean.
//   - inflight ("write-back in progress"): a backend write carrying this page's data is in flight.
//     At most one is in flight per page, so two write-backs of one page can never reach the backend
//     out of order (an older snapshot landing after a newer one). FUA and write-through writes go
//     through the same write-back path and obey the same rule.
//   - pins: readers filling the page from the backend; a pinned page is not evicted.
//
// Discard and write-zeroes ("direct" operations) go to the backend at once. Before they are sent,
// the range is registered (no write-back of a page in it may start), the cached sectors are
// invalidated (dirty data in the range is dropped: the discard supersedes it), and the operation
// waits for every write-back of the range already in flight. Only then is the backend command
// issued, so an old write-back can never land after the discard and resurrect old data. Reads
// that filled from the backend while a direct operation overlapped do not install what they read.
//
// A FUA write (and every write in write-through mode) is copied into pages and then the dirty
// pages of its range are written back before it returns, waiting for any write-back of them in
// flight. Those backend writes carry FUA (or are followed by a backend Flush when the backend has
// no FUA); if some bytes of the range were carried by another write-back without FUA (the flusher
// got there first), a backend Flush makes them durable before the ack.
//
// Reads copy valid sectors from pages; a miss reads the page-aligned span (plus read-ahead for a
// sequential stream) into placeholder pages, filling only sectors that are not valid, so a
// sub-page write never needs a read-modify-write and never loses to a concurrent fill. Eviction is
// CLOCK over clean, unpinned pages.
//
// # Why Flush is correct
//
// Flush takes seq, the dirtySeq of the most recent clean→dirty transition. Every write
// acknowledged before Flush was called has its data in a page that is either clean (its data was
// written back by a completed backend write issued after the data was copied in: gen rules) or
// dirty with dirtySeq <= seq: a page keeps its dirtySeq until it becomes clean, and it becomes
// clean only through a successful write-back of its latest generation. Flush waits until the
// FIFO holds no page with dirtySeq <= seq, then calls the backend's Flush (SYNCHRONIZE CACHE); it
// returns nil only if that succeeds.
//
// Errors: a failed write-back leaves its pages dirty (nothing is dropped) and the flusher retries
// with exponential back-off (10 ms … 1 s). A Flush cancels the back-off, so the pages it needs
// are retried at once, and it fails (with an error satisfying block.ErrIO that wraps the
// backend's) as soon as any write-back started after the Flush began fails. Thus the next FLUSH
// after a failure fails while the backend still fails, and a FLUSH issued after the backend
// recovered succeeds with all data on the backend. Failures of write-backs started before the
// Flush are not reported by it: their pages are still dirty, so the Flush retries them itself.
//
// # Back-pressure
//
// Writers reserve a dirty page before making a clean page dirty (one reservation per request
// when all of its pages fit, page by page otherwise; rewriting a page that is dirty already needs
// none); at the dirty limit (the high watermark) they wait, honouring their context, for
// write-back to make room. WriteCached (block.CachedWriter) is the same write that never waits: a
// frontend calls it on its reader goroutine and falls back to WriteAt when it declines.
//
// The flusher writes back in the background when more than LowWater is dirty and not in flight,
// when a page is older than MaxDirtyAge, when writers are throttled, and when a Flush is waiting. It starts from the
// oldest dirty page and coalesces adjacent dirty pages into one backend write of up to
// MaxWriteBack bytes, with Workers write-backs in flight at most; when nobody waits (only the low
// watermark or the age limit calls for it), with Workers/8, so that background write-back leaves
// the CPU and the target to foreground I/O.
//
// # Locks
//
// The index is sharded by page number (shard.mu guards the map, valid, pins, ref and page data).
// c.dmu guards the dirty state (dirty, gen, inflight, the FIFO, dirtyIdx). allocMu guards slot
// allocation and the CLOCK hand. Order: allocMu → shard.mu → dmu → directMu. Read hits take one
// shard lock and allocate nothing.
package cache

import (
	"context"
	"errors"
	"fmt"
	"math/bits"
	"sync"
	"sync/atomic"
	"time"

	"github.com/dustin/go-humanize"
	"go.uber.org/zap"

	"github.com/iser-blk/iser-blk/block"
	"github.com/iser-blk/iser-blk/pool"
)

const nShards = 256

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
}

type directRange struct{ off, end int64 }

// Cache is a caching block.Device. Create it with New or Wrap.
type Cache struct {
	be     block.Device
	lim    block.Limits // of the backend
	cfg    resolved
	log    *zap.Logger
	ps     int64 // page size
	bs     int64
	full   uint64 // mask with all sectors of a page set
	size   int64
	pages  *pool.Pool
	bufs   [][]byte
	slots  []slot
	shards [nShards]shard

	allocMu   sync.Mutex
	freeSlots []int32
	hand      int

	dmu           sync.Mutex
	head, tail    int32
	dirtyIdx      *dirtyIndex
	seq           uint64
	flushTarget   uint64
	inflightPages int64
	bgJobs        int    // background write-backs in flight (see pickJobLocked)
	jobSeq        uint64 // numbers write-backs in the order they start
	failSeq       uint64 // the latest-started write-back that failed
	lastErr       error  // and its error
	backoff       time.Duration
	backoffUntil  time.Time
	closing       bool

	directMu     sync.Mutex
	direct       []directRange
	directActive atomic.Int32

	reserved   atomic.Int64 // dirty pages plus reservations; <= limitPages
	dirtyPages atomic.Int64
	throttled  atomic.Int32 // writers waiting for room now

	progress notifier
	kick     chan struct{}
	stop     chan struct{}
	wg       sync.WaitGroup
	bgCtx    context.Context
	bgCancel context.CancelFunc
	closed   atomic.Bool
	ops      atomic.Int64 // calls in progress; page memory is released only when none is
	jobs     sync.Pool

	streams    [8]atomic.Int64
	streamNext atomic.Uint32
	zeroOnce   sync.Once
	zeroBuf    []byte // for WriteZeroes emulation

	st counters
}

type counters struct {
	misses, readAhead, wbBytes, wbErrors, flushes, flushErrors, throttledWrites, evictions atomic.Uint64
}

// Stats is a snapshot of the cache's counters.
type Stats struct {
	Mode            string
	SizeBytes       int64  // page budget
	CachedBytes     int64  // pages holding data
	DirtyBytes      int64  // dirty pages × page size (what Flush still has to write)
	DirtyLimitBytes int64  // high watermark
	Hits, Misses    uint64 // pages served from cache / read from the backend
	ReadAheadBytes  uint64
	WriteBackBytes  uint64
	WriteBackErrors uint64
	Flushes         uint64
	FlushErrors     uint64
	ThrottledWrites uint64 // writes that waited for dirty room
	ThrottledNow    int    // writers waiting for dirty room right now
	Evictions       uint64
}

// notifier is a broadcast: waiters take the current channel, broadcast closes it. It allocates
// only when someone waits.
type notifier struct {
	mu sync.Mutex
	ch chan struct{}
}

func (n *notifier) wait() <-chan struct{} {
	n.mu.Lock()
	if n.ch == nil {
		n.ch = make(chan struct{})
	}
	ch := n.ch
	n.mu.Unlock()
	return ch
}

func (n *notifier) broadcast() {
	n.mu.Lock()
	if n.ch != nil {
		close(n.ch)
		n.ch = nil
	}
	n.mu.Unlock()
}

// Wrap returns dev wrapped in a cache configured by cfg, or dev itself when cfg.Mode is Off. The
// returned Device owns dev: closing it flushes and closes dev.
func Wrap(dev block.Device, cfg Config, log *zap.Logger) (block.Device, error) {
	if cfg.Mode == Off {
		return dev, nil
	}
	return New(dev, cfg, log)
}

// New wraps dev in a cache. See Wrap.
func New(dev block.Device, cfg Config, log *zap.Logger) (*Cache, error) {
	if log == nil {
		log = zap.NewNop()
	}
	if cfg.Mode != WriteBack && cfg.Mode != WriteThrough {
		return nil, fmt.Errorf("cache: mode %v cannot be instantiated", cfg.Mode)
	}
	lim := dev.Limits()
	r, err := resolve(cfg, dev.BlockSize(), lim.MaxTransfer)
	if err != nil {
		return nil, err
	}
	pages, err := pool.New(pool.Config{
		MaxBytes:  int64(r.nPages) * int64(r.PageSize),
		Classes:   []int{r.PageSize},
		MaxClass:  r.PageSize,
		HugePages: r.HugePages,
	})
	if err != nil {
		return nil, fmt.Errorf("cache: page pool: %w", err)
	}
	c := &Cache{
		be:        dev,
		lim:       lim,
		cfg:       r,
		log:       log.Named("cache"),
		ps:        int64(r.PageSize),
		bs:        int64(r.blockSize),
		size:      dev.Size(),
		pages:     pages,
		bufs:      make([][]byte, r.nPages),
		slots:     make([]slot, r.nPages),
		freeSlots: make([]int32, 0, r.nPages),
		head:      -1,
		tail:      -1,
		dirtyIdx:  newDirtyIndex(int(r.limitPages)),
		kick:      make(chan struct{}, 1),
		stop:      make(chan struct{}),
	}
	if r.spp == 64 {
		c.full = ^uint64(0)
	} else {
		c.full = 1<<uint(r.spp) - 1
	}
	for i := range c.shards {
		c.shards[i].m = make(map[int64]int32)
	}
	ctx := context.Background()
	for i := r.nPages - 1; i >= 0; i-- {
		b, err := pages.Get(ctx, r.PageSize)
		if err != nil {
			c.releasePages()
			return nil, fmt.Errorf("cache: page %d: %w", i, err)
		}
		c.bufs[i] = b
		c.slots[i].page = -1
		c.freeSlots = append(c.freeSlots, int32(i))
	}
	c.jobs.New = func() any { return c.newJob() }
	c.bgCtx, c.bgCancel = context.WithCancel(context.Background())
	for i := 0; i < r.Workers; i++ {
		c.wg.Add(1)
		go c.worker()
	}
	c.log.Info("cache ready",
		zap.Stringer("mode", r.Mode),
		zap.String("size", humanize.IBytes(uint64(r.Size))),
		zap.String("dirty_limit", humanize.IBytes(uint64(r.DirtyLimit))),
		zap.String("low_water", humanize.IBytes(uint64(r.lowPages*c.ps))),
		zap.String("write_back_max", humanize.IBytes(uint64(r.maxJob))),
		zap.Duration("max_dirty_age", r.MaxDirtyAge),
		zap.Int("workers", r.Workers),
		zap.Int("page_size", r.PageSize),
		zap.Int("huge_regions", pages.Stats().HugeRegions))
	return c, nil
}

func (c *Cache) releasePages() {
	for i, b := range c.bufs {
		if b != nil {
			c.pages.Put(b)
			c.bufs[i] = nil
		}
	}
	_ = c.pages.Close()
}

// Size is the backend's size.
func (c *Cache) Size() int64 { return c.size }

// BlockSize is the backend's logical block size.
func (c *Cache) BlockSize() int { return int(c.bs) }

// Limits are the backend's, with a volatile cache (write-back mode), Flush and FUA always
// available (FUA is emulated with Flush when the backend lacks it).
func (c *Cache) Limits() block.Limits {
	l := c.lim
	if c.cfg.Mode == WriteBack {
		l.VolatileCache = true
	}
	l.CanFlush = true
	l.CanFUA = true
	if !c.lim.CanWriteZeroes {
		l.CanWriteZeroes = true // emulated by writing zeroes through the cache
		l.CanFastZero = false
	}
	return l
}

// Mode reports the cache mode.
func (c *Cache) Mode() Mode { return c.cfg.Mode }

func (c *Cache) shard(page int64) *shard { return &c.shards[uint64(page)%nShards] }

// sectorMask returns the sectors of a page covered by [pOff, pOff+n).
func (c *Cache) sectorMask(pOff, n int64) uint64 {
	first := uint(pOff / c.bs)
	cnt := uint(n / c.bs)
	if cnt >= 64 {
		return ^uint64(0)
	}
	return (1<<cnt - 1) << first
}

// enter admits a call; every successful enter is paired with exit. Page memory is unmapped only
// after the cache is closed and no call is inside, so a call racing with Close fails cleanly
// instead of touching unmapped memory.
func (c *Cache) enter() error {
	c.ops.Add(1)
	if c.closed.Load() {
		c.exit()
		return fmt.Errorf("cache: %w", block.ErrClosed)
	}
	return nil
}

func (c *Cache) exit() {
	if c.ops.Add(-1) == 0 && c.closed.Load() {
		c.progress.broadcast()
	}
}

func (c *Cache) doKick() {
	select {
	case c.kick <- struct{}{}:
	default:
	}
}

// ReadAt serves p from cache pages where they are valid and fills the rest from the backend.
func (c *Cache) ReadAt(ctx context.Context, p []byte, off int64) error {
	if err := c.enter(); err != nil {
		return err
	}
	defer c.exit()
	if err := block.CheckRange(c, off, int64(len(p))); err != nil {
		return err
	}
	pos := int64(0)
	for pos < int64(len(p)) {
		page, pOff := (off+pos)/c.ps, (off+pos)%c.ps
		n := min(c.ps-pOff, int64(len(p))-pos)
		if !c.readHit(page, pOff, p[pos:pos+n]) {
			// A concurrent miss (typically read-ahead) is already reading this page: wait
			// for it rather than read the same bytes from the backend twice.
			ch := c.progress.wait()
			if !c.beingFilled(page) {
				break
			}
			select {
			case <-ch:
				continue
			case <-ctx.Done():
				return fmt.Errorf("cache: waiting for a fill: %w", ctx.Err())
			}
		}
		pos += n
	}
	if pos == int64(len(p)) {
		return nil
	}
	return c.readMiss(ctx, p[pos:], off+pos)
}

// ReadCached implements block.CachedReader: it copies p from cache pages when every sector of
// it is valid there, without touching the backend or waiting for a fill in progress.
func (c *Cache) ReadCached(p []byte, off int64) bool {
	if c.enter() != nil {
		return false
	}
	defer c.exit()
	if len(p) == 0 || block.CheckRange(c, off, int64(len(p))) != nil {
		return false
	}
	for pos := int64(0); pos < int64(len(p)); {
		page, pOff := (off+pos)/c.ps, (off+pos)%c.ps
		n := min(c.ps-pOff, int64(len(p))-pos)
		if !c.readHit(page, pOff, p[pos:pos+n]) {
			return false
		}
		pos += n
	}
	return true
}

var _ block.CachedReader = (*Cache)(nil)

func (c *Cache) beingFilled(page int64) bool {
	sh := c.shard(page)
	sh.mu.Lock()
	s, ok := sh.m[page]
	filling := ok && c.slots[s].filling
	sh.mu.Unlock()
	return filling
}

// Sequential detection runs on misses only, so hits stay cheap: each stream slot holds the
// offset where the stream's next miss is expected (the end of what its last miss filled,
// read-ahead included). A miss there is sequential; any other miss takes a slot round-robin.
func (c *Cache) sequentialMiss(off int64) (slot int, ok bool) {
	for i := range c.streams {
		if c.streams[i].Load() == off {
			return i, true
		}
	}
	return int(c.streamNext.Add(1) % uint32(len(c.streams))), false
}

func (c *Cache) readHit(page, pOff int64, dst []byte) bool {
	sh := c.shard(page)
	sh.mu.Lock()
	s, ok := sh.m[page]
	if !ok {
		sh.mu.Unlock()
		return false
	}
	sl := &c.slots[s]
	need := c.sectorMask(pOff, int64(len(dst)))
	if sl.valid&need != need {
		sh.mu.Unlock()
		return false
	}
	copy(dst, c.bufs[s][pOff:])
	sl.ref = true
	sh.hits++
	sh.mu.Unlock()
	return true
}

type fillPage struct {
	slot     int32 // -1: not cached
	invalSeq uint32
	created  bool // this fill inserted the page (and set its filling flag)
}

// readMiss reads [off, off+len(p)) (page-aligned, plus read-ahead when sequential) from the
// backend into placeholder pages, merges it with what the cache holds and copies p out.
func (c *Cache) readMiss(ctx context.Context, p []byte, off int64) error {
	stream, sequential := c.sequentialMiss(off)
	filledEnd := off + int64(len(p))
	defer func() { c.streams[stream].Store(filledEnd) }()
	first := off / c.ps
	last := (off + int64(len(p)) - 1) / c.ps
	reqLast := last
	lastDev := (c.size - 1) / c.ps
	if sequential && c.cfg.raPages > 0 {
		last = min(last+c.cfg.raPages, lastDev)
	}
	maxPages := c.cfg.maxJob / c.ps
	if c.lim.MaxTransfer > 0 {
		maxPages = max(1, c.lim.MaxTransfer/c.ps)
	}
	fills := make([]fillPage, 0, min(last-first+1, maxPages))
	for a := first; a <= last; {
		b := min(last, a+maxPages-1)
		if a > reqLast { // pure read-ahead chunk: stop at a page we already have
			b = c.trimReadAhead(a, b)
			if b < a {
				break
			}
		}
		fills = fills[:0]
		for pg := a; pg <= b; pg++ {
			fills = append(fills, c.placeholder(pg, pg > reqLast))
		}
		// Read-ahead pages found cached by placeholder() were not pinned; trim them off the tail.
		for b > reqLast && len(fills) > 0 && fills[len(fills)-1].slot == -2 {
			fills = fills[:len(fills)-1]
			b--
		}
		if b < a {
			break
		}
		install := !c.directOverlaps(a*c.ps, (b-a+1)*c.ps)
		err := c.fillChunk(ctx, p, off, a, b, reqLast, fills, install)
		if err != nil {
			return err
		}
		if a > reqLast || b >= reqLast {
			filledEnd = max(filledEnd, min((b+1)*c.ps, c.size))
		}
		a = b + 1
	}
	return nil
}

// trimReadAhead returns the last page of [a, b] before the first cached page.
func (c *Cache) trimReadAhead(a, b int64) int64 {
	for pg := a; pg <= b; pg++ {
		sh := c.shard(pg)
		sh.mu.Lock()
		_, ok := sh.m[pg]
		sh.mu.Unlock()
		if ok {
			return pg - 1
		}
	}
	return b
}

// placeholder pins the page (inserting an empty one if absent and a slot can be had). For
// read-ahead pages that are already cached it returns slot -2 (nothing to do).
func (c *Cache) placeholder(pg int64, readAhead bool) fillPage {
	sh := c.shard(pg)
	for {
		sh.mu.Lock()
		if s, ok := sh.m[pg]; ok {
			sl := &c.slots[s]
			if readAhead && sl.valid == c.full {
				sh.mu.Unlock()
				return fillPage{slot: -2}
			}
			sl.pins++
			fp := fillPage{slot: s, invalSeq: sl.invalSeq}
			sh.mu.Unlock()
			return fp
		}
		sh.mu.Unlock()
		s := c.allocSlot(pg)
		if s < 0 {
			return fillPage{slot: -1}
		}
		sh.mu.Lock()
		if _, ok := sh.m[pg]; ok {
			sh.mu.Unlock()
			c.freeSlot(s)
			continue
		}
		sl := &c.slots[s]
		sl.valid, sl.pins, sl.ref, sl.filling = 0, 1, false, true
		sh.m[pg] = s
		fp := fillPage{slot: s, invalSeq: sl.invalSeq, created: true}
		sh.mu.Unlock()
		return fp
	}
}

func (c *Cache) staging(ctx context.Context, n int) ([]byte, func(), error) {
	if c.cfg.IOPool != nil && n <= c.cfg.IOPool.MaxClass() {
		b, err := c.cfg.IOPool.Get(ctx, n)
		if err != nil {
			return nil, nil, fmt.Errorf("cache: staging buffer: %w", err)
		}
		return b, func() { c.cfg.IOPool.Put(b) }, nil
	}
	return make([]byte, n), func() {}, nil
}

func (c *Cache) fillChunk(ctx context.Context, p []byte, off, a, b, reqLast int64, fills []fillPage, install bool) (err error) {
	n := (b - a + 1) * c.ps
	if end := c.size; a*c.ps+n > end {
		n = end - a*c.ps
	}
	buf, release, err := c.staging(ctx, int(n))
	if err == nil {
		defer release()
		err = c.be.ReadAt(ctx, buf, a*c.ps)
		if err != nil {
			err = fmt.Errorf("cache: read miss [%d, +%d): %w", a*c.ps, n, err)
		}
	}
	for i, fp := range fills {
		pg := a + int64(i)
		pageData := buf
		if err == nil {
			lo := int64(i) * c.ps
			pageData = buf[lo:min(lo+c.ps, n)]
		}
		c.finishFill(pg, fp, pageData, install && err == nil, p, off, pg <= reqLast, err == nil)
	}
	c.st.misses.Add(uint64(min(b, reqLast) - a + 1))
	if b > reqLast {
		c.st.readAhead.Add(uint64((b - reqLast) * c.ps))
	}
	c.progress.broadcast() // unpinned pages may now be evictable
	return err
}

// finishFill installs a filled page (if still wanted), copies the requested part out and unpins.
func (c *Cache) finishFill(pg int64, fp fillPage, data []byte, install bool, p []byte, off int64, requested, haveData bool) {
	sh := c.shard(pg)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	var sl *slot
	var s int32 = -1
	if fp.slot >= 0 {
		s = fp.slot
		sl = &c.slots[s]
		sl.pins--
		if fp.created {
			sl.filling = false
		}
		if install && sl.invalSeq == fp.invalSeq {
			have := c.full // the last page of a device may be cut short
			if int64(len(data)) < c.ps {
				have = c.sectorMask(0, int64(len(data)))
			}
			page := c.bufs[s]
			for m := have &^ sl.valid; m != 0; m &= m - 1 {
				k := int64(bits.TrailingZeros64(m))
				copy(page[k*c.bs:(k+1)*c.bs], data[k*c.bs:])
			}
			sl.valid |= have
		}
	} else if cur, ok := sh.m[pg]; ok {
		s, sl = cur, &c.slots[cur]
	}
	if !requested || !haveData {
		return
	}
	// Copy out the part of p in this page: valid sectors from the page, others from the backend.
	pageOff := pg * c.ps
	lo := max(off, pageOff)
	hi := min(off+int64(len(p)), pageOff+c.ps)
	for x := lo; x < hi; x += c.bs {
		k := (x - pageOff) / c.bs
		dst := p[x-off : x-off+c.bs]
		if sl != nil && sl.valid&(1<<uint(k)) != 0 {
			copy(dst, c.bufs[s][k*c.bs:])
		} else {
			copy(dst, data[k*c.bs:])
		}
	}
	if sl != nil {
		sl.ref = true
	}
}

// allocSlot returns a free slot for page pg, evicting a clean page with the CLOCK algorithm, or
// -1 if every page is dirty, in write-back or pinned.
func (c *Cache) allocSlot(pg int64) int32 {
	c.allocMu.Lock()
	defer c.allocMu.Unlock()
	if n := len(c.freeSlots); n > 0 {
		s := c.freeSlots[n-1]
		c.freeSlots = c.freeSlots[:n-1]
		c.slots[s].page = pg
		return s
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
		return s
	}
	return -1
}

func (c *Cache) freeSlot(s int32) {
	c.allocMu.Lock()
	c.slots[s].page = -1
	c.freeSlots = append(c.freeSlots, s)
	c.allocMu.Unlock()
}

// WriteAt copies p into cache pages and marks them dirty. With FUA (or in write-through mode) the
// pages are written back before it returns.
func (c *Cache) WriteAt(ctx context.Context, p []byte, off int64, flags block.WriteFlags) error {
	if err := c.enter(); err != nil {
		return err
	}
	defer c.exit()
	if c.lim.ReadOnly {
		return fmt.Errorf("cache: write: %w", block.ErrReadOnly)
	}
	if err := block.CheckRange(c, off, int64(len(p))); err != nil {
		return err
	}
	if len(p) == 0 {
		return nil
	}
	if _, err := c.writeRange(ctx, p, off, true); err != nil {
		return err
	}
	if flags&block.FUA != 0 || c.cfg.Mode == WriteThrough {
		return c.syncRange(ctx, off, int64(len(p)), flags&block.FUA != 0)
	}
	return nil
}

// WriteCached implements block.CachedWriter: in write-back mode it copies p into cache pages and
// marks them dirty when that needs no waiting (dirty room and free pages are available), exactly
// as WriteAt without flags would. A later Flush covers it like any acknowledged write.
func (c *Cache) WriteCached(p []byte, off int64) bool {
	if c.cfg.Mode != WriteBack || c.lim.ReadOnly || len(p) == 0 {
		return false
	}
	if c.enter() != nil {
		return false
	}
	defer c.exit()
	if block.CheckRange(c, off, int64(len(p))) != nil {
		return false
	}
	ok, _ := c.writeRange(context.Background(), p, off, false)
	return ok
}

var _ block.CachedWriter = (*Cache)(nil)

// writeRange copies p (non-empty, in range) into cache pages and marks them dirty. A page that
// goes from clean to dirty needs a dirty reservation (the dirty limit); one already dirty needs
// none, so rewriting dirty data is never throttled. Reservations are taken for the whole request
// at once when they fit (one atomic operation, not one per page), and those not consumed are given
// back at the end; otherwise page by page as clean pages are met, waiting for write-back when wait
// is set. Without wait, writeRange returns false instead of waiting for dirty room or for a free
// slot (pages before that point may then hold their part of p already).
func (c *Cache) writeRange(ctx context.Context, p []byte, off int64, wait bool) (bool, error) {
	first, last := off/c.ps, (off+int64(len(p))-1)/c.ps
	var held int64 // reservations taken and not consumed by a clean→dirty page yet
	if n := last - first + 1; c.tryReserveN(n) {
		held = n
	}
	defer func() {
		if held > 0 {
			c.releaseDirtyN(held)
		}
	}()
	for pos := int64(0); pos < int64(len(p)); {
		page, pOff := (off+pos)/c.ps, (off+pos)%c.ps
		n := min(c.ps-pOff, int64(len(p))-pos)
		ok, err := c.writePage(ctx, page, pOff, p[pos:pos+n], &held, wait)
		if err != nil || !ok {
			return false, err
		}
		pos += n
	}
	return true, nil
}

// writePage copies data into page at pOff and marks it dirty. When the page goes from clean to
// dirty it consumes one of the caller's reservations (*held), or takes one if it can at once, or
// (wait) waits for one. ok is false when it would have to wait and wait is not set.
func (c *Cache) writePage(ctx context.Context, page, pOff int64, data []byte, held *int64, wait bool) (ok bool, err error) {
	mask := c.sectorMask(pOff, int64(len(data)))
	sh := c.shard(page)
	for {
		sh.mu.Lock()
		if s, ok := sh.m[page]; ok {
			sl := &c.slots[s]
			// The dirty state is decided and changed under dmu: a completing write-back
			// (which takes only dmu) may make the page clean at any moment before.
			c.dmu.Lock()
			fromHeld := false
			if sl.dirty == 0 {
				switch {
				case *held > 0:
					fromHeld = true
				case c.tryReserve():
				default:
					c.dmu.Unlock()
					sh.mu.Unlock()
					if !wait {
						return false, nil
					}
					if err := c.reserveDirty(ctx); err != nil {
						return false, err
					}
					*held++
					continue
				}
			}
			copy(c.bufs[s][pOff:], data)
			sl.valid |= mask
			sl.ref = true
			if c.markDirtyLocked(s, sl, page, mask) && fromHeld {
				*held--
			}
			c.dmu.Unlock()
			sh.mu.Unlock()
			return true, nil
		}
		sh.mu.Unlock()
		var s int32
		if wait {
			if s, err = c.allocSlotWait(ctx, page); err != nil {
				return false, err
			}
		} else if s = c.allocSlot(page); s < 0 {
			return false, nil
		}
		sh.mu.Lock()
		if _, ok := sh.m[page]; ok {
			sh.mu.Unlock()
			c.freeSlot(s)
			continue
		}
		sl := &c.slots[s]
		sl.valid, sl.pins, sl.ref, sl.filling = 0, 0, true, false
		sh.m[page] = s
		sh.mu.Unlock()
	}
}

// markDirtyLocked records a modification of slot s. It reports whether the page went from clean
// to dirty (consuming the caller's reservation). Called with the shard lock and dmu held.
func (c *Cache) markDirtyLocked(s int32, sl *slot, page int64, mask uint64) bool {
	sl.gen++
	if sl.dirty != 0 {
		sl.dirty |= mask
		return false
	}
	sl.dirty = mask
	c.seq++
	sl.dirtySeq = c.seq
	sl.dirtyAt = nanotime()
	sl.prev, sl.next = c.tail, -1
	if c.tail >= 0 {
		c.slots[c.tail].next = s
	} else {
		c.head = s
	}
	c.tail = s
	c.dirtyIdx.put(page, s)
	c.dirtyPages.Add(1)
	sl.busy.Store(1)
	// Wake a flusher when there is enough to write, or when this is the only dirty page: the
	// flushers may all be idle without an age timer armed.
	if c.head == s || c.dirtyPages.Load()-c.inflightPages >= c.cfg.lowPages {
		c.doKick()
	}
	return true
}

// cleanLocked removes a page that has no dirty sectors left from the dirty structures. Called
// with dmu held.
func (c *Cache) cleanLocked(s int32, sl *slot, page int64) {
	if sl.prev >= 0 {
		c.slots[sl.prev].next = sl.next
	} else {
		c.head = sl.next
	}
	if sl.next >= 0 {
		c.slots[sl.next].prev = sl.prev
	} else {
		c.tail = sl.prev
	}
	sl.prev, sl.next = -1, -1
	c.dirtyIdx.del(page)
	c.dirtyPages.Add(-1)
	c.reserved.Add(-1)
	if !sl.inflight {
		sl.busy.Store(0)
	}
}

func (c *Cache) tryReserve() bool { return c.tryReserveN(1) }

// tryReserveN takes n dirty-page reservations if all of them fit under the limit.
func (c *Cache) tryReserveN(n int64) bool {
	for {
		r := c.reserved.Load()
		if r+n > c.cfg.limitPages {
			return false
		}
		if c.reserved.CompareAndSwap(r, r+n) {
			return true
		}
	}
}

// releaseDirtyN gives back n reservations that were not consumed.
func (c *Cache) releaseDirtyN(n int64) {
	c.reserved.Add(-n)
	if c.throttled.Load() > 0 {
		c.progress.broadcast()
	}
}

// reserveDirty waits until one more dirty page fits under the limit.
func (c *Cache) reserveDirty(ctx context.Context) error {
	if c.tryReserve() {
		return nil
	}
	c.st.throttledWrites.Add(1)
	c.throttled.Add(1)
	defer c.throttled.Add(-1)
	for {
		ch := c.progress.wait()
		if c.tryReserve() {
			return nil
		}
		c.doKick()
		select {
		case <-ch:
		case <-ctx.Done():
			return fmt.Errorf("cache: waiting for dirty room: %w", ctx.Err())
		case <-c.stop:
			return fmt.Errorf("cache: %w", block.ErrClosed)
		}
	}
}

func (c *Cache) allocSlotWait(ctx context.Context, page int64) (int32, error) {
	for {
		ch := c.progress.wait()
		if s := c.allocSlot(page); s >= 0 {
			return s, nil
		}
		c.doKick()
		select {
		case <-ch:
		case <-ctx.Done():
			return -1, fmt.Errorf("cache: waiting for a free page: %w", ctx.Err())
		case <-c.stop:
			return -1, fmt.Errorf("cache: %w", block.ErrClosed)
		}
	}
}

// syncRange writes back every dirty page in [off, off+length) and returns when those write-backs
// completed (with FUA when fua is set, emulated with a backend Flush if need be).
func (c *Cache) syncRange(ctx context.Context, off, length int64, fua bool) error {
	first, last := off/c.ps, (off+length-1)/c.ps
	j := c.jobs.Get().(*job)
	defer c.jobs.Put(j)
	var flags block.WriteFlags
	needFlush := false
	if fua {
		if c.lim.CanFUA {
			flags = block.FUA
		} else {
			needFlush = c.lim.CanFlush
		}
	}
	// Bytes of the range that another write-back (without FUA) carried to the backend are not
	// durable until the backend flushes; count what our own jobs covered.
	rangeEnd := off + length
	covered := int64(0)
	pg, sec := first, 0
	for pg <= last {
		ch := c.progress.wait()
		c.dmu.Lock()
		s, ok := c.dirtyIdx.get(pg)
		if !ok || c.slots[s].dirty>>uint(sec) == 0 {
			c.dmu.Unlock()
			pg, sec = pg+1, 0
			continue
		}
		if c.slots[s].inflight || c.blockedLocked(pg) {
			c.dmu.Unlock()
			c.doKick()
			select {
			case <-ch:
				continue
			case <-ctx.Done():
				return fmt.Errorf("cache: waiting for write-back: %w", ctx.Err())
			case <-c.stop:
				return fmt.Errorf("cache: %w", block.ErrClosed)
			}
		}
		c.buildJobLocked(j, s, pg, sec, first, last)
		c.dmu.Unlock()
		cursor := max(pg*c.ps+int64(sec)*c.bs, off)
		if err := c.runJob(ctx, j, flags, false); err != nil {
			return err
		}
		if lo, hi := max(j.off, cursor), min(j.end, rangeEnd); hi > lo {
			covered += hi - lo
		}
		pg, sec = j.endPage, j.endSec
		if sec == c.cfg.spp {
			pg, sec = pg+1, 0
		}
	}
	if fua && covered < length && c.lim.CanFlush {
		needFlush = true
	}
	if needFlush {
		if err := c.be.Flush(ctx); err != nil {
			return fmt.Errorf("cache: flush for FUA emulation: %w", err)
		}
	}
	return nil
}

// Flush returns once every write acknowledged before it was called is on the backend and the
// backend's own Flush succeeded. See the package comment.
func (c *Cache) Flush(ctx context.Context) error {
	if err := c.enter(); err != nil {
		return err
	}
	defer c.exit()
	err := c.flush(ctx)
	c.st.flushes.Add(1)
	if err != nil {
		c.st.flushErrors.Add(1)
	}
	return err
}

func (c *Cache) flush(ctx context.Context) error {
	c.dmu.Lock()
	snap := c.seq
	startJobs := c.jobSeq
	if snap > c.flushTarget {
		c.flushTarget = snap
	}
	c.backoffUntil = time.Time{} // a Flush retries at once
	c.dmu.Unlock()
	c.doKick()
	for {
		ch := c.progress.wait()
		c.dmu.Lock()
		if c.failSeq > startJobs {
			err := c.lastErr
			c.dmu.Unlock()
			return &writeBackError{cause: err}
		}
		done := c.head < 0 || c.slots[c.head].dirtySeq > snap
		c.dmu.Unlock()
		if done {
			break
		}
		select {
		case <-ch:
		case <-ctx.Done():
			return fmt.Errorf("cache: flush: %w", ctx.Err())
		case <-c.stop:
			return fmt.Errorf("cache: flush: %w", block.ErrClosed)
		}
	}
	if c.lim.CanFlush {
		if err := c.be.Flush(ctx); err != nil {
			return fmt.Errorf("cache: backend flush: %w", err)
		}
	}
	return nil
}

// writeBackError reports a failed write-back at Flush. It satisfies block.ErrIO and unwraps to
// the backend's error.
type writeBackError struct{ cause error }

func (e *writeBackError) Error() string {
	return "cache: flush: an earlier write-back failed (the data is still cached and retried): " + e.cause.Error()
}
func (e *writeBackError) Is(target error) bool { return target == block.ErrIO }
func (e *writeBackError) Unwrap() error        { return e.cause }

// Discard drops cached data in the range and discards it on the backend.
func (c *Cache) Discard(ctx context.Context, off, length int64) error {
	if err := c.enter(); err != nil {
		return err
	}
	defer c.exit()
	if err := block.CheckRange(c, off, length); err != nil {
		return err
	}
	if c.lim.ReadOnly {
		return fmt.Errorf("cache: discard: %w", block.ErrReadOnly)
	}
	if !c.lim.CanDiscard {
		return fmt.Errorf("cache: discard: %w", block.ErrNotSupported)
	}
	if length == 0 {
		return nil
	}
	return c.directOp(ctx, off, length, func(ctx context.Context, o, n int64) error {
		return c.be.Discard(ctx, o, n)
	}, c.lim.MaxDiscard)
}

// WriteZeroes makes the range read back as zeroes: on the backend directly when it can, otherwise
// by writing zero pages through the cache.
func (c *Cache) WriteZeroes(ctx context.Context, off, length int64, flags block.ZeroFlags) error {
	if err := c.enter(); err != nil {
		return err
	}
	defer c.exit()
	if err := block.CheckRange(c, off, length); err != nil {
		return err
	}
	if c.lim.ReadOnly {
		return fmt.Errorf("cache: write zeroes: %w", block.ErrReadOnly)
	}
	if length == 0 {
		return nil
	}
	if !c.lim.CanWriteZeroes {
		if flags&block.FastOnly != 0 {
			return fmt.Errorf("cache: fast zero: %w", block.ErrNotSupported)
		}
		return c.writeZeroPages(ctx, off, length, flags&block.ZeroFUA != 0)
	}
	if flags&block.FastOnly != 0 && !c.lim.CanFastZero {
		return fmt.Errorf("cache: fast zero: %w", block.ErrNotSupported)
	}
	return c.directOp(ctx, off, length, func(ctx context.Context, o, n int64) error {
		return c.be.WriteZeroes(ctx, o, n, flags)
	}, c.lim.MaxWriteZeroes)
}

func (c *Cache) writeZeroPages(ctx context.Context, off, length int64, fua bool) error {
	c.zeroOnce.Do(func() { c.zeroBuf = make([]byte, c.cfg.maxJob) })
	var flags block.WriteFlags
	if fua {
		flags = block.FUA
	}
	for length > 0 {
		n := min(length, int64(len(c.zeroBuf)))
		if err := c.WriteAt(ctx, c.zeroBuf[:n], off, flags); err != nil {
			return err
		}
		off += n
		length -= n
	}
	return nil
}

// directOp runs a backend operation that bypasses the cache pages after invalidating them and
// waiting for write-backs of the range already in flight (see the package comment).
func (c *Cache) directOp(ctx context.Context, off, length int64, op func(context.Context, int64, int64) error, maxLen int64) error {
	c.directMu.Lock()
	c.direct = append(c.direct, directRange{off, off + length})
	c.directActive.Add(1)
	c.directMu.Unlock()
	defer func() {
		c.directMu.Lock()
		for i, r := range c.direct {
			if r.off == off && r.end == off+length {
				c.direct = append(c.direct[:i], c.direct[i+1:]...)
				break
			}
		}
		c.directActive.Add(-1)
		c.directMu.Unlock()
		c.progress.broadcast()
		c.doKick()
	}()
	c.invalidate(off, length, true)
	for {
		ch := c.progress.wait()
		if !c.invalidate(off, length, false) {
			break
		}
		select {
		case <-ch:
		case <-ctx.Done():
			return fmt.Errorf("cache: waiting for write-back before discard: %w", ctx.Err())
		case <-c.stop:
			return fmt.Errorf("cache: %w", block.ErrClosed)
		}
	}
	for length > 0 {
		n := length
		if maxLen > 0 && n > maxLen {
			n = maxLen / c.bs * c.bs
		}
		if err := op(ctx, off, n); err != nil {
			return fmt.Errorf("cache: [%d, +%d): %w", off, n, err)
		}
		off += n
		length -= n
	}
	return nil
}

// invalidate drops (when drop is set) the cached and dirty sectors of [off, off+length) and
// reports whether a page of the range has a write-back in flight.
func (c *Cache) invalidate(off, length int64, drop bool) (inflight bool) {
	first, last := off/c.ps, (off+length-1)/c.ps
	visit := func(sh *shard, pg int64, s int32) {
		pageOff := pg * c.ps
		lo := max(off, pageOff) - pageOff
		hi := min(off+length, pageOff+c.ps) - pageOff
		mask := c.sectorMask(lo, hi-lo)
		sl := &c.slots[s]
		if drop {
			sl.valid &^= mask
			sl.invalSeq++
		}
		c.dmu.Lock()
		if drop && sl.dirty&mask != 0 {
			sl.gen++
			sl.dirty &^= mask
			if sl.dirty == 0 {
				c.cleanLocked(s, sl, pg)
			}
		}
		if sl.inflight {
			inflight = true
		}
		c.dmu.Unlock()
	}
	if last-first+1 <= int64(len(c.slots)) {
		for pg := first; pg <= last; pg++ {
			sh := c.shard(pg)
			sh.mu.Lock()
			if s, ok := sh.m[pg]; ok {
				visit(sh, pg, s)
			}
			sh.mu.Unlock()
		}
		return inflight
	}
	for i := range c.shards {
		sh := &c.shards[i]
		sh.mu.Lock()
		for pg, s := range sh.m {
			if pg >= first && pg <= last {
				visit(sh, pg, s)
			}
		}
		sh.mu.Unlock()
	}
	return inflight
}

// directOverlaps reports whether a direct operation is in flight over [off, off+n).
func (c *Cache) directOverlaps(off, n int64) bool {
	if c.directActive.Load() == 0 {
		return false
	}
	c.directMu.Lock()
	defer c.directMu.Unlock()
	for _, r := range c.direct {
		if r.off < off+n && off < r.end {
			return true
		}
	}
	return false
}

// blockedLocked reports whether write-back of page pg must wait for a direct operation.
func (c *Cache) blockedLocked(pg int64) bool {
	return c.directOverlaps(pg*c.ps, c.ps)
}

// Stats returns a snapshot of the counters.
func (c *Cache) Stats() Stats {
	c.allocMu.Lock()
	cached := int64(len(c.slots)-len(c.freeSlots)) * c.ps
	c.allocMu.Unlock()
	return Stats{
		Mode:            c.cfg.Mode.String(),
		SizeBytes:       int64(len(c.slots)) * c.ps,
		CachedBytes:     cached,
		DirtyBytes:      c.dirtyPages.Load() * c.ps,
		DirtyLimitBytes: c.cfg.limitPages * c.ps,
		Hits:            c.hits(),
		Misses:          c.st.misses.Load(),
		ReadAheadBytes:  c.st.readAhead.Load(),
		WriteBackBytes:  c.st.wbBytes.Load(),
		WriteBackErrors: c.st.wbErrors.Load(),
		Flushes:         c.st.flushes.Load(),
		FlushErrors:     c.st.flushErrors.Load(),
		ThrottledWrites: c.st.throttledWrites.Load(),
		ThrottledNow:    int(c.throttled.Load()),
		Evictions:       c.st.evictions.Load(),
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

// Close flushes every dirty page, stops the flusher, releases the page memory and closes the
// backend. It reports the flush failure if there was one (the backend is closed regardless).
func (c *Cache) Close() error {
	return c.CloseContext(context.Background())
}

// CloseContext is Close with a deadline for the final flush.
func (c *Cache) CloseContext(ctx context.Context) error {
	if c.closed.Load() {
		return fmt.Errorf("cache: %w", block.ErrClosed)
	}
	c.dmu.Lock()
	c.closing = true
	c.dmu.Unlock()
	ferr := c.flush(ctx)
	if ferr != nil {
		c.log.Error("final flush failed; dirty data is lost", zap.Error(ferr),
			zap.String("dirty", humanize.IBytes(uint64(c.DirtyBytes()))))
	}
	c.shutdown()
	return errors.Join(ferr, c.be.Close())
}

// shutdown stops the flusher and releases page memory without flushing. It is also the
// "crash" of the model tests.
func (c *Cache) shutdown() {
	if !c.closed.CompareAndSwap(false, true) {
		return
	}
	close(c.stop) // wakes throttled writers and waiting fills
	c.bgCancel()
	c.wg.Wait()
	for {
		ch := c.progress.wait()
		if c.ops.Load() == 0 {
			break
		}
		<-ch
	}
	c.releasePages()
}

func nanotime() int64 { return time.Since(epoch).Nanoseconds() }

var epoch = time.Now()
