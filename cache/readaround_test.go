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
	if n := testing.AllocsPerRun(50, func() {
		if err := c.ReadAt(ctx, large, 8<<20); err != nil {
			t.Fatal(err)
		}
	}); n != 0 {
		t.Errorf("1 MiB read-around: %v allocs per call", n)
	}
	off := int64(16 << 20)
	if n := testing.AllocsPerRun(500, func() {
		off += 64 << 10 // never sequential, never cached: every read a miss
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
	}{{"off", 0}, {"writeback-pages", -1}, {"writeback-around", DefaultReadAround}} {
		b.Run(v.name, func(b *testing.B) {
			var d block.Device
			if v.around == 0 {
				d = newMemDev(b, devSize)
			} else {
				d = newMemCache(b, devSize, Config{Size: 64 << 20, ReadAround: v.around})
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
