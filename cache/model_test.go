package cache

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"flag"
	"fmt"
	"math/rand/v2"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/iser-blk/iser-blk/block"
	"github.com/iser-blk/iser-blk/cache/internal/fakedev"
	"github.com/iser-blk/iser-blk/pool"
)

// The model test (acceptance item 1) drives a cache with concurrent workers and checks every
// result against an oracle.
//
// Each worker owns a set of stripes (runs of blocks). Stripes are not page aligned, so pages are
// shared between workers and the cache sees concurrent traffic on every page, but each block
// has one writer, which makes its history a sequence: vers[b] lists the tags written to block b
// in order (tag 0 = zeroes). floor[b] is the index of the oldest version that must still be on
// the backend after a crash: it rises when a Flush that started after the version was
// acknowledged succeeds, and at the acknowledgement of a FUA write.
//
// Checks:
//   - every read returns the latest acknowledged version of each block (whole block content);
//   - a FUA write (and a write-zeroes with ZeroFUA) is on the backend's durable image at ack;
//   - at a quiesced flush point the durable image holds exactly the latest versions;
//   - after a simulated crash (the cache dropped without flushing, then the backend's own
//     volatile cache lost) every block holds a version at or after its floor;
//   - the backend never saw two overlapping writes in flight at once.

const (
	modelBS      = 512
	modelStripe  = 20             // blocks per stripe: 10 KiB, deliberately not page aligned
	modelDevSize = 8200 * modelBS // 410 stripes; the last page is cut short
)

type modelBlock struct {
	vers  []uint64 // tags in write order
	eps   []uint64 // flush epoch current when each version was recorded (after its ack)
	floor int      // raised by FUA acks; flushes raise the floor lazily through durableEpoch
}

// floorIndex is the oldest version that must survive a crash: the newest of the explicit floor
// and the last version recorded before the start of a successful flush.
func (mb *modelBlock) floorIndex(durableEpoch uint64) int {
	f := mb.floor
	for i := len(mb.vers) - 1; i > f; i-- {
		if mb.eps[i] < durableEpoch {
			return i
		}
	}
	return f
}

func (mb *modelBlock) add(tag, epoch uint64) {
	mb.vers = append(mb.vers, tag)
	mb.eps = append(mb.eps, epoch)
}

type model struct {
	t       *testing.T
	dev     *fakedev.Dev
	be      block.Device // what the caches wrap: dev, or dev with a Submitter (submitDev)
	cfg     Config
	workers int
	mu      []sync.Mutex // per worker: guards the blocks it owns
	blocks  []modelBlock
	tags    atomic.Uint64

	// Flush epochs: a flush takes epoch e = flushEpoch+1 before it starts; every version recorded
	// before that has eps < e. When the flush succeeds, durableEpoch rises to e.
	flushEpoch   atomic.Uint64
	durableEpoch atomic.Uint64

	cmu sync.RWMutex // guards c (replaced at crashes)
	c   *Cache

	failRate float64
	rng      *rand.Rand // used under the fake's lock (fault hook) only

	ops, flushes, crashes, fuas, faults atomic.Int64
	submitted, submittedW               atomic.Int64 // reads and writes started with SubmitAt
	cachedLarge                         atomic.Int64 // reads of ReadAround bytes or more ReadCached served (backend without a Submitter)
	total                               Stats        // of the caches dropped at crashes
}

func (m *model) addStats(st Stats) {
	m.total.Hits += st.Hits
	m.total.Misses += st.Misses
	m.total.Evictions += st.Evictions
	m.total.ThrottledWrites += st.ThrottledWrites
	m.total.WriteBackErrors += st.WriteBackErrors
	m.total.WriteBackBytes += st.WriteBackBytes
	m.total.WriteAroundBytes += st.WriteAroundBytes
	m.total.ReadAroundBytes += st.ReadAroundBytes
	m.total.OverlaidPages += st.OverlaidPages
	m.total.SupersededCleaned += st.SupersededCleaned
}

// patterns[k] is the body of a block whose tag has byte(tag*31) == k (precomputed so that
// checks compare memory instead of looping over bytes, which matters under -race).
var patterns = func() (p [256][modelBS]byte) {
	for k := range p {
		for i := 8; i < modelBS; i++ {
			p[k][i] = byte(k) ^ byte(i)
		}
	}
	return p
}()

var zeroBlock [modelBS]byte

func blockContent(tag uint64, dst []byte) {
	if tag == 0 {
		clear(dst)
		return
	}
	copy(dst, patterns[byte(tag*31)][:])
	binary.LittleEndian.PutUint64(dst, tag)
}

// parseBlock returns the tag a block holds, or an error if it is not a well-formed block.
func parseBlock(b []byte) (uint64, error) {
	tag := binary.LittleEndian.Uint64(b)
	if tag == 0 {
		if !bytes.Equal(b, zeroBlock[:]) {
			return 0, errors.New("torn block: zero tag with non-zero data")
		}
		return 0, nil
	}
	if !bytes.Equal(b[8:], patterns[byte(tag*31)][8:]) {
		return tag, fmt.Errorf("torn block: tag %d with foreign data", tag)
	}
	return tag, nil
}

func (m *model) cache() *Cache {
	m.cmu.RLock()
	defer m.cmu.RUnlock()
	return m.c
}

func newModel(t *testing.T, seed uint64, workers int, failRate float64) *model {
	lim := block.Limits{
		LogicalBlockSize: modelBS, PhysicalBlockSize: 4096, MaxTransfer: 64 << 10,
		CanFlush: true, CanFUA: seed%3 != 0, CanDiscard: true, CanWriteZeroes: seed%4 != 1, DiscardZeroes: true,
		MaxDiscard: 8 << 10, VolatileCache: true,
	}
	m := &model{
		t:        t,
		dev:      fakedev.New(modelDevSize, lim),
		workers:  workers,
		mu:       make([]sync.Mutex, workers),
		blocks:   make([]modelBlock, modelDevSize/modelBS),
		failRate: failRate,
		rng:      rand.New(rand.NewPCG(seed, 99)),
		cfg: Config{
			Size:        256 << 10, // 64 pages for a 4 MiB device: constant eviction
			DirtyLimit:  96 << 10,
			LowWater:    32 << 10,
			MaxDirtyAge: 2 * time.Millisecond,
			Workers:     3,
			ReadAhead:   16 << 10,
		},
	}
	if seed%5 == 2 {
		m.cfg.Mode = WriteThrough
	}
	if seed%2 == 0 {
		// About half of the writes (12 to 20 blocks) go around the pages, over pages that other
		// workers' blocks keep dirty and that this worker's smaller writes left dirty.
		m.cfg.WriteAround = 12 * modelBS
	} else {
		m.cfg.WriteAround = -1
	}
	if seed%4 != 3 {
		// Reads of 12 blocks and more go around the pages, with the dirty pages of their range
		// copied over what the backend returned: pages other workers keep dirty, and this
		// worker's smaller writes left dirty, while they write, write back, flush and discard.
		m.cfg.ReadAround = 12 * modelBS
	} else {
		m.cfg.ReadAround = -1
	}
	for i := range m.blocks {
		m.blocks[i].add(0, 0)
	}
	m.dev.SetFault(func(op fakedev.Op) error {
		// Reads fail too (a read-around or a fill that fails must return the error and leave the
		// cache as it was); less often, so that a read's retries succeed.
		rate := m.failRate
		if op.Kind == fakedev.Read {
			rate /= 4
		}
		if rate > 0 && (op.Kind == fakedev.Write || op.Kind == fakedev.Flush || op.Kind == fakedev.Read) && m.rng.Float64() < rate {
			m.faults.Add(1)
			return fmt.Errorf("injected fault: %w", block.ErrIO)
		}
		return nil
	})
	m.dev.SetBefore(func(fakedev.Op) { runtime.Gosched() })
	m.be = m.dev
	if seed%4 != 3 {
		// Reads of one page take the asynchronous miss (SubmitAt), and writes that go around
		// the pages the asynchronous write-around, completed on goroutines of the device's own
		// while the other workers write, flush and discard over the same pages.
		io, err := pool.New(pool.Config{MaxBytes: 4 << 20, MaxClass: 1 << 20})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = io.Close() })
		m.cfg.IOPool = io
		sd := &submitDev{Device: m.dev, async: true}
		if seed%4 == 2 {
			// The backend takes writes of up to 16 blocks asynchronously (as iSCSI/TCP takes
			// only immediate data): write-arounds of 17 blocks and more decline SubmitAt
			// before touching the pages and take WriteAt.
			sd.maxWrite = 16 * modelBS
		}
		m.be = sd
	}
	c, err := New(m.be, m.cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	m.c = c
	return m
}

// retry runs op until it succeeds: injected faults fail operations at random, and the oracle
// only records acknowledged operations.
func retry(op func() error) error {
	var err error
	for i := 0; i < 200; i++ {
		if err = op(); err == nil {
			return nil
		}
		if !errors.Is(err, block.ErrIO) {
			return err
		}
	}
	return fmt.Errorf("still failing after 200 attempts: %w", err)
}

func (m *model) worker(ctx context.Context, w int, rng *rand.Rand, nops int) error {
	stripes := (len(m.blocks) / modelStripe)
	mine := make([]int, 0, stripes/m.workers)
	for s := w; s < stripes; s += m.workers {
		mine = append(mine, s)
	}
	hot := mine[:max(1, len(mine)/8)]
	buf := make([]byte, modelStripe*modelBS)
	for i := 0; i < nops; i++ {
		m.ops.Add(1)
		var s int
		if rng.IntN(10) < 7 {
			s = hot[rng.IntN(len(hot))]
		} else {
			s = mine[rng.IntN(len(mine))]
		}
		first := s*modelStripe + rng.IntN(modelStripe)
		n := 1 + rng.IntN(s*modelStripe+modelStripe-first)
		off, length := int64(first)*modelBS, int64(n)*modelBS
		c := m.cache()
		r := rng.IntN(100)
		if r >= 88 && r < 97 {
			r = 0 // 49 % reads, 3 % flushes
		}
		switch {
		case r < 40: // read
			p := buf[:length]
			if err := retry(func() error { return m.read(ctx, c, p, off) }); err != nil {
				return fmt.Errorf("read [%d,+%d): %w", off, length, err)
			}
			m.mu[w].Lock()
			for k := 0; k < n; k++ {
				b := first + k
				tag, err := parseBlock(p[k*modelBS : (k+1)*modelBS])
				want := m.blocks[b].vers[len(m.blocks[b].vers)-1]
				if err != nil || tag != want {
					m.mu[w].Unlock()
					return fmt.Errorf("read of block %d returned tag %d (%v), want the latest acknowledged %d", b, tag, err, want)
				}
			}
			m.mu[w].Unlock()
		case r < 80: // write, sometimes FUA
			fua := r >= 72
			tags := make([]uint64, n)
			for k := range tags {
				tags[k] = m.tags.Add(1)
				blockContent(tags[k], buf[k*modelBS:(k+1)*modelBS])
			}
			var flags block.WriteFlags
			if fua {
				flags = block.FUA
			}
			// Half of the plain writes take the frontends' non-waiting path first (what the NBD
			// reader does), falling back to WriteAt as a frontend must.
			if fua || r%2 == 0 || !c.WriteCached(buf[:length], off) {
				if err := retry(func() error { return m.write(ctx, c, buf[:length], off, flags) }); err != nil {
					return fmt.Errorf("write [%d,+%d): %w", off, length, err)
				}
			}
			m.mu[w].Lock()
			ep := m.flushEpoch.Load()
			for k, tag := range tags {
				mb := &m.blocks[first+k]
				mb.add(tag, ep)
				if fua {
					mb.floor = len(mb.vers) - 1
				}
			}
			m.mu[w].Unlock()
			if fua {
				m.fuas.Add(1)
				if err := m.checkDurable(first, tags); err != nil {
					return fmt.Errorf("FUA write: %w", err)
				}
			}
		case r < 88: // discard or write-zeroes
			zfua := false
			var err error
			if r < 84 {
				err = retry(func() error { return c.Discard(ctx, off, length) })
			} else {
				var flags block.ZeroFlags
				if zfua = r >= 86; zfua {
					flags = block.ZeroFUA
				}
				err = retry(func() error { return c.WriteZeroes(ctx, off, length, flags) })
			}
			if err != nil {
				return fmt.Errorf("discard/zero [%d,+%d): %w", off, length, err)
			}
			m.mu[w].Lock()
			ep := m.flushEpoch.Load()
			for k := 0; k < n; k++ {
				mb := &m.blocks[first+k]
				mb.add(0, ep)
				if zfua {
					mb.floor = len(mb.vers) - 1
				}
			}
			m.mu[w].Unlock()
			if zfua {
				if err := m.checkDurable(first, make([]uint64, n)); err != nil {
					return fmt.Errorf("FUA write-zeroes: %w", err)
				}
			}
		default: // flush
			if err := m.flush(ctx, c); err != nil && !errors.Is(err, block.ErrIO) {
				return fmt.Errorf("flush: %w", err)
			}
		}
	}
	return nil
}

// read reads p at off as the NBD frontend does: from the pages when ReadCached serves it, else
// through SubmitAt when the cache takes it (a read within one page, or a large one around the
// pages), else ReadAt.
func (m *model) read(ctx context.Context, c *Cache, p []byte, off int64) error {
	if c.ReadCached(p, off) {
		if c.largeRead(len(p)) {
			m.cachedLarge.Add(1)
		}
		return nil
	}
	done := make(chanDone, 1)
	if c.SubmitAt(ctx, p, off, false, 0, done) {
		m.submitted.Add(1)
		return <-done
	}
	return c.ReadAt(ctx, p, off)
}

// write writes p at off as the NBD frontend does after WriteCached declined: through SubmitAt when
// the cache takes it (a write that goes around the pages), else WriteAt.
func (m *model) write(ctx context.Context, c *Cache, p []byte, off int64, flags block.WriteFlags) error {
	done := make(chanDone, 1)
	if c.SubmitAt(ctx, p, off, true, flags, done) {
		m.submittedW.Add(1)
		return <-done
	}
	return c.WriteAt(ctx, p, off, flags)
}

// checkDurable asserts that blocks first.. hold tags on the backend's durable image.
func (m *model) checkDurable(first int, tags []uint64) error {
	img := m.dev.Durable(int64(first)*modelBS, int64(len(tags))*modelBS)
	for k, want := range tags {
		tag, err := parseBlock(img[k*modelBS : (k+1)*modelBS])
		if err != nil || tag != want {
			return fmt.Errorf("block %d: durable tag %d (%v) at ack, want %d", first+k, tag, err, want)
		}
	}
	return nil
}

// flush takes a new epoch, flushes, and on success makes every version recorded before the
// epoch began part of the crash floor.
func (m *model) flush(ctx context.Context, c *Cache) error {
	e := m.flushEpoch.Add(1)
	if err := c.Flush(ctx); err != nil {
		return err
	}
	m.flushes.Add(1)
	for {
		d := m.durableEpoch.Load()
		if d >= e || m.durableEpoch.CompareAndSwap(d, e) {
			return nil
		}
	}
}

// flushAndCheckExact runs with no worker active: after a successful flush the durable image must
// hold exactly the latest versions.
func (m *model) flushAndCheckExact(ctx context.Context) error {
	c := m.cache()
	if err := retry(func() error { return m.flush(ctx, c) }); err != nil {
		return err
	}
	if d := c.DirtyBytes(); d != 0 {
		return fmt.Errorf("%d dirty bytes after a quiesced flush", d)
	}
	img := m.dev.Durable(0, modelDevSize)
	for b := range m.blocks {
		tag, err := parseBlock(img[b*modelBS : (b+1)*modelBS])
		want := m.blocks[b].vers[len(m.blocks[b].vers)-1]
		if err != nil || tag != want {
			return fmt.Errorf("after flush block %d holds %d (%v), want %d", b, tag, err, want)
		}
	}
	return nil
}

// crashAndCheck drops the cache without flushing, loses the backend's volatile cache, checks
// the floors and starts a fresh cache on what survived.
func (m *model) crashAndCheck() error {
	m.cmu.Lock()
	defer m.cmu.Unlock()
	m.addStats(m.c.Stats())
	m.c.shutdown()
	m.crashes.Add(1)
	m.dev.Crash()
	img := m.dev.Durable(0, modelDevSize)
	for b := range m.blocks {
		tag, err := parseBlock(img[b*modelBS : (b+1)*modelBS])
		if err != nil {
			return fmt.Errorf("after crash block %d: %w", b, err)
		}
		mb := &m.blocks[b]
		floor := mb.floorIndex(m.durableEpoch.Load())
		ok := false
		for _, v := range mb.vers[floor:] {
			if v == tag {
				ok = true
				break
			}
		}
		if !ok {
			return fmt.Errorf("after crash block %d holds %d; allowed: versions %v from index %d", b, tag, mb.vers, floor)
		}
		mb.vers, mb.eps, mb.floor = mb.vers[:0], mb.eps[:0], 0
		mb.add(tag, 0)
	}
	c, err := New(m.be, m.cfg, nil)
	if err != nil {
		return err
	}
	m.c = c
	return nil
}

func runModel(t *testing.T, seed uint64, totalOps int, failRate float64) {
	ctx := context.Background()
	const workers = 4
	m := newModel(t, seed, workers, failRate)
	defer func() { m.cache().shutdown() }()
	rng := rand.New(rand.NewPCG(seed, 1))
	const perRound = 400
	rounds := (totalOps + workers*perRound - 1) / (workers * perRound)
	for round := 0; round < rounds; round++ {
		var wg sync.WaitGroup
		errs := make(chan error, workers)
		for w := 0; w < workers; w++ {
			wg.Add(1)
			wr := rand.New(rand.NewPCG(seed, uint64(round*workers+w+2)))
			go func() {
				defer wg.Done()
				if err := m.worker(ctx, w, wr, perRound); err != nil {
					errs <- fmt.Errorf("seed %d round %d worker %d: %w", seed, round, w, err)
				}
			}()
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			t.Fatal(err)
		}
		c := m.cache()
		if d, lim := c.DirtyBytes(), c.cfg.limitPages*c.ps; d > lim {
			t.Fatalf("dirty %d above the limit %d", d, lim)
		}
		switch rng.IntN(10) {
		case 0, 1, 2:
			if err := m.flushAndCheckExact(ctx); err != nil {
				t.Fatalf("seed %d round %d: %v", seed, round, err)
			}
		case 3, 4, 5:
			if err := m.crashAndCheck(); err != nil {
				t.Fatalf("seed %d round %d: %v", seed, round, err)
			}
		}
	}
	if err := m.flushAndCheckExact(ctx); err != nil {
		t.Fatalf("seed %d final: %v", seed, err)
	}
	if o := m.dev.Overlaps(); len(o) > 0 {
		t.Fatalf("seed %d: overlapping writes in flight on the backend: %v", seed, o[:min(len(o), 5)])
	}
	m.addStats(m.cache().Stats())
	st := m.total
	t.Logf("seed %d (%s, write-around from %d, read-around from %d, FUA native %v): %d ops, %d flushes, %d crashes, %d FUA writes, %d injected faults; caches: %d hits, %d misses, %d evictions, %d throttled writes, %d write-back errors, %d bytes written around, %d read around, %d dirty pages overlaid, %d superseded pages cleaned",
		seed, m.cfg.Mode, m.cfg.WriteAround, m.cfg.ReadAround, m.dev.Limits().CanFUA, m.ops.Load(), m.flushes.Load(), m.crashes.Load(), m.fuas.Load(), m.faults.Load(),
		st.Hits, st.Misses, st.Evictions, st.ThrottledWrites, st.WriteBackErrors, st.WriteAroundBytes, st.ReadAroundBytes, st.OverlaidPages, st.SupersededCleaned)
	if _, ok := m.be.(*submitDev); ok && m.submitted.Load() == 0 {
		t.Fatalf("seed %d: no read took SubmitAt: the model did not exercise the path", seed)
	}
	t.Logf("seed %d: %d reads and %d writes started with SubmitAt, %d large reads served by ReadCached", seed,
		m.submitted.Load(), m.submittedW.Load(), m.cachedLarge.Load())
	if _, ok := m.be.(*submitDev); ok && m.cfg.WriteAround > 0 && m.submittedW.Load() == 0 {
		t.Fatalf("seed %d: no write-around took SubmitAt: the model did not exercise the path", seed)
	}
	// (In write-through mode a write-around rarely finds a dirty page: every write is written
	// back before it is acknowledged.)
	if m.cfg.WriteAround > 0 && m.cfg.Mode == WriteBack && st.SupersededCleaned == 0 {
		t.Fatalf("seed %d: no write-around cleaned a dirty page it superseded: the model did not exercise the path", seed)
	}
	if m.cfg.ReadAround > 0 && (st.ReadAroundBytes == 0 || st.OverlaidPages == 0) {
		t.Fatalf("seed %d: no read went around the pages (%d bytes), or none over a dirty page (%d): the model did not exercise the path",
			seed, st.ReadAroundBytes, st.OverlaidPages)
	}
}

var (
	modelSeeds = flag.Int("model.seeds", 5, "number of seeds TestModel runs (seed n: n%5==2 write-through, n%3==0 no native FUA, n%4==1 no native write-zeroes, n>2 with n%3!=2 inject faults (reads at a quarter of the rate), even n write large writes around the pages, n%4!=3 read single pages and write around with SubmitAt, n%4!=3 read large reads around them)")
	modelOps   = flag.Int("model.ops", 100_000, "operations per seed")
)

func TestModel(t *testing.T) {
	total := *modelOps
	if testing.Short() {
		total = min(total, 20_000)
	}
	for seed := uint64(1); seed <= uint64(*modelSeeds); seed++ {
		tc := struct {
			seed     uint64
			failRate float64
		}{seed, 0}
		if seed > 2 {
			tc.failRate = []float64{0.02, 0.05, 0}[seed%3]
		}
		t.Run(fmt.Sprint("seed=", tc.seed), func(t *testing.T) {
			runModel(t, tc.seed, total, tc.failRate)
		})
	}
}
