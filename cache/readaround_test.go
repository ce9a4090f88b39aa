package cache

import (
	"bytes"
	"context"
	"fmt"
	"runtime"
	"sync/atomic"
	"testing"
	"time"

	"github.com/iser-blk/iser-blk/backend/memdev"
	"github.com/iser-blk/iser-blk/block"
	"github.com/iser-blk/iser-blk/cache/internal/fakedev"
	"github.com/iser-blk/iser-blk/pool"
)

// TestReadAroundBypassesPages checks that a large cold read comes from the backend straight into
// the caller's buffer: right data, no page filled, counted as read around.
func TestReadAroundBypassesPages(t *testing.T) {
	ctx := context.Background()
	c, dev := newTest(t, 4<<20, stdLimits(4096), Config{Size: 1 << 20, MaxDirtyAge: time.Hour})
	data := fill(DefaultReadAround+8192, 9)
	if err := dev.WriteAt(ctx, data, 4096, 0); err != nil {
		t.Fatal(err)
	}
	got := make([]byte, len(data))
	if err := c.ReadAt(ctx, got, 4096); err != nil || !bytes.Equal(got, data) {
		t.Fatalf("read-around returned other data (%v)", err)
	}
	if st := c.Stats(); st.ReadAroundBytes != uint64(len(data)) || st.Misses != 0 || st.CachedBytes != 0 {
		t.Fatalf("stats after a read-around: %+v", st)
	}
}

// TestReadAroundSeesCache checks the rule that keeps a read-around correct: data written back
// is read around; when a page of the range is dirty, the read still goes around and the dirty
// data is copied over what the backend returned.
func TestReadAroundSeesCache(t *testing.T) {
	ctx := context.Background()
	c, _ := newTest(t, 4<<20, stdLimits(4096), Config{Size: 1 << 20, MaxDirtyAge: time.Hour})
	const n = DefaultReadAround * 2
	want := make([]byte, 2*n)
	written, dirty := fill(4096, 3), fill(4096, 4)
	copy(want[100<<10:], written)
	copy(want[n+(100<<10):], dirty)
	if err := c.WriteAt(ctx, written, 100<<10, 0); err != nil {
		t.Fatal(err)
	}
	if err := c.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	if err := c.WriteAt(ctx, dirty, n+(100<<10), 0); err != nil {
		t.Fatal(err)
	}
	got := make([]byte, n)
	if err := c.ReadAt(ctx, got, 0); err != nil || !bytes.Equal(got, want[:n]) {
		t.Fatalf("read of written-back data: %v, data differs", err)
	}
	if st := c.Stats(); st.ReadAroundBytes != n {
		t.Fatalf("read of clean data: %d bytes around, want %d", st.ReadAroundBytes, n)
	}
	if err := c.ReadAt(ctx, got, n); err != nil || !bytes.Equal(got, want[n:]) {
		t.Fatalf("read over a dirty page: %v, dirty data lost", err)
	}
	if st := c.Stats(); st.ReadAroundBytes != 2*n || st.Misses != 0 {
		t.Fatalf("a read over a dirty page did not go around: %+v", st)
	}
}

// TestReadAroundSequentialStream checks the cutoff for reads of a quarter of ReadAround: cached
// until their stream has read ReadAround bytes in a row, around after that.
func TestReadAroundSequentialStream(t *testing.T) {
	ctx := context.Background()
	const ra, n = 256 << 10, 64 << 10
	c, _ := newTest(t, 16<<20, stdLimits(4096), Config{Size: 4 << 20, ReadAround: ra, ReadAhead: -1})
	buf := make([]byte, n)
	for i := int64(0); i < 4; i++ {
		if err := c.ReadAt(ctx, buf, i*n); err != nil {
			t.Fatal(err)
		}
	}
	if st := c.Stats(); st.ReadAroundBytes != 0 {
		t.Fatalf("the first %d bytes of a stream went around: %+v", ra, st)
	}
	for i := int64(4); i < 8; i++ {
		if err := c.ReadAt(ctx, buf, i*n); err != nil {
			t.Fatal(err)
		}
	}
	if st := c.Stats(); st.ReadAroundBytes != 4*n {
		t.Fatalf("read around %d bytes, want %d", st.ReadAroundBytes, 4*n)
	}
}

// TestReadPathsZeroAllocs checks that neither a read-around nor a 4 KiB read miss allocates per
// call once warm (staging buffers from an IOPool, as the CLI configures).
func TestReadPathsZeroAllocs(t *testing.T) {
	ctx := context.Background()
	c := newMemCache(t, 64<<20, Config{Size: 1 << 20, MaxDirtyAge: time.Hour})
	large, small := make([]byte, 1<<20), make([]byte, 4096)
	for off := int64(0); off < 8<<20; off += 1 << 20 { // warm: pages faulted in, memdev chunks there
		if err := c.ReadAt(ctx, large, off); err != nil {
			t.Fatal(err)
		}
	}
	if n := allocsPerCall(t, 50, func() {
		if err := c.ReadAt(ctx, large, 8<<20); err != nil {
			t.Fatal(err)
		}
	}); n != 0 {
		t.Errorf("1 MiB read-around: %v allocs per call", n)
	}
	off := int64(16 << 20)
	if n := allocsPerCall(t, 500, func() {
		// Never sequential, never cached: every read a miss. The offset wraps within
		// [16 MiB, 64 MiB) so that allocsPerCall's further attempts stay on the device (a page
		// read 768 calls ago was evicted from the 1 MiB cache long since).
		off = 16<<20 + (off-16<<20+64<<10)%(48<<20)
		if err := c.ReadAt(ctx, small, off); err != nil {
			t.Fatal(err)
		}
	}); n != 0 {
		t.Errorf("4 KiB read miss: %v allocs per call", n)
	}
}

// newMemDev is a memdev written all over (memdev allocates its chunks on first write and reads
// unwritten ones as zeroes without a copy, which would flatter the device).
func newMemDev(t testing.TB, devSize int64) *memdev.Device {
	be, err := memdev.New(devSize, memdev.Options{})
	if err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 1<<20)
	for off := int64(0); off < devSize; off += int64(len(buf)) {
		if err := be.WriteAt(context.Background(), buf, off, 0); err != nil {
			t.Fatal(err)
		}
	}
	return be
}

// newMemCache is a cache over a newMemDev with staging buffers from an IOPool, as the CLI builds
// it.
func newMemCache(t testing.TB, devSize int64, cfg Config) *Cache {
	return newPooledCache(t, newMemDev(t, devSize), cfg)
}

// newPooledCache is a cache over be with staging buffers from an IOPool.
func newPooledCache(t testing.TB, be block.Device, cfg Config) *Cache {
	io, err := pool.New(pool.Config{MaxBytes: 16 << 20, MaxClass: 1 << 20})
	if err != nil {
		t.Fatal(err)
	}
	cfg.IOPool = io
	c, err := New(be, cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		c.shutdown()
		_ = io.Close()
	})
	return c
}

// BenchmarkReadSeq reads 1 MiB sequential streams at queue depth 8 over memdev: with no cache,
// through the cache's pages (ReadAround off) and around them.
func BenchmarkReadSeq(b *testing.B) {
	const devSize, qd, size = 256 << 20, 8, 1 << 20
	for _, v := range []struct {
		name   string
		around int64 // 0: no cache
		dirty  bool  // a dirty 4 KiB page in every 1 MiB (the bench's seqread after randwrite)
	}{{"off", 0, false}, {"writeback-pages", -1, false}, {"writeback-around", DefaultReadAround, false},
		{"writeback-around-dirty", DefaultReadAround, true}} {
		b.Run(v.name, func(b *testing.B) {
			var d block.Device
			if v.around == 0 {
				d = newMemDev(b, devSize)
			} else {
				c := newMemCache(b, devSize, Config{Size: 64 << 20, ReadAround: v.around, MaxDirtyAge: time.Hour})
				for off := int64(0); v.dirty && off < devSize; off += 1 << 20 {
					if err := c.WriteAt(context.Background(), make([]byte, 4096), off+64<<10, 0); err != nil {
						b.Fatal(err)
					}
				}
				d = c
			}
			benchRead(b, d, devSize, qd, size, true)
		})
	}
}

// BenchmarkReadMiss4K reads random 4 KiB blocks of a 256 MiB device through a 16 MiB cache at
// queue depth 1: (almost) every read a miss, the per-miss cost against no cache.
func BenchmarkReadMiss4K(b *testing.B) {
	const devSize = 256 << 20
	for _, cached := range []bool{false, true} {
		b.Run(fmt.Sprintf("cache=%v", cached), func(b *testing.B) {
			var d block.Device = newMemDev(b, devSize)
			if cached {
				d = newMemCache(b, devSize, Config{Size: 16 << 20})
			}
			benchRead(b, d, devSize, 1, 4096, false)
		})
	}
}

// benchRead reads size-byte requests from qd goroutines, each in its own region of the device:
// sequentially, or at random offsets.
func benchRead(b *testing.B, d block.Device, devSize, qd, size int64, seq bool) {
	ctx := context.Background()
	b.SetBytes(size)
	b.ReportAllocs()
	b.SetParallelism(int((qd + int64(runtime.GOMAXPROCS(0)) - 1) / int64(runtime.GOMAXPROCS(0))))
	var next atomic.Int64
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		p := make([]byte, size)
		region := (next.Add(1) - 1) % qd * (devSize / qd)
		span := devSize / qd / size
		i := int64(0)
		rnd := next.Add(7919)
		for pb.Next() {
			k := i % span
			if !seq {
				rnd = (rnd*1103515245 + 12345) & (1<<31 - 1)
				k = rnd % span
			}
			if err := d.ReadAt(ctx, p, region+k*size); err != nil {
				b.Error(err)
				return
			}
			i++
		}
	})
}

// TestReadAroundDefaultFlags checks read-around with the default configuration (read-ahead on):
// a stream of 128 KiB reads goes around once it has read ReadAround bytes (the read-ahead of its
// first misses counts), and 1 MiB reads go around at once. Before the read streams expected the
// next miss where the read-ahead stopped, the first case never went around.
func TestReadAroundDefaultFlags(t *testing.T) {
	ctx := context.Background()
	for _, n := range []int64{128 << 10, 1 << 20} {
		c, _ := newTest(t, 32<<20, stdLimits(4096), Config{Size: 4 << 20})
		buf := make([]byte, n)
		const span = 8 << 20
		for off := int64(0); off < span; off += n {
			if err := c.ReadAt(ctx, buf, off); err != nil {
				t.Fatal(err)
			}
		}
		st := c.Stats()
		if st.ReadAroundBytes < span-(1<<20) || st.CachedBytes > 1<<20 {
			t.Errorf("%d KiB sequential reads: %d of %d bytes read around, %d cached; want (almost) all around",
				n>>10, st.ReadAroundBytes, span, st.CachedBytes)
		}
	}
}

// holdingReads wraps a device so that a hook runs after each backend read returned its data and
// before the caller sees it: the moment where a read-around has the backend's data in hand but
// has not yet copied the dirty pages over it.
type holdingReads struct {
	block.Device
	after func(off int64)
}

func (h *holdingReads) ReadAt(ctx context.Context, p []byte, off int64) error {
	err := h.Device.ReadAt(ctx, p, off)
	if h.after != nil {
		h.after(off)
	}
	return err
}

// TestReadAroundOverlaysDirty checks the overlay of a read-around: sectors of pages that are
// dirty (a whole page, and single sectors of another) win over the backend's older data, also
// when the write-back of those pages completes (and the pages become clean) between the backend
// read and the overlay, which a stale backend read must not win.
func TestReadAroundOverlaysDirty(t *testing.T) {
	ctx := context.Background()
	dev := fakedev.New(4<<20, stdLimits(512))
	h := &holdingReads{Device: dev}
	c, err := New(h, Config{Size: 2 << 20, MaxDirtyAge: time.Hour}, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.shutdown() })
	const n = 1 << 20
	old := fill(n, 1)
	if err := dev.WriteAt(ctx, old, 0, 0); err != nil {
		t.Fatal(err)
	}
	want := bytes.Clone(old)
	page, sectors := fill(4096, 2), fill(1024, 3)
	copy(want[8192:], page)
	copy(want[40960+512:], sectors)
	if err := c.WriteAt(ctx, page, 8192, 0); err != nil {
		t.Fatal(err)
	}
	if err := c.WriteAt(ctx, sectors, 40960+512, 0); err != nil {
		t.Fatal(err)
	}
	// The backend read returns the old data; the write-back of the dirty pages then completes
	// before the read-around looks at them again.
	h.after = func(int64) {
		h.after = nil
		if err := c.Flush(ctx); err != nil {
			t.Error(err)
		}
		if d := c.DirtyBytes(); d != 0 {
			t.Errorf("%d bytes still dirty after the flush", d)
		}
	}
	dev.SetBefore(func(op fakedev.Op) {
		if op.Kind == fakedev.Read {
			dev.SetBefore(nil)
			if !bytes.Equal(dev.Current(8192, 4096), old[8192:8192+4096]) {
				t.Error("the backend has the new data before the read: the test would prove nothing")
			}
		}
	})
	got := make([]byte, n)
	if err := c.ReadAt(ctx, got, 0); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		t.Fatal("a read-around over dirty pages returned the backend's older data")
	}
	if st := c.Stats(); st.ReadAroundBytes != n || st.OverlaidPages != 2 || st.Misses != 0 {
		t.Fatalf("stats: %+v; want the read around with 2 pages overlaid", st)
	}
	if !bytes.Equal(dev.Durable(0, n), want) {
		t.Fatal("the flush did not write the dirty data")
	}
}

// TestReadAroundOverlayFailure checks that a read-around over a dirty page whose backend read
// fails returns the error, unpins the page (it can be evicted once clean) and keeps it dirty.
func TestReadAroundOverlayFailure(t *testing.T) {
	ctx := context.Background()
	c, dev := newTest(t, 4<<20, stdLimits(4096), Config{Size: 1 << 20, MaxDirtyAge: time.Hour})
	if err := c.WriteAt(ctx, fill(4096, 4), 4096, 0); err != nil {
		t.Fatal(err)
	}
	dev.SetFault(func(op fakedev.Op) error {
		if op.Kind == fakedev.Read {
			return block.ErrIO
		}
		return nil
	})
	if err := c.ReadAt(ctx, make([]byte, 1<<20), 0); !errorsIsIO(err) {
		t.Fatalf("read-around over a dirty page with a failing backend: %v", err)
	}
	dev.SetFault(nil)
	if d := c.DirtyBytes(); d != 4096 {
		t.Fatalf("dirty %d after a failed read-around, want 4096", d)
	}
	sh := c.shard(1)
	sh.mu.Lock()
	pins := c.slots[sh.m[1]].pins
	sh.mu.Unlock()
	if pins != 0 {
		t.Fatalf("page still pinned (%d) after the read-around", pins)
	}
}

// TestDirtyRegions checks the counts rangeDirty reads without a lock: raised by the page that
// becomes dirty in its own region only, and back to zero once written back.
func TestDirtyRegions(t *testing.T) {
	ctx := context.Background()
	c, _ := newTest(t, 64<<20, stdLimits(4096), Config{Size: 4 << 20, MaxDirtyAge: time.Hour})
	if err := c.WriteAt(ctx, fill(8192, 5), 5<<20+4096, 0); err != nil {
		t.Fatal(err)
	}
	if !c.rangeDirty(5<<20, 1<<20) || !c.rangeDirty(4<<20, 2<<20) || c.rangeDirty(6<<20, 1<<20) || c.rangeDirty(0, 4<<20) {
		t.Fatal("rangeDirty does not follow the dirty pages")
	}
	if n := c.dirtyRegions[regionOf(5<<20)].Load(); n != 2 {
		t.Fatalf("region of the 2 dirty pages counts %d", n)
	}
	if err := c.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	for r := range c.dirtyRegions {
		if n := c.dirtyRegions[r].Load(); n != 0 {
			t.Fatalf("region %d counts %d after a flush", r, n)
		}
	}
	if c.rangeDirty(0, 64<<20) {
		t.Fatal("rangeDirty after a flush")
	}
}

// TestPiecesNeverEmpty checks the piece loop shared by read-around, write-around and the direct
// operations: pieces never exceed the limit rounded to blocks, a limit below the block size
// still makes progress one block at a time (it spun forever), and no limit is one piece.
func TestPiecesNeverEmpty(t *testing.T) {
	c, _ := newTest(t, 1<<20, stdLimits(512), Config{Size: 1 << 20})
	for _, tc := range []struct{ limit, want int64 }{{100, 16}, {1000, 16}, {1024, 8}, {0, 1}, {-1, 1}, {1 << 20, 1}} {
		var pieces, covered int64
		err := c.inPieces(4096, 8192, tc.limit, func(off, n int64) error {
			if off != 4096+covered || n <= 0 || n%512 != 0 || (tc.limit >= 512 && n > tc.limit) {
				return fmt.Errorf("piece [%d, +%d) after %d bytes", off, n, covered)
			}
			pieces++
			covered += n
			return nil
		})
		if err != nil || pieces != tc.want || covered != 8192 {
			t.Errorf("limit %d: %d pieces covering %d bytes (%v), want %d covering 8192", tc.limit, pieces, covered, err, tc.want)
		}
	}
}

// TestLargeReadSkipsCachedPages checks the decision for large single reads: a read of
// ReadAround bytes whose pages are all cached still goes to the backend (only dirty pages are
// copied over it), so that ReadAt agrees with ReadCached, which declines it.
func TestLargeReadSkipsCachedPages(t *testing.T) {
	ctx := context.Background()
	c, _ := newTest(t, 4<<20, stdLimits(4096), Config{Size: 2 << 20, MaxDirtyAge: time.Hour, ReadAhead: -1})
	want := make([]byte, DefaultReadAround)
	for off := int64(0); off < DefaultReadAround; off += 32 << 10 { // cached by small misses
		if err := c.ReadAt(ctx, want[off:off+32<<10], off); err != nil {
			t.Fatal(err)
		}
	}
	dirty := fill(4096, 6)
	copy(want[8192:], dirty)
	if err := c.WriteAt(ctx, dirty, 8192, 0); err != nil {
		t.Fatal(err)
	}
	before := c.Stats()
	got := make([]byte, DefaultReadAround)
	if err := c.ReadAt(ctx, got, 0); err != nil || !bytes.Equal(got, want) {
		t.Fatalf("large read over cached pages: %v, data differs", err)
	}
	if st := c.Stats(); st.Hits != before.Hits || st.ReadAroundBytes != before.ReadAroundBytes+DefaultReadAround || st.OverlaidPages != 1 {
		t.Fatalf("stats before %+v, after %+v: want the read around with the dirty page overlaid", before, st)
	}
}
