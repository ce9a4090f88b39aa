package cache

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math"
	"sync/atomic"
	"testing"
	"time"

	"github.com/iser-blk/iser-blk/block"
	"github.com/iser-blk/iser-blk/cache/internal/fakedev"
	"github.com/iser-blk/iser-blk/pool"
)

// submitDev gives a device a Submitter that completes each read on a goroutine of its own (async)
// or before SubmitAt returns (for allocation counts).
// With maxWrite set it takes writes of up to that many bytes (block.SubmitWriteLimiter), as the
// iSCSI backend takes only writes that fit its immediate data; submitted counts what it took.
type submitDev struct {
	block.Device
	async     bool
	maxWrite  int
	submitted atomic.Int64
}

// SubmitWriteMax implements block.SubmitWriteLimiter.
func (d *submitDev) SubmitWriteMax() int {
	if d.maxWrite > 0 {
		return d.maxWrite
	}
	return math.MaxInt
}

func (d *submitDev) SubmitAt(ctx context.Context, p []byte, off int64, write bool, flags block.WriteFlags, done block.Completion) bool {
	if write && len(p) > d.SubmitWriteMax() {
		return false
	}
	d.submitted.Add(1)
	if !d.async {
		done.Complete(d.do(ctx, p, off, write, flags))
		return true
	}
	go func() { done.Complete(d.do(ctx, p, off, write, flags)) }()
	return true
}

func (d *submitDev) do(ctx context.Context, p []byte, off int64, write bool, flags block.WriteFlags) error {
	if write {
		return d.WriteAt(ctx, p, off, flags)
	}
	return d.ReadAt(ctx, p, off)
}

func (d *submitDev) Kick() {}

// chanDone is a Completion that hands its result to a channel.
type chanDone chan error

func (c chanDone) Complete(err error) { c <- err }

// TestSubmitReadMiss checks the asynchronous miss: the page is read on the backend's Submitter,
// merged with the dirty sectors the cache holds (never overwritten by the backend's older data),
// installed (the next read is a hit), and a backend error reaches the completion and installs
// nothing.
func TestSubmitReadMiss(t *testing.T) {
	ctx := context.Background()
	dev := fakedev.New(1<<20, stdLimits(512))
	c := newPooledCache(t, &submitDev{Device: dev, async: true}, Config{Size: 256 << 10, MaxDirtyAge: time.Hour, ReadAhead: -1})
	old := fill(4096, 1)
	if err := dev.WriteAt(ctx, old, 8192, 0); err != nil {
		t.Fatal(err)
	}
	dirty := fill(512, 2)
	if err := c.WriteAt(ctx, dirty, 8192+1024, 0); err != nil {
		t.Fatal(err)
	}
	want := append([]byte(nil), old...)
	copy(want[1024:], dirty)
	got := make([]byte, 4096)
	done := make(chanDone, 1)
	if !c.SubmitAt(ctx, got, 8192, false, 0, done) {
		t.Fatal("SubmitAt declined a one-page miss")
	}
	if err := <-done; err != nil || !bytes.Equal(got, want) {
		t.Fatalf("async miss: %v, data differs from backend data merged with the dirty sector", err)
	}
	// This page was cached before the miss (its dirty sector), so the whole-page miss is read
	// in place and installed before the completion (TestSubmitMissInPlace); a staged miss would
	// report first and install after, while the page is not marked filling (only a page the
	// miss creates is, see TestSubmitMissRepliesBeforeInstall), and a read between the two would
	// read it again (CI once saw 2 misses here). waitPageValid holds either way.
	waitPageValid(t, c, 8192)
	clear(got)
	if err := c.ReadAt(ctx, got, 8192); err != nil || !bytes.Equal(got, want) || c.Stats().Misses != 1 {
		t.Fatalf("the filled page was not installed (%v, stats %+v)", err, c.Stats())
	}
	if c.SubmitAt(ctx, got, 8192, true, 0, done) || c.SubmitAt(ctx, make([]byte, 8192), 0, false, 0, done) {
		t.Fatal("SubmitAt took a cached write or a two-page read")
	}
	dev.SetFault(func(op fakedev.Op) error {
		if op.Kind == fakedev.Read {
			return block.ErrIO
		}
		return nil
	})
	if !c.SubmitAt(ctx, got, 64<<10, false, 0, done) {
		t.Fatal("SubmitAt declined a one-page miss")
	}
	if err := <-done; !errors.Is(err, block.ErrIO) {
		t.Fatalf("a failed backend read completed with %v", err)
	}
	if c.ReadCached(got, 64<<10) {
		t.Fatal("a failed fill installed its page")
	}
	if st := c.Stats(); st.Misses != 2 {
		t.Fatalf("misses %d, want 2", st.Misses)
	}
}

// TestSubmitZeroAllocs checks that an asynchronous miss and an asynchronous write-around allocate
// nothing once warm.
func TestSubmitZeroAllocs(t *testing.T) {
	ctx := context.Background()
	c := newPooledCache(t, &submitDev{Device: newMemDev(t, 64<<20)}, Config{Size: 1 << 20})
	p := make([]byte, 4096)
	done := make(chanDone, 1)
	off := int64(0)
	read := func() {
		off += 64 << 10 // never sequential, never cached
		if !c.SubmitAt(ctx, p, off%(64<<20), false, 0, done) {
			t.Fatal("SubmitAt declined")
		}
		if err := <-done; err != nil {
			t.Fatal(err)
		}
	}
	for i := 0; i < 2000; i++ { // every slot used once: the shards' maps have grown
		read()
		// The first misses install their fresh pages on goroutines of their own; with one P
		// those run only when this loop blocks, and the loop comes back to their pages.
		waitPageValid(t, c, off%(64<<20))
	}
	if n := allocsPerCall(t, 500, read); n != 0 {
		t.Errorf("async 4 KiB read miss: %v allocs per call", n)
	}
	large := make([]byte, 1<<20)
	for _, tc := range []struct {
		name  string
		off   int64
		write bool
	}{{"write-around", 32 << 20, true}, {"read-around", 40 << 20, false}} {
		submit := func() {
			if !c.SubmitAt(ctx, large, tc.off, tc.write, 0, done) {
				t.Fatalf("SubmitAt declined a 1 MiB %s", tc.name)
			}
			if err := <-done; err != nil {
				t.Fatal(err)
			}
		}
		submit()
		if n := allocsPerCall(t, 100, submit); n != 0 {
			t.Errorf("async 1 MiB %s: %v allocs per call", tc.name, n)
		}
	}
}

// TestSubmitWriteAround checks a write that goes around the pages started with SubmitAt: on the
// backend at completion, and a dirty page it overlaps takes its data and is clean once the
// backend has it (cleanSuperseded).
func TestSubmitWriteAround(t *testing.T) {
	ctx := context.Background()
	dev := fakedev.New(4<<20, stdLimits(4096))
	c := newPooledCache(t, &submitDev{Device: dev, async: true}, Config{Size: 1 << 20, MaxDirtyAge: time.Hour})
	if err := c.WriteAt(ctx, fill(4096, 7), 64<<10, 0); err != nil {
		t.Fatal(err)
	}
	data := fill(DefaultWriteAround, 8)
	done := make(chanDone, 1)
	if !c.SubmitAt(ctx, data, 0, true, 0, done) {
		t.Fatal("SubmitAt declined a write-around")
	}
	if err := <-done; err != nil || !bytes.Equal(dev.Current(0, int64(len(data))), data) {
		t.Fatalf("write-around: %v, not on the backend at completion", err)
	}
	got := make([]byte, 4096)
	if !c.ReadCached(got, 64<<10) || !bytes.Equal(got, data[64<<10:68<<10]) {
		t.Fatal("the dirty page the write overlapped does not hold its data")
	}
	if st := c.Stats(); st.DirtyBytes != 0 || st.WriteAroundBytes != uint64(len(data)) || st.WriteBackBytes != 0 {
		t.Fatalf("stats: %+v", st)
	}
}

// TestSubmitMissRepliesBeforeInstall checks the order of an asynchronous miss's completion into a
// slot used before, for a miss of part of a page (read into a staging buffer): the caller's data
// is reported while the page is still being filled, and the page is installed inline after the
// completion returns.
func TestSubmitMissRepliesBeforeInstall(t *testing.T) {
	ctx := context.Background()
	dev := fakedev.New(1<<20, stdLimits(512))
	c := newPooledCache(t, &submitDev{Device: dev}, Config{Size: 256 << 10, ReadAhead: -1})
	useEverySlot(t, c)
	const pageOff = 768 << 10 // a page the cache does not hold: its miss evicts a used slot
	const off = pageOff + 1024
	page := fill(4096, 7)
	if err := dev.WriteAt(ctx, page, pageOff, 0); err != nil {
		t.Fatal(err)
	}
	want := page[1024:1536]
	got := make([]byte, len(want))
	var filling bool
	done := completionFunc(func(err error) {
		if err != nil {
			t.Error(err)
		}
		filling = c.beingFilled(off / c.ps)
	})
	if !c.SubmitAt(ctx, got, off, false, 0, done) { // submitDev without async: completes inline
		t.Fatal("SubmitAt declined a one-page miss")
	}
	if !bytes.Equal(got, want) || !filling {
		t.Fatalf("data right %v, page still being filled at the completion %v: want both", bytes.Equal(got, want), filling)
	}
	if c.beingFilled(off/c.ps) || !c.ReadCached(got, off) {
		t.Fatal("the page was not installed after the completion")
	}
}

// TestSubmitMissInPlace checks a miss of a whole page into a slot used before, which the backend
// reads straight into the caller's buffer: at the completion the page is already installed (the
// buffer is the caller's after it), the page's dirty sector wins over the backend's older data
// both in the reply and in the page, and no staging buffer was taken. A backend that declines the
// caller's buffer (iSER takes only registered memory) gets the miss again in a staging buffer.
func TestSubmitMissInPlace(t *testing.T) {
	ctx := context.Background()
	dev := fakedev.New(1<<20, stdLimits(512))
	sd := &submitDev{Device: dev}
	c := newPooledCache(t, sd, Config{Size: 256 << 10, ReadAhead: -1, MaxDirtyAge: time.Hour})
	useEverySlot(t, c)
	const off = 768 << 10
	old := fill(4096, 9)
	if err := dev.WriteAt(ctx, old, off, 0); err != nil {
		t.Fatal(err)
	}
	dirty := fill(512, 10)
	if err := c.WriteAt(ctx, dirty, off+2048, 0); err != nil {
		t.Fatal(err)
	}
	want := append([]byte(nil), old...)
	copy(want[2048:], dirty)
	got := make([]byte, 4096)
	staged := c.cfg.IOPool.Stats().Gets
	missInstalledAtCompletion(t, c, got, off, want)
	if n := c.cfg.IOPool.Stats().Gets - staged; n != 0 {
		t.Fatalf("a miss read in place took %d staging buffers", n)
	}
	clear(got)
	if !c.ReadCached(got, off) || !bytes.Equal(got, want) {
		t.Fatal("the installed page does not hold the backend's data under the dirty sector")
	}
	checkUnpinned(t, c, off)

	// A page the fill creates (absent, into an evicted slot): no longer filling at the completion.
	const off2 = 832 << 10
	if err := dev.WriteAt(ctx, old, off2, 0); err != nil {
		t.Fatal(err)
	}
	clear(got)
	missInstalledAtCompletion(t, c, got, off2, old)
	checkUnpinned(t, c, off2)

	// A backend error: reported, nothing installed, the page unpinned and no longer filling.
	const off3 = 896 << 10
	dev.SetFault(func(op fakedev.Op) error {
		if op.Kind == fakedev.Read && op.Off == off3 {
			return block.ErrIO
		}
		return nil
	})
	errc := make(chanDone, 1)
	if !c.SubmitAt(ctx, got, off3, false, 0, errc) {
		t.Fatal("SubmitAt declined a one-page miss")
	}
	if err := <-errc; !errors.Is(err, block.ErrIO) {
		t.Fatalf("a failed in-place read completed with %v", err)
	}
	if c.ReadCached(got, off3) || c.beingFilled(off3/c.ps) {
		t.Fatal("a failed in-place read left its page installed or filling")
	}
	checkUnpinned(t, c, off3)
	dev.SetFault(nil)

	foreign := &foreignDev{submitDev: submitDev{Device: dev}}
	c2 := newPooledCache(t, foreign, Config{Size: 256 << 10, ReadAhead: -1})
	foreign.pool = c2.cfg.IOPool
	useEverySlot(t, c2)
	clear(got)
	done2 := make(chanDone, 1)
	if !c2.SubmitAt(ctx, got, off, false, 0, done2) { // completes inline: finished on return
		t.Fatal("SubmitAt declined a one-page miss whose buffer the backend does not take")
	}
	if err := <-done2; err != nil || !bytes.Equal(got, old) || foreign.declined != 1 {
		t.Fatalf("staged retry: %v, data right %v, declined %d (want 1)", err, bytes.Equal(got, old), foreign.declined)
	}
	if st := c2.cfg.IOPool.Stats(); st.InUseBytes != 0 || !c2.ReadCached(make([]byte, 4096), off) {
		t.Fatalf("staged retry: %d bytes of staging buffers still out, page installed %v",
			st.InUseBytes, c2.ReadCached(make([]byte, 4096), off))
	}
	checkUnpinned(t, c2, off)
}

// missInstalledAtCompletion starts the one-page miss got at off on c's Submitter (which completes
// it inline) and fails unless the completion found the page installed and no longer filling, and
// got holds want.
func missInstalledAtCompletion(t *testing.T, c *Cache, got []byte, off int64, want []byte) {
	t.Helper()
	var filling, cached bool
	done := completionFunc(func(err error) {
		if err != nil {
			t.Error(err)
		}
		filling = c.beingFilled(off / c.ps)
		cached = c.ReadCached(make([]byte, len(got)), off)
	})
	if !c.SubmitAt(context.Background(), got, off, false, 0, done) {
		t.Fatal("SubmitAt declined a one-page miss")
	}
	if !bytes.Equal(got, want) || filling || !cached {
		t.Fatalf("miss at %d: data right %v, being filled at the completion %v, cached at it %v: want true, false, true",
			off, bytes.Equal(got, want), filling, cached)
	}
}

// checkUnpinned fails unless the page at off is cached, unpinned and not being filled.
func checkUnpinned(t *testing.T, c *Cache, off int64) {
	t.Helper()
	pg := off / c.ps
	sh := c.shard(pg)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	s, ok := sh.m[pg]
	if !ok {
		t.Fatalf("page %d is not in the index", pg)
	}
	if sl := &c.slots[s]; sl.pins != 0 || sl.filling {
		t.Fatalf("page %d: %d pins, filling %v after its fill ended", pg, sl.pins, sl.filling)
	}
}

// foreignDev is a submitDev that, like iSER, takes only buffers of its own pool.
type foreignDev struct {
	submitDev
	pool     *pool.Pool
	declined int
}

func (d *foreignDev) SubmitAt(ctx context.Context, p []byte, off int64, write bool, flags block.WriteFlags, done block.Completion) bool {
	if _, _, _, ok := d.pool.Lookup(p); !ok {
		d.declined++
		return false
	}
	return d.submitDev.SubmitAt(ctx, p, off, write, flags, done)
}

// TestSubmitMissInstallsFreshSlotBesideReport checks that a miss into a slot never used before
// (whose install is the first write to its memory, a page fault) installs its page on its own
// goroutine: the page becomes readable from the cache while the completion has not returned,
// where inline it could only be installed after.
func TestSubmitMissInstallsFreshSlotBesideReport(t *testing.T) {
	ctx := context.Background()
	dev := fakedev.New(1<<20, stdLimits(512))
	c := newPooledCache(t, &submitDev{Device: dev}, Config{Size: 256 << 10, ReadAhead: -1})
	want := fill(4096, 8)
	if err := dev.WriteAt(ctx, want, 16384, 0); err != nil {
		t.Fatal(err)
	}
	got := make([]byte, 4096)
	var installed bool
	done := completionFunc(func(err error) {
		if err != nil {
			t.Error(err)
		}
		if !bytes.Equal(got, want) {
			t.Error("the completion came before the caller's data was copied out")
		}
		// Not waitPageValid: its t.Fatal here would leave the fill unfinished and the
		// cleanup's shutdown waiting for it.
		installed = pageInstalledWithin(c, 16384, 10*time.Second)
	})
	if !c.SubmitAt(ctx, got, 16384, false, 0, done) {
		t.Fatal("SubmitAt declined a one-page miss")
	}
	if !installed {
		t.Fatal("the fresh page was not installed within 10 s while the completion waited")
	}
	if st := c.Stats(); st.CachedBytes != 4096 {
		t.Fatalf("cached %d bytes after one miss, want 4096", st.CachedBytes)
	}
}

// TestSubmitMissFreshInlinePastBound checks the bound on fresh pages installed on goroutines of
// their own: with maxFreshInstalls of them waiting, a further fresh miss installs its page inline,
// after its completion, and leaves the count as it found it.
func TestSubmitMissFreshInlinePastBound(t *testing.T) {
	ctx := context.Background()
	c := newPooledCache(t, &submitDev{Device: fakedev.New(1<<20, stdLimits(512))}, Config{Size: 256 << 10, ReadAhead: -1})
	c.freshInstalls.Store(maxFreshInstalls) // as if that many were waiting for a CPU
	got := make([]byte, 4096)
	var filling bool
	done := completionFunc(func(err error) {
		if err != nil {
			t.Error(err)
		}
		filling = c.beingFilled(4)
	})
	if !c.SubmitAt(ctx, got, 16384, false, 0, done) {
		t.Fatal("SubmitAt declined a one-page miss")
	}
	if !filling || c.beingFilled(4) || !c.ReadCached(got, 16384) {
		t.Fatalf("being filled at the completion %v, after it %v, cached after it %v: want true, false, true",
			filling, c.beingFilled(4), c.ReadCached(got, 16384))
	}
	if n := c.freshInstalls.Load(); n != maxFreshInstalls {
		t.Fatalf("fresh installs waiting: %d, want %d", n, maxFreshInstalls)
	}
}

// TestAllocSlotFresh checks which slots allocSlot reports fresh (never handed out, so their memory
// is not faulted in yet): each slot the first time, in ascending order, and not a slot released
// and handed out again.
func TestAllocSlotFresh(t *testing.T) {
	c := newPooledCache(t, &submitDev{Device: fakedev.New(1<<20, stdLimits(512))}, Config{Size: 256 << 10})
	n := len(c.slots)
	for i := 0; i < n/2; i++ {
		if s, fresh := c.allocSlot(int64(i)); s != int32(i) || !fresh {
			t.Fatalf("allocation %d: slot %d fresh %v, want slot %d fresh", i, s, fresh, i)
		}
	}
	c.releaseSlots([]int32{3})
	if s, fresh := c.allocSlot(1000); s != 3 || fresh {
		t.Fatalf("after releasing slot 3: slot %d fresh %v, want slot 3 not fresh", s, fresh)
	}
	if s, fresh := c.allocSlot(1001); s != int32(n/2) || !fresh {
		t.Fatalf("next allocation: slot %d fresh %v, want slot %d fresh", s, fresh, n/2)
	}
}

// useEverySlot reads as many distinct pages as c has slots, synchronously, so that every slot
// has been used and a further miss evicts.
func useEverySlot(t *testing.T, c *Cache) {
	t.Helper()
	buf := make([]byte, c.ps)
	for i := range c.slots {
		if err := c.ReadAt(context.Background(), buf, int64(i)*c.ps); err != nil {
			t.Fatal(err)
		}
	}
}

type completionFunc func(error)

func (f completionFunc) Complete(err error) { f(err) }

// pipeDev is a submitDev that also reads into pipes (block.PipeSubmitter): it records the reads
// and completes them at once without touching the pipe.
type pipeDev struct {
	submitDev
	piped []int64
}

func (d *pipeDev) SubmitReadToPipe(_ context.Context, _ block.Pipe, n int, off int64, done block.Completion) bool {
	d.piped = append(d.piped, off)
	done.Complete(nil)
	return true
}

// TestSubmitReadAround checks the asynchronous read-around: a large read over a range without
// dirty pages goes to the backend's Submitter (or PipeSubmitter) and is counted as read around;
// over a dirty page both decline (ReadAt then overlays it); a read below the cutoff is declined
// too; and ReadCached declines a large read even when its pages are cached, so that the frontend
// takes the backend's path, as with the cache off.
func TestSubmitReadAround(t *testing.T) {
	ctx := context.Background()
	dev := fakedev.New(8<<20, stdLimits(512))
	pd := &pipeDev{submitDev: submitDev{Device: dev, async: true}}
	c := newPooledCache(t, pd, Config{Size: 2 << 20, MaxDirtyAge: time.Hour})
	data := fill(1<<20, 8)
	if err := dev.WriteAt(ctx, data, 1<<20, 0); err != nil {
		t.Fatal(err)
	}
	got := make([]byte, 1<<20)
	done := make(chanDone, 1)
	if !c.SubmitAt(ctx, got, 1<<20, false, 0, done) {
		t.Fatal("SubmitAt declined a 1 MiB read over a clean range")
	}
	if err := <-done; err != nil || !bytes.Equal(got, data) {
		t.Fatalf("asynchronous read-around: %v, data differs", err)
	}
	if !c.SubmitReadToPipe(ctx, block.Pipe{}, 1<<20, 2<<20, done) || len(pd.piped) != 1 || <-done != nil {
		t.Fatal("SubmitReadToPipe declined a 1 MiB read over a clean range")
	}
	if st := c.Stats(); st.ReadAroundBytes != 2<<20 || st.CachedBytes != 0 {
		t.Fatalf("stats %+v: want 2 MiB read around, nothing cached", st)
	}
	if c.SubmitAt(ctx, got[:64<<10], 4<<20, false, 0, done) {
		t.Fatal("SubmitAt took a 64 KiB read that stays in the pages")
	}
	if err := c.WriteAt(ctx, fill(4096, 9), 1<<20+8192, 0); err != nil {
		t.Fatal(err)
	}
	if c.SubmitAt(ctx, got, 1<<20, false, 0, done) || c.SubmitReadToPipe(ctx, block.Pipe{}, 1<<20, 1<<20, done) {
		t.Fatal("a read-around over a dirty page was started on the backend")
	}
	small := make([]byte, 256<<10)
	for off := int64(0); off < 256<<10; off += 64 << 10 { // a stream of 64 KiB misses: cached, read ahead
		if err := c.ReadAt(ctx, small[:64<<10], 6<<20+off); err != nil {
			t.Fatal(err)
		}
	}
	if !c.ReadCached(small[:64<<10], 6<<20+192<<10) {
		t.Fatal("a cached 64 KiB read was declined")
	}
	if c.ReadCached(small, 6<<20) {
		t.Fatal("ReadCached served a read of ReadAround bytes from the pages")
	}
	tail := make([]byte, 128<<10) // from the read-ahead's last page to beyond it: not all cached
	if c.ReadCached(tail[:4096], 6<<20+700<<10) || !c.ReadCached(tail[:4096], 6<<20+572<<10) {
		t.Fatal("the read-ahead does not end where the test expects")
	}
	clear(tail)
	if c.ReadCached(tail, 6<<20+572<<10) || !bytes.Equal(tail, make([]byte, len(tail))) {
		t.Fatal("ReadCached served, or copied from the pages, a read whose last page is not cached")
	}
}

// BenchmarkSubmitMiss4KCold measures the asynchronous 4 KiB miss on a cold cache (every miss takes
// a page never used before, as in the bench's cold QD1 job): reply-µs is the time from SubmitAt to
// the completion (what the client waits for), sec/op the rate of back-to-back misses, whose fresh
// pages are installed on goroutines of their own, up to maxFreshInstalls at a time (see
// asyncFill.Complete), beside the loop when there is a second P.
func BenchmarkSubmitMiss4KCold(b *testing.B) {
	const devSize = 256 << 20
	for _, cached := range []bool{false, true} {
		b.Run(fmt.Sprintf("cache=%v", cached), func(b *testing.B) {
			var d block.Submitter = &submitDev{Device: newMemDev(b, devSize)}
			if cached {
				d = newPooledCache(b, &submitDev{Device: newMemDev(b, devSize)}, Config{Size: devSize, ReadAhead: -1})
			}
			ctx := context.Background()
			p := make([]byte, 4096)
			var start time.Time
			var replied time.Duration
			done := completionFunc(func(err error) {
				replied += time.Since(start)
				if err != nil {
					b.Error(err)
				}
			})
			b.ReportAllocs()
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				start = time.Now()
				off := int64(i) * 4096 * 7 % devSize
				if !d.SubmitAt(ctx, p, off, false, 0, done) {
					b.Fatal("SubmitAt declined")
				}
			}
			b.ReportMetric(float64(replied.Microseconds())/float64(b.N), "reply-µs/op")
		})
	}
}

// TestSubmitWriteAroundOverLimit checks that a write-around larger than the backend's
// asynchronous limit declines before it touches the pages (they are superseded once, by WriteAt,
// not once by SubmitAt and again by WriteAt), and that the write-around then empties the clean
// page it covered: the page leaves the index and its slot is free again.
func TestSubmitWriteAroundOverLimit(t *testing.T) {
	ctx := context.Background()
	dev := fakedev.New(4<<20, stdLimits(4096))
	be := &submitDev{Device: dev, maxWrite: 64 << 10}
	c := newPooledCache(t, be, Config{Size: 1 << 20, MaxDirtyAge: time.Hour})
	old := make([]byte, 4096)
	if err := c.ReadAt(ctx, old, 64<<10); err != nil { // a clean cached page inside the range
		t.Fatal(err)
	}
	cached := c.Stats().CachedBytes
	data := fill(DefaultWriteAround, 9)
	if c.SubmitAt(ctx, data, 0, true, 0, make(chanDone, 1)) {
		t.Fatal("SubmitAt took a write larger than the backend's asynchronous limit")
	}
	got := make([]byte, 4096)
	if !c.ReadCached(got, 64<<10) || !bytes.Equal(got, old) {
		t.Fatal("the declined SubmitAt invalidated the clean page of its range")
	}
	if n := be.submitted.Load(); n != 0 {
		t.Fatalf("%d requests reached the backend's Submitter", n)
	}
	if err := c.WriteAt(ctx, data, 0, 0); err != nil {
		t.Fatal(err)
	}
	if c.ReadCached(got, 64<<10) {
		t.Fatal("the page the write-around covered still serves reads")
	}
	if st := c.Stats(); st.CachedBytes != cached-4096 || st.WriteAroundBytes != uint64(len(data)) {
		t.Fatalf("after the write-around: cached %d (was %d), written around %d", st.CachedBytes, cached, st.WriteAroundBytes)
	}
	if err := c.ReadAt(ctx, got, 64<<10); err != nil || !bytes.Equal(got, data[64<<10:68<<10]) {
		t.Fatalf("read after the write-around: %v", err)
	}
}

// waitPageValid waits until every sector of the page at off is valid in the cache (an
// asynchronous miss installs its page after its completion, then broadcasts progress).
func waitPageValid(t *testing.T, c *Cache, off int64) {
	t.Helper()
	if !pageInstalledWithin(c, off, 10*time.Second) {
		t.Fatalf("the page at %d was not installed within 10 s", off)
	}
}

// pageInstalledWithin reports whether every sector of the page at off becomes valid in the cache
// within d, waking on the cache's progress broadcasts.
func pageInstalledWithin(c *Cache, off int64, d time.Duration) bool {
	buf := make([]byte, c.ps)
	timeout := time.NewTimer(d)
	defer timeout.Stop()
	for {
		installed := c.progress.wait()
		if c.ReadCached(buf, off) {
			return true
		}
		select {
		case <-installed:
		case <-timeout.C:
			return false
		}
	}
}
