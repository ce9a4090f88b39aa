package cache

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/dustin/go-humanize"
	"go.uber.org/zap"

	"github.com/iser-blk/iser-blk/block"
	"github.com/iser-blk/iser-blk/pool"
)

// Cache is a caching block.Device. Create it with New or Wrap.
type Cache struct {
	be     block.Device
	sub    block.Submitter          // be's asynchronous path, or nil (submit.go)
	subLim block.SubmitWriteLimiter // the largest write sub takes, when it says (submit.go)
	psub   block.PipeSubmitter      // be's spliced reads, or nil (submitaround.go)
	cw     block.CachedWriter       // be's non-waiting write (the --cache-dev log), or nil (writethrough.go)
	lim    block.Limits             // of the backend
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
	nextFresh int32 // slots from here on were never handed out (allocSlot)
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
	directSeq    uint64 // tokens of direct operations (registerDirect)
	directActive atomic.Int32

	reserved   atomic.Int64 // dirty pages plus reservations; <= limitPages
	dirtyPages atomic.Int64
	// dirtyRegions counts the dirty pages of each region of the device (regionShift bytes,
	// hashed onto nRegions counters), so that a read-around finds a range without dirty pages
	// without taking a lock (readaround.go). Changed under dmu with dirtyPages.
	dirtyRegions [nRegions]atomic.Int32
	throttled    atomic.Int32 // writers waiting for room now
	// freshInstalls counts the asynchronous misses installing a fresh page on a goroutine of
	// their own (asyncFill.Complete).
	freshInstalls atomic.Int32

	progress    notifier
	kick        chan struct{}
	stop        chan struct{}
	wg          sync.WaitGroup
	bgCtx       context.Context
	bgCancel    context.CancelFunc
	closed      atomic.Bool  // set by shutdown: calls fail with ErrClosed
	closeMu     sync.Mutex   // serialises CloseContext
	closeDone   bool         // guarded by closeMu: a Close has run (or is running under closeMu)
	ops         atomic.Int64 // calls in progress; page memory is released only when none is
	jobs        sync.Pool
	fills       sync.Pool // *asyncFill (submit.go)
	arounds     sync.Pool // *asyncAround (submit.go)
	readArounds sync.Pool // *asyncReadAround (submitaround.go)

	wstreams streamSet // sequential write streams, for the write-around cutoff (writearound.go)
	rstreams streamSet // sequential read misses, for read-ahead and the read-around cutoff (streams.go)
	zeroOnce sync.Once
	zeroBuf  []byte // for WriteZeroes emulation

	st counters
}

type counters struct {
	misses, readAhead, wbBytes, wbErrors, writeAround, readAround, overlaid, supersededClean, flushes, flushErrors, throttledWrites, evictions atomic.Uint64
	throttledNanos                                                                                                                             atomic.Int64              // time writers waited for dirty room (reserveDirty)
	lastWBFailure                                                                                                                              atomic.Pointer[wbFailure] // the latest write-back failure, nil before the first
}

// wbFailure is a failed write-back as the status reports it. One is allocated per failure (the
// error string is built only then), none per I/O.
type wbFailure struct {
	err string
	at  time.Time
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
	c.initAsync(dev)
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

// initAsync sets up the pools of per-request state and finds the backend's asynchronous paths.
func (c *Cache) initAsync(dev block.Device) {
	c.jobs.New = func() any { return c.newJob() }
	c.fills.New = func() any { return new(asyncFill) }
	c.arounds.New = func() any { return new(asyncAround) }
	c.readArounds.New = func() any { return new(asyncReadAround) }
	c.sub, _ = dev.(block.Submitter)
	c.cw, _ = dev.(block.CachedWriter)
	if c.sub != nil {
		c.psub, _ = dev.(block.PipeSubmitter)
		c.subLim, _ = dev.(block.SubmitWriteLimiter)
	}
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

// shard is the shard of page: runs of shardRun consecutive pages, spread round-robin over the
// shards.
func (c *Cache) shard(page int64) *shard { return &c.shards[uint64(page)/shardRun%nShards] }

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

// Close flushes every dirty page, stops the flusher, releases the page memory and closes the
// backend. It reports the flush failure if there was one (the backend is closed regardless). A
// second Close returns nil (see block.Device).
func (c *Cache) Close() error {
	return c.CloseContext(context.Background())
}

// CloseContext is Close with a deadline for the final flush. Callers are serialised: the first
// does the work, and one that comes during or after it waits for it and returns nil, so the
// backend is closed exactly once and no Close returns before the cache is closed.
func (c *Cache) CloseContext(ctx context.Context) error { return c.closeContext(ctx, false) }

// closeContext is CloseContext; abandon closes a backend that can be abandoned (block.Abandoner:
// a persistent log below, which then keeps its data) with Abandon instead of Close.
func (c *Cache) closeContext(ctx context.Context, abandon bool) error {
	closeBelow := c.be.Close
	if a, ok := c.be.(block.Abandoner); ok && abandon {
		closeBelow = a.Abandon
	}
	c.closeMu.Lock()
	defer c.closeMu.Unlock()
	if c.closeDone {
		return nil
	}
	c.closeDone = true
	if c.closed.Load() { // stopped without a flush (the model tests' crash): only the backend is left
		return closeBelow()
	}
	c.dmu.Lock()
	c.closing = true
	c.dmu.Unlock()
	var ferr error
	if !abandon {
		if ferr = c.flush(ctx); ferr != nil {
			c.log.Error("final flush failed; dirty data is lost", zap.Error(ferr),
				zap.String("dirty", humanize.IBytes(uint64(c.DirtyBytes()))))
		}
	}
	c.shutdown()
	return errors.Join(ferr, closeBelow())
}

// Abandon closes the cache without another write-back (block.Abandoner): after a final flush
// that failed or was aborted, waiting for the same write-back again would only delay the
// logout. Dirty data is lost, as the caller has already reported, so Abandon logs nothing of its
// own. A backend that can be abandoned too is (a persistent log keeps what it holds for the next
// attach).
func (c *Cache) Abandon() error { return c.closeContext(context.Background(), true) }

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
