package cache

import (
	"bytes"
	"context"
	"fmt"
	"math/rand/v2"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/iser-blk/iser-blk/backend/memdev"
	"github.com/iser-blk/iser-blk/block"
	"github.com/iser-blk/iser-blk/cache/internal/fakedev"
)

// TestWriteAroundGoesToBackend checks that a large write reaches the backend before it is
// acknowledged, without dirtying pages, and that WriteCached declines it.
func TestWriteAroundGoesToBackend(t *testing.T) {
	ctx := context.Background()
	c, dev := newTest(t, 4<<20, stdLimits(4096), Config{Size: 1 << 20, MaxDirtyAge: time.Hour})
	data := fill(DefaultWriteAround, 5)
	if c.WriteCached(data, 0) {
		t.Fatal("WriteCached took a write that goes around the pages")
	}
	if err := c.WriteAt(ctx, data, 4096, 0); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(dev.Current(4096, int64(len(data))), data) {
		t.Fatal("write-around not on the backend at ack")
	}
	if st := c.Stats(); st.DirtyBytes != 0 || st.WriteAroundBytes != uint64(len(data)) {
		t.Fatalf("stats after a write-around: %+v", st)
	}
	got := make([]byte, len(data))
	if err := c.ReadAt(ctx, got, 4096); err != nil || !bytes.Equal(got, data) {
		t.Fatalf("read back: %v", err)
	}
}

// TestWriteAroundSequentialStream checks the sequential cutoff: 64 KiB writes (a quarter of
// WriteAround) are cached until their stream has written WriteAround bytes in a row, then go
// around, WriteCached included; a write elsewhere starts a new stream; small sequential writes
// always stay cached.
func TestWriteAroundSequentialStream(t *testing.T) {
	ctx := context.Background()
	const wa, n = 256 << 10, 64 << 10
	c, _ := newTest(t, 16<<20, stdLimits(4096), Config{Size: 4 << 20, MaxDirtyAge: time.Hour, WriteAround: wa})
	data := fill(n, 3)
	for i := int64(0); i < 4; i++ { // 256 KiB in a row, all cached
		if !c.WriteCached(data, i*n) {
			t.Fatalf("write %d of the stream not cached", i)
		}
	}
	if st := c.Stats(); st.WriteAroundBytes != 0 {
		t.Fatalf("the first %d bytes of a stream went around: %+v", wa, st)
	}
	if c.WriteCached(data, 4*n) {
		t.Fatal("WriteCached took a write that continues a 256 KiB stream")
	}
	for i := int64(4); i < 8; i++ {
		if err := c.WriteAt(ctx, data, i*n, 0); err != nil {
			t.Fatal(err)
		}
	}
	if st := c.Stats(); st.WriteAroundBytes != 4*n {
		t.Fatalf("written around %d bytes, want %d", st.WriteAroundBytes, 4*n)
	}
	if err := c.WriteAt(ctx, data, 8<<20, 0); err != nil { // elsewhere: a new stream, cached
		t.Fatal(err)
	}
	small := fill(4096, 4)
	for off := int64(12 << 20); off < 12<<20+2*wa; off += 4096 {
		if err := c.WriteAt(ctx, small, off, 0); err != nil {
			t.Fatal(err)
		}
	}
	if st := c.Stats(); st.WriteAroundBytes != 4*n {
		t.Fatalf("a new stream or small sequential writes went around: %d bytes, want %d", st.WriteAroundBytes, 4*n)
	}
	got := make([]byte, n)
	for i := int64(0); i < 8; i++ {
		if err := c.ReadAt(ctx, got, i*n); err != nil || !bytes.Equal(got, data) {
			t.Fatalf("read back %d: %v", i, err)
		}
	}
}

// TestWriteAroundSupersedesDirty writes a dirty page, holds its write-back in flight and writes
// around over it: the write-around must wait for that write-back (an older write landing after
// it would win on the target), the page must take the new data and stay dirty, and after a Flush
// the backend must hold the new data with no overlapping writes ever in flight.
func TestWriteAroundSupersedesDirty(t *testing.T) {
	ctx := context.Background()
	c, dev := newTest(t, 4<<20, stdLimits(4096), Config{Size: 1 << 20, MaxDirtyAge: time.Hour, WriteAround: 64 << 10})
	old := fill(8192, 1)
	if err := c.WriteAt(ctx, old, 0, 0); err != nil {
		t.Fatal(err)
	}
	flushed, release := flushWithWriteBackHeld(c, dev, 0, 4096) // the write-back of "old"
	dev.SetBefore(nil)
	newer := fill(64<<10, 9)
	around := make(chan error, 1)
	go func() { around <- c.WriteAt(ctx, newer, 0, 0) }()
	// Wait until the write-around has superseded the dirty pages (a read returns its data); it
	// cannot have reached the backend: the write-back of "old" is still in flight.
	got := make([]byte, 8192)
	for !c.ReadCached(got, 0) || !bytes.Equal(got, newer[:8192]) {
		runtime.Gosched()
	}
	select {
	case err := <-around:
		t.Fatalf("write-around returned (%v) while an older write-back of its range was in flight", err)
	default:
	}
	close(release)
	if err := <-around; err != nil {
		t.Fatal(err)
	}
	if err := <-flushed; err != nil {
		t.Fatal(err)
	}
	if err := c.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(dev.Durable(0, int64(len(newer))), newer) {
		t.Fatal("backend does not hold the write-around's data after Flush")
	}
	if err := c.ReadAt(ctx, got, 0); err != nil || !bytes.Equal(got, newer[:8192]) {
		t.Fatalf("read after flush: %v", err)
	}
	if o := dev.Overlaps(); len(o) != 0 {
		t.Fatalf("overlapping backend writes: %v", o)
	}
}

// TestWriteAroundFailure checks that a failed write-around is reported and leaves no older data
// that could later overwrite a retry.
func TestWriteAroundFailure(t *testing.T) {
	ctx := context.Background()
	c, dev := newTest(t, 4<<20, stdLimits(4096), Config{Size: 1 << 20, MaxDirtyAge: time.Hour, WriteAround: 64 << 10})
	if err := c.WriteAt(ctx, fill(4096, 1), 0, 0); err != nil {
		t.Fatal(err)
	}
	fail := atomic.Bool{}
	fail.Store(true)
	dev.SetFault(func(op fakedev.Op) error {
		if op.Kind == fakedev.Write && op.Len == 64<<10 && fail.Load() {
			return fmt.Errorf("injected: %w", block.ErrIO)
		}
		return nil
	})
	newer := fill(64<<10, 4)
	if err := c.WriteAt(ctx, newer, 0, 0); !errorsIsIO(err) {
		t.Fatalf("failed write-around returned %v, want ErrIO", err)
	}
	fail.Store(false)
	if err := c.WriteAt(ctx, newer, 0, 0); err != nil {
		t.Fatal(err)
	}
	if err := c.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(dev.Durable(0, int64(len(newer))), newer) {
		t.Fatal("older cached data overwrote the write-around")
	}
}

func errorsIsIO(err error) bool { return err != nil && block.Errno(err) == 5 }

// TestWritePathsZeroAllocs checks that neither write path allocates per call once warm: a cached
// 4 KiB write (a page already dirty, and a clean page made dirty) and a write-around.
func TestWritePathsZeroAllocs(t *testing.T) {
	ctx := context.Background()
	be, err := memdev.New(64<<20, memdev.Options{})
	if err != nil {
		t.Fatal(err)
	}
	c, err := New(be, Config{Size: 16 << 20, MaxDirtyAge: time.Hour}, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.shutdown() })
	small, large := make([]byte, 4096), make([]byte, 1<<20)
	if err := c.WriteAt(ctx, large, 8<<20, 0); err != nil { // warm memdev's chunk and the direct list
		t.Fatal(err)
	}
	// Insert every page once (the shards' maps grow as pages first arrive) and flush, so that
	// the measured writes make clean pages dirty.
	for off := int64(0); off < 4<<20; off += 4096 {
		if err := c.WriteAt(ctx, small, off, 0); err != nil {
			t.Fatal(err)
		}
	}
	if err := c.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	off := int64(0)
	if n := allocsPerCall(t, 200, func() {
		off = (off + 4096) % (4 << 20)
		if err := c.WriteAt(ctx, small, off, 0); err != nil {
			t.Fatal(err)
		}
	}); n != 0 {
		t.Errorf("cached 4 KiB write: %v allocs per call", n)
	}
	if n := allocsPerCall(t, 50, func() {
		if err := c.WriteAt(ctx, large, 8<<20, 0); err != nil {
			t.Fatal(err)
		}
	}); n != 0 {
		t.Errorf("1 MiB write-around: %v allocs per call", n)
	}
}

// BenchmarkWriteSeq writes sequential streams of 1 MiB and of 128 KiB requests at queue depth 8
// (eight goroutines, each with its own region) over memdev: with no cache (the baseline), through
// the write-back cache with every write cached (WriteAround off: every byte is copied into pages
// and again into a write-back buffer), and with write-around (by size at 1 MiB, by the sequential
// cutoff at 128 KiB). The cached variants include the final Flush.
func BenchmarkWriteSeq(b *testing.B) {
	const devSize, qd = 256 << 20, 8
	for _, size := range []int64{1 << 20, 128 << 10} {
		for _, v := range []struct {
			name   string
			around int64 // 0: no cache
		}{{"off", 0}, {"writeback-cached", -1}, {"writeback-around", DefaultWriteAround}} {
			b.Run(fmt.Sprintf("%dK/%s", size>>10, v.name), func(b *testing.B) {
				benchWriteSeq(b, devSize, qd, size, v.around)
			})
		}
	}
}

func benchWriteSeq(b *testing.B, devSize, qd, size, around int64) {
	ctx := context.Background()
	be, err := memdev.New(devSize, memdev.Options{})
	if err != nil {
		b.Fatal(err)
	}
	var d block.Device = be
	if around != 0 {
		c, err := New(be, Config{Size: 64 << 20, WriteAround: around}, nil)
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { c.shutdown() })
		d = c
	}
	buf := make([]byte, 1<<20)
	for off := int64(0); off < devSize; off += int64(len(buf)) { // memdev allocates chunks on first write
		if err := be.WriteAt(ctx, buf, off, 0); err != nil {
			b.Fatal(err)
		}
	}
	// Warm the stack: the cache's pages are touched (mmap'd memory faults in on first use) and
	// its write-back buffers grown, as in a gateway that has been running.
	for off := int64(0); off < 128<<20; off += int64(len(buf)) {
		if err := d.WriteAt(ctx, buf, off, 0); err != nil {
			b.Fatal(err)
		}
	}
	if err := d.Flush(ctx); err != nil {
		b.Fatal(err)
	}
	b.SetBytes(size)
	b.ReportAllocs()
	b.SetParallelism(int((qd + int64(runtime.GOMAXPROCS(0)) - 1) / int64(runtime.GOMAXPROCS(0))))
	var next atomic.Int64
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		p := make([]byte, size)
		region := (next.Add(1) - 1) % qd * (devSize / qd)
		for i := int64(0); pb.Next(); i++ {
			if err := d.WriteAt(ctx, p, region+i%(devSize/qd/size)*size, 0); err != nil {
				b.Error(err)
				return
			}
		}
	})
	if err := d.Flush(ctx); err != nil {
		b.Fatal(err)
	}
}

// TestFlushDuringDirectOpCoversOlderData catches a Flush that succeeds while a direct operation
// (a write-around, a discard, a write-zeroes) has taken acknowledged dirty data out of the cache
// but has not reached the backend yet: a crash after that Flush would bring back data older than
// what the Flush promised. V0 is durable, V1 is written (dirty, acknowledged); while the direct
// operation's backend call is held, a Flush runs: if it succeeds, the backend must hold V1 (or
// the newer data) durably. The superseded dirty page keeps the Flush waiting instead, until its
// deadline.
func TestFlushDuringDirectOpCoversOlderData(t *testing.T) {
	const n = 64 << 10
	for _, tc := range []struct {
		name string
		kind fakedev.Kind
		op   func(ctx context.Context, c *Cache) error
	}{
		{"write-around", fakedev.Write, func(ctx context.Context, c *Cache) error { return c.WriteAt(ctx, fill(n, 7), 0, 0) }},
		{"discard", fakedev.Discard, func(ctx context.Context, c *Cache) error { return c.Discard(ctx, 0, n) }},
		{"write-zeroes", fakedev.Zero, func(ctx context.Context, c *Cache) error { return c.WriteZeroes(ctx, 0, n, 0) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := context.Background()
			c, dev := newTest(t, 4<<20, stdLimits(4096), Config{Size: 1 << 20, MaxDirtyAge: time.Hour, WriteAround: n})
			v0, v1 := fill(4096, 1), fill(4096, 2)
			if err := c.WriteAt(ctx, v0, 0, 0); err != nil {
				t.Fatal(err)
			}
			if err := c.Flush(ctx); err != nil {
				t.Fatal(err)
			}
			if err := c.WriteAt(ctx, v1, 0, 0); err != nil {
				t.Fatal(err)
			}
			var flushErr error
			var durable []byte
			var once atomic.Bool
			dev.SetBefore(func(op fakedev.Op) {
				if op.Kind != tc.kind || op.Len != n || !once.CompareAndSwap(false, true) {
					return
				}
				fctx, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
				defer cancel()
				flushErr = c.Flush(fctx)
				durable = dev.Durable(0, 4096)
			})
			if err := tc.op(ctx, c); err != nil {
				t.Fatal(err)
			}
			if !once.Load() {
				t.Fatal("the direct operation never reached the backend")
			}
			if flushErr == nil && bytes.Equal(durable, v0) {
				t.Fatal("a Flush succeeded while the acknowledged V1 was neither in the cache nor on the backend: a crash would return V0")
			}
			if err := c.Flush(ctx); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// TestOverlappingWritersConverge runs writers that overlap on purpose (cached writes, FUA writes,
// write-arounds and discards over the same 512 KiB, with flushes and reads) and checks that once
// they are done and a Flush succeeded, the cache and the backend's durable image agree on every
// byte: no dirty page was left holding data older than what reached the backend, and no cached
// page hides what the backend holds. (Which writer wins a block is the client's race; that the
// two copies agree is the cache's.) Overlapping write-arounds may be in flight on the backend at
// once, as their writers sent them, so the fake's overlap report is not checked here.
func TestOverlappingWritersConverge(t *testing.T) {
	ctx := context.Background()
	const region, around = 512 << 10, 64 << 10
	c, dev := newTest(t, 4<<20, stdLimits(4096), Config{Size: 256 << 10, DirtyLimit: 128 << 10, MaxDirtyAge: time.Millisecond, Workers: 4, WriteAround: around})
	var wg sync.WaitGroup
	errs := make(chan error, 4)
	for w := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(w), 7))
			for i := range 300 {
				n := int64(1+rng.IntN(4)) * 4096
				if rng.IntN(3) == 0 {
					n = around
				}
				off := rng.Int64N((region-n)/4096) * 4096
				var err error
				switch r := rng.IntN(20); {
				case r == 0:
					err = c.Discard(ctx, off, n)
				case r == 1:
					err = c.Flush(ctx)
				case r < 5:
					err = c.ReadAt(ctx, make([]byte, n), off)
				default:
					var flags block.WriteFlags
					if r == 5 {
						flags = block.FUA
					}
					err = c.WriteAt(ctx, fill(int(n), byte(w*64+i)), off, flags)
				}
				if err != nil {
					errs <- fmt.Errorf("writer %d op %d: %w", w, i, err)
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	if err := c.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	got := make([]byte, region)
	if err := c.ReadAt(ctx, got, 0); err != nil {
		t.Fatal(err)
	}
	if durable := dev.Durable(0, region); !bytes.Equal(got, durable) {
		for i := range got {
			if got[i] != durable[i] {
				t.Fatalf("after Flush the cache and the backend disagree from byte %d", i)
			}
		}
	}
}

// TestWriteAroundCleansSuperseded checks that the dirty pages a write-around superseded are
// clean once its backend write succeeded (the backend holds their data: writing them back again
// would write it twice), except sectors outside its range, which stay dirty, and pages written
// again while the write-around was in flight, whose newer data must still be written back.
func TestWriteAroundCleansSuperseded(t *testing.T) {
	ctx := context.Background()
	c, dev := newTest(t, 4<<20, stdLimits(512), Config{Size: 1 << 20, MaxDirtyAge: time.Hour, WriteAround: 64 << 10})
	// Page 1 dirty inside the range; page 16 dirty across its end (sectors 0-3 inside, 4-7 not);
	// page 3 rewritten while the write-around's backend write is held.
	for _, w := range []struct{ off, n int64 }{{4096, 4096}, {3 * 4096, 4096}, {16 * 4096, 4096}} {
		if err := c.WriteAt(ctx, fill(int(w.n), 1), w.off, 0); err != nil {
			t.Fatal(err)
		}
	}
	around := fill(64<<10+2048, 2)
	newer := fill(4096, 3)
	held := make(chan struct{})
	dev.SetBefore(func(op fakedev.Op) {
		if op.Kind == fakedev.Write && op.Len == int64(len(around)) {
			dev.SetBefore(nil)
			if err := c.WriteAt(ctx, newer, 3*4096, 0); err != nil {
				t.Error(err)
			}
			close(held)
		}
	})
	if err := c.WriteAt(ctx, around, 0, 0); err != nil {
		t.Fatal(err)
	}
	<-held
	if n := c.Stats().SupersededCleaned; n != 1 {
		t.Fatalf("%d superseded pages cleaned, want 1 (page 1)", n)
	}
	if d := c.DirtyBytes(); d != 2*4096 {
		t.Fatalf("dirty %d after the write-around, want pages 3 (rewritten) and 16 (partly outside)", d)
	}
	dev.ResetLog()
	if err := c.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	var written int64
	for _, op := range dev.Log() {
		if op.Kind == fakedev.Write {
			written += op.Len
		}
	}
	if written != 4096+2048 {
		t.Fatalf("the flush wrote %d bytes, want page 3 and the half of page 16 outside the write-around", written)
	}
	want := bytes.Clone(around)
	copy(want[3*4096:], newer)
	if !bytes.Equal(dev.Durable(0, int64(len(want))), want) || !bytes.Equal(dev.Durable(16*4096+2048, 2048), fill(4096, 1)[2048:]) {
		t.Fatal("the backend does not hold the newest data")
	}
}

// TestWriteAroundFreesEmptiedPages: a write-around over clean cached pages takes them out of the
// index and gives their slots back, so that later misses in a full cache take those slots
// without evicting a page anybody may read again.
func TestWriteAroundFreesEmptiedPages(t *testing.T) {
	ctx := context.Background()
	c, _ := newTest(t, 4<<20, stdLimits(512), Config{Size: 1 << 20, ReadAhead: -1, ReadAround: -1,
		WriteAround: 64 << 10, MaxDirtyAge: time.Hour})
	buf := make([]byte, 64<<10)
	readRange := func(off, n int64) {
		t.Helper()
		for o := off; o < off+n; o += int64(len(buf)) {
			if err := c.ReadAt(ctx, buf, o); err != nil {
				t.Fatal(err)
			}
		}
	}
	readRange(0, 1<<20) // every slot holds a clean page of the first MiB
	if st := c.Stats(); st.Misses != 256 || st.Evictions != 0 {
		t.Fatalf("filling: %d misses, %d evictions; want 256 and 0", st.Misses, st.Evictions)
	}
	if err := c.WriteAt(ctx, fill(256<<10, 1), 0, 0); err != nil {
		t.Fatal(err)
	}
	if st := c.Stats(); st.WriteAroundBytes != 256<<10 {
		t.Fatalf("%d bytes written around, want the 256 KiB write", st.WriteAroundBytes)
	}
	readRange(2<<20, 256<<10) // 64 misses: each takes a freed slot
	if st := c.Stats(); st.Misses != 256+64 || st.Evictions != 0 {
		t.Fatalf("after the write-around: %d misses, %d evictions; want 320 and 0", st.Misses, st.Evictions)
	}
	readRange(256<<10, 768<<10) // the pages the write-around did not cross are all still cached
	if st := c.Stats(); st.Misses != 256+64 || st.Evictions != 0 {
		t.Fatalf("the untouched pages: %d misses, %d evictions; want 320 and 0", st.Misses, st.Evictions)
	}
}
