package cache

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"

	"github.com/iser-blk/iser-blk/block"
	"github.com/iser-blk/iser-blk/cache/internal/fakedev"
	"github.com/iser-blk/iser-blk/pool"
)

func stdLimits(bs uint32) block.Limits {
	return block.Limits{
		LogicalBlockSize: bs, PhysicalBlockSize: bs, MaxTransfer: 1 << 20,
		CanFlush: true, CanFUA: true, CanDiscard: true, CanWriteZeroes: true, DiscardZeroes: true,
		VolatileCache: true,
	}
}

func newTest(t testing.TB, devSize int64, lim block.Limits, cfg Config) (*Cache, *fakedev.Dev) {
	t.Helper()
	dev := fakedev.New(devSize, lim)
	c, err := New(dev, cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.shutdown() })
	return c, dev
}

func fill(n int, seed byte) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = seed + byte(i*7)
	}
	return b
}

func TestParseConfig(t *testing.T) {
	for _, tc := range []struct {
		mode, size, dirty string
		want              Config
		ok                bool
	}{
		{"", "", "", Config{Mode: WriteBack, Size: 1 << 30, DirtyLimit: 512 << 20}, true},
		{"writeback", "1GiB", "50%", Config{Mode: WriteBack, Size: 1 << 30, DirtyLimit: 512 << 20}, true},
		{"writethrough", "256MiB", "64MiB", Config{Mode: WriteThrough, Size: 256 << 20, DirtyLimit: 64 << 20}, true},
		{"off", "1G", "10%", Config{Mode: Off, Size: 1e9, DirtyLimit: 1e8}, true},
		{"bogus", "", "", Config{}, false},
		{"", "lots", "", Config{}, false},
		{"", "1GiB", "150%", Config{}, false},
		{"", "1GiB", "0%", Config{}, false},
		{"", "1GiB", "2GiB", Config{}, false},
		{"", "0", "", Config{}, false},
	} {
		got, err := ParseConfig(tc.mode, tc.size, tc.dirty)
		if (err == nil) != tc.ok {
			t.Errorf("ParseConfig(%q,%q,%q) error %v, want ok=%v", tc.mode, tc.size, tc.dirty, err, tc.ok)
			continue
		}
		if tc.ok && (got.Mode != tc.want.Mode || got.Size != tc.want.Size || got.DirtyLimit != tc.want.DirtyLimit) {
			t.Errorf("ParseConfig(%q,%q,%q) = %+v, want %+v", tc.mode, tc.size, tc.dirty, got, tc.want)
		}
	}
}

func TestWrapOffReturnsBackend(t *testing.T) {
	dev := fakedev.New(1<<20, stdLimits(512))
	got, err := Wrap(dev, Config{Mode: Off}, nil)
	if err != nil || got != block.Device(dev) {
		t.Fatalf("Wrap(off) = %v, %v; want the backend itself", got, err)
	}
	got, err = Wrap(dev, Config{Size: 1 << 20}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := got.(*Cache); !ok {
		t.Fatalf("Wrap(writeback) = %T", got)
	}
	if err := got.Close(); err != nil {
		t.Fatal(err)
	}
}

func TestLimits(t *testing.T) {
	lim := stdLimits(512)
	lim.CanFUA = false
	lim.VolatileCache = false
	c, _ := newTest(t, 1<<20, lim, Config{Size: 1 << 20})
	l := c.Limits()
	if !l.VolatileCache || !l.CanFlush || !l.CanFUA || l.MaxTransfer != lim.MaxTransfer || c.BlockSize() != 512 || c.Size() != 1<<20 {
		t.Fatalf("limits %+v", l)
	}
}

func TestWriteBackBasics(t *testing.T) {
	ctx := context.Background()
	c, dev := newTest(t, 4<<20, stdLimits(512), Config{Size: 1 << 20, MaxDirtyAge: time.Hour})
	data := fill(8192, 1)
	if err := c.WriteAt(ctx, data, 4096, 0); err != nil {
		t.Fatal(err)
	}
	if got := dev.Current(4096, 8192); bytes.Equal(got, data) {
		t.Fatal("a small write reached the backend at once in write-back mode")
	}
	got := make([]byte, 8192)
	if err := c.ReadAt(ctx, got, 4096); err != nil || !bytes.Equal(got, data) {
		t.Fatalf("read back: %v", err)
	}
	// A read spanning cached and uncached pages merges both.
	got = make([]byte, 16384)
	if err := c.ReadAt(ctx, got, 0); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got[4096:12288], data) || !bytes.Equal(got[:4096], make([]byte, 4096)) {
		t.Fatal("merged read is wrong")
	}
	if c.Stats().DirtyBytes != 8192 {
		t.Fatalf("dirty %d, want 8192", c.Stats().DirtyBytes)
	}
	if err := c.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	if got := dev.Durable(4096, 8192); !bytes.Equal(got, data) {
		t.Fatal("data not durable after Flush")
	}
	if st := c.Stats(); st.DirtyBytes != 0 || st.Flushes != 1 || st.WriteBackBytes != 8192 {
		t.Fatalf("stats after flush: %+v", st)
	}
	for _, op := range dev.Log() {
		if op.Kind == fakedev.Write && op.Len != 8192 {
			t.Fatalf("two adjacent dirty pages were not written back as one request: %+v", op)
		}
	}
}

func TestSubPageWrites(t *testing.T) {
	ctx := context.Background()
	c, dev := newTest(t, 1<<20, stdLimits(512), Config{Size: 1 << 20, MaxDirtyAge: time.Hour})
	base := fill(4096, 9)
	if err := dev.WriteAt(ctx, base, 8192, 0); err != nil {
		t.Fatal(err)
	}
	dev.ResetLog()
	// Write sectors 1 and 5 of page 2 without the page being cached.
	s1, s5 := fill(512, 100), fill(512, 200)
	if err := c.WriteAt(ctx, s1, 8192+512, 0); err != nil {
		t.Fatal(err)
	}
	if err := c.WriteAt(ctx, s5, 8192+5*512, 0); err != nil {
		t.Fatal(err)
	}
	want := append([]byte(nil), base...)
	copy(want[512:], s1)
	copy(want[5*512:], s5)
	got := make([]byte, 4096)
	if err := c.ReadAt(ctx, got, 8192); err != nil || !bytes.Equal(got, want) {
		t.Fatalf("sub-page merge wrong (%v)", err)
	}
	if err := c.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(dev.Durable(8192, 4096), want) {
		t.Fatal("backend differs after flush")
	}
	for _, op := range dev.Log() {
		if op.Kind == fakedev.Write && op.Len != 512 && op.Off >= 8192 {
			t.Fatalf("clean sectors were written back: %+v", op)
		}
	}
}

func TestFUADurableAtAck(t *testing.T) {
	ctx := context.Background()
	for _, nativeFUA := range []bool{true, false} {
		t.Run(fmt.Sprint("nativeFUA=", nativeFUA), func(t *testing.T) {
			lim := stdLimits(4096)
			lim.CanFUA = nativeFUA
			c, dev := newTest(t, 1<<20, lim, Config{Size: 1 << 20, MaxDirtyAge: time.Hour})
			data := fill(4096, 3)
			if err := c.WriteAt(ctx, data, 4096, block.FUA); err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(dev.Durable(4096, 4096), data) {
				t.Fatal("FUA write not durable at ack")
			}
			if c.Stats().DirtyBytes != 0 {
				t.Fatal("page still dirty after FUA write-back")
			}
		})
	}
}

func TestWriteThrough(t *testing.T) {
	ctx := context.Background()
	c, dev := newTest(t, 1<<20, stdLimits(4096), Config{Mode: WriteThrough, Size: 1 << 20})
	data := fill(65536, 4)
	if err := c.WriteAt(ctx, data, 0, 0); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(dev.Current(0, 65536), data) {
		t.Fatal("write-through write not on the backend at ack")
	}
	if c.Stats().DirtyBytes != 0 || c.Limits().VolatileCache != true {
		// VolatileCache follows the backend in write-through mode (the fake has one).
		t.Fatalf("stats %+v limits %+v", c.Stats(), c.Limits())
	}
	got := make([]byte, 65536)
	before := len(dev.Log())
	if err := c.ReadAt(ctx, got, 0); err != nil || !bytes.Equal(got, data) {
		t.Fatal("read back")
	}
	if len(dev.Log()) != before {
		t.Fatal("read of just-written data missed the cache")
	}
}

// blockingWrites makes backend writes that overlap [off, off+n) wait until release is closed.
func blockingWrites(dev *fakedev.Dev, off, n int64) (started <-chan struct{}, release chan struct{}) {
	st := make(chan struct{}, 100)
	rel := make(chan struct{})
	dev.SetBefore(func(op fakedev.Op) {
		if op.Kind == fakedev.Write && op.Off < off+n && off < op.Off+op.Len {
			st <- struct{}{}
			<-rel
		}
	})
	return st, rel
}

// flushWithWriteBackHeld starts a Flush and returns once the write-back it waits for, of a dirty
// page overlapping [off, off+n), is in flight and held there until release is closed.
func flushWithWriteBackHeld(c *Cache, dev *fakedev.Dev, off, n int64) (flushed <-chan error, release chan struct{}) {
	started, release := blockingWrites(dev, off, n)
	done := make(chan error, 1)
	go func() { done <- c.Flush(context.Background()) }()
	<-started
	return done, release
}

func TestWriteDuringWriteBackStaysDirty(t *testing.T) {
	ctx := context.Background()
	c, dev := newTest(t, 1<<20, stdLimits(4096), Config{Size: 1 << 20, MaxDirtyAge: time.Hour})
	old, newer := fill(4096, 1), fill(4096, 2)
	if err := c.WriteAt(ctx, old, 0, 0); err != nil {
		t.Fatal(err)
	}
	flushed, release := flushWithWriteBackHeld(c, dev, 0, 4096) // the write-back of "old"
	if err := c.WriteAt(ctx, newer, 0, 0); err != nil {
		t.Fatal(err)
	}
	dev.SetBefore(nil)
	close(release)
	if err := <-flushed; err != nil {
		t.Fatal(err)
	}
	// Had the completing write-back of "old" marked the page clean, "newer" would never reach
	// the backend.
	if err := c.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(dev.Durable(0, 4096), newer) {
		t.Fatal("newer data lost")
	}
	var writes []fakedev.Op
	for _, op := range dev.Log() {
		if op.Kind == fakedev.Write {
			writes = append(writes, op)
		}
	}
	if len(writes) != 2 || writes[1].Start < writes[0].End {
		t.Fatalf("want two ordered write-backs of the page, got %+v", writes)
	}
	if o := dev.Overlaps(); len(o) != 0 {
		t.Fatalf("overlapping backend writes: %v", o)
	}
}

func TestDiscardDoesNotResurrect(t *testing.T) {
	ctx := context.Background()
	c, dev := newTest(t, 1<<20, stdLimits(4096), Config{Size: 1 << 20, MaxDirtyAge: time.Hour})
	if err := c.WriteAt(ctx, fill(8192, 5), 0, 0); err != nil {
		t.Fatal(err)
	}
	started, release := blockingWrites(dev, 0, 8192)
	go func() { _ = c.Flush(ctx) }()
	<-started
	discarded := make(chan error, 1)
	go func() { discarded <- c.Discard(ctx, 0, 8192) }()
	select {
	case err := <-discarded:
		t.Fatalf("discard returned (%v) while an older write-back of its range was in flight", err)
	case <-time.After(50 * time.Millisecond):
	}
	dev.SetBefore(nil)
	close(release)
	if err := <-discarded; err != nil {
		t.Fatal(err)
	}
	if err := c.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(dev.Durable(0, 8192), make([]byte, 8192)) {
		t.Fatal("old data resurrected after discard")
	}
	got := make([]byte, 8192)
	if err := c.ReadAt(ctx, got, 0); err != nil || !bytes.Equal(got, make([]byte, 8192)) {
		t.Fatal("cache returns discarded data")
	}
	// The write-back that was in flight (the first write at 0) ended before the discard began.
	// (The page it wrote stayed dirty with zeroes and is written back once more afterwards.)
	log := dev.Log()
	var wEnd, dStart uint64
	for _, op := range log {
		if op.Kind == fakedev.Write && op.Off == 0 && wEnd == 0 {
			wEnd = op.End
		}
		if op.Kind == fakedev.Discard {
			dStart = op.Start
		}
	}
	if dStart < wEnd {
		t.Fatalf("discard started (seq %d) before the write-back ended (seq %d)", dStart, wEnd)
	}
}

// TestBackendFailureThenRecovery is acceptance item 2.
func TestBackendFailureThenRecovery(t *testing.T) {
	ctx := context.Background()
	c, dev := newTest(t, 8<<20, stdLimits(4096), Config{Size: 4 << 20, MaxDirtyAge: time.Hour})
	var failing atomic.Bool
	failing.Store(true)
	dev.SetFault(func(op fakedev.Op) error {
		if op.Kind == fakedev.Write && failing.Load() {
			return fmt.Errorf("fake target: WRITE failed: %w", block.ErrIO)
		}
		return nil
	})
	want := map[int64][]byte{}
	for i := int64(0); i < 64; i++ {
		d := fill(4096, byte(i))
		off := i * 3 * 4096
		if err := c.WriteAt(ctx, d, off, 0); err != nil {
			t.Fatalf("write acknowledged path failed: %v", err)
		}
		want[off] = d
	}
	for i := 0; i < 3; i++ { // every FLUSH fails while the backend does
		err := c.Flush(ctx)
		if err == nil || !errors.Is(err, block.ErrIO) {
			t.Fatalf("Flush %d with failing backend: %v, want an ErrIO", i, err)
		}
		if i == 0 {
			t.Logf("flush error: %v", err)
		}
	}
	// Every acknowledged write is still readable while the backend fails.
	for off, d := range want {
		got := make([]byte, 4096)
		if err := c.ReadAt(ctx, got, off); err != nil || !bytes.Equal(got, d) {
			t.Fatalf("acknowledged data at %d lost while the backend fails", off)
		}
	}
	if c.Stats().WriteBackErrors == 0 || c.Stats().DirtyBytes != 64*4096 {
		t.Fatalf("stats %+v", c.Stats())
	}
	failing.Store(false)
	if err := c.Flush(ctx); err != nil {
		t.Fatalf("Flush after recovery: %v", err)
	}
	for off, d := range want {
		if !bytes.Equal(dev.Durable(off, 4096), d) {
			t.Fatalf("data at %d not durable after recovery", off)
		}
	}
}

func TestFlushFailsWhenBackendFlushFails(t *testing.T) {
	ctx := context.Background()
	c, dev := newTest(t, 1<<20, stdLimits(4096), Config{Size: 1 << 20})
	dev.SetFault(func(op fakedev.Op) error {
		if op.Kind == fakedev.Flush {
			return fmt.Errorf("SYNCHRONIZE CACHE failed: %w", block.ErrMedium)
		}
		return nil
	})
	if err := c.WriteAt(ctx, fill(4096, 1), 0, 0); err != nil {
		t.Fatal(err)
	}
	if err := c.Flush(ctx); !errors.Is(err, block.ErrMedium) {
		t.Fatalf("Flush: %v, want the backend's flush error", err)
	}
}

// TestDirtyLimitStorm is acceptance item 3 (first half): many writers, a slow backend, and the
// dirty bytes never above the limit; writers are slowed down, never failed.
func TestDirtyLimitStorm(t *testing.T) {
	ctx := context.Background()
	const limit = 256 << 10
	c, dev := newTest(t, 64<<20, stdLimits(4096), Config{Size: 2 << 20, DirtyLimit: limit, Workers: 2, MaxDirtyAge: time.Hour})
	var slow atomic.Int64
	dev.SetBefore(func(op fakedev.Op) {
		if op.Kind == fakedev.Write && slow.Add(1)%4 == 0 {
			time.Sleep(time.Millisecond) // a slow target, not synchronisation
		}
	})
	stop := make(chan struct{})
	var maxSeen atomic.Int64
	var wgMon sync.WaitGroup
	wgMon.Add(1)
	go func() {
		defer wgMon.Done()
		for {
			if d := c.Stats().DirtyBytes; d > maxSeen.Load() {
				maxSeen.Store(d)
			}
			if r := c.reserved.Load(); r*c.ps > limit {
				t.Errorf("reserved dirty %d > limit", r*c.ps)
			}
			select {
			case <-stop:
				return
			default:
			}
		}
	}()
	var wg sync.WaitGroup
	for w := 0; w < 16; w++ {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			buf := fill(4096, byte(w))
			for i := 0; i < 200; i++ {
				off := int64((w*200+i)%(64<<8)) * 4096
				if err := c.WriteAt(ctx, buf, off, 0); err != nil {
					t.Errorf("writer %d: %v", w, err)
					return
				}
			}
		}(w)
	}
	wg.Wait()
	close(stop)
	wgMon.Wait()
	st := c.Stats()
	t.Logf("max dirty seen %d (limit %d), throttled writes %d, write-back bytes %d", maxSeen.Load(), limit, st.ThrottledWrites, st.WriteBackBytes)
	if maxSeen.Load() > limit {
		t.Fatalf("dirty bytes reached %d > limit %d", maxSeen.Load(), limit)
	}
	if st.ThrottledWrites == 0 {
		t.Fatal("no writer was throttled: the storm did not reach the limit")
	}
	if err := c.Flush(ctx); err != nil {
		t.Fatal(err)
	}
}

// TestSequentialWritesCoalesce is acceptance item 3 (second half): 4 KiB sequential writes
// reach the backend as requests of at least 512 KiB (tgt's 512 KiB limit and a 1 MiB one).
func TestSequentialWritesCoalesce(t *testing.T) {
	for _, maxXfer := range []int64{512 << 10, 1 << 20} {
		t.Run(fmt.Sprint("maxTransfer=", maxXfer), func(t *testing.T) {
			ctx := context.Background()
			lim := stdLimits(512)
			lim.MaxTransfer = maxXfer
			c, dev := newTest(t, 128<<20, lim, Config{Size: 16 << 20, DirtyLimit: 8 << 20, MaxDirtyAge: time.Hour}) // default low watermark
			buf := fill(4096, 7)
			const total = 32 << 20
			for off := int64(0); off < total; off += 4096 {
				if err := c.WriteAt(ctx, buf, off, 0); err != nil {
					t.Fatal(err)
				}
			}
			before := len(dev.Log())
			if err := c.Flush(ctx); err != nil {
				t.Fatal(err)
			}
			var small, writes int
			var bytesW int64
			for i, op := range dev.Log() {
				if op.Kind != fakedev.Write {
					continue
				}
				writes++
				bytesW += op.Len
				if op.Len < 512<<10 && i < before {
					small++
					t.Errorf("write-back of %d bytes before the final flush", op.Len)
				}
			}
			if bytesW != total {
				t.Fatalf("backend got %d bytes, want %d", bytesW, total)
			}
			t.Logf("%d 4 KiB writes reached the backend as %d writes (mean %d KiB); %d before the final flush",
				total/4096, writes, bytesW/int64(writes)>>10, before)
			if small > 0 || writes > total/(512<<10)+8 {
				t.Fatalf("poor coalescing: %d writes, %d small", writes, small)
			}
		})
	}
}

func TestReadAheadAndHits(t *testing.T) {
	ctx := context.Background()
	c, dev := newTest(t, 16<<20, stdLimits(4096), Config{Size: 8 << 20, ReadAhead: 256 << 10})
	src := fill(4<<20, 11)
	for off := 0; off < len(src); off += 1 << 20 {
		if err := dev.WriteAt(ctx, src[off:off+1<<20], int64(off), 0); err != nil {
			t.Fatal(err)
		}
	}
	dev.ResetLog()
	got := make([]byte, 4096)
	for off := int64(0); off < 4<<20; off += 4096 {
		if err := c.ReadAt(ctx, got, off); err != nil || !bytes.Equal(got, src[off:off+4096]) {
			t.Fatalf("read at %d: %v", off, err)
		}
	}
	reads := 0
	for _, op := range dev.Log() {
		if op.Kind == fakedev.Read {
			reads++
		}
	}
	st := c.Stats()
	t.Logf("1024 sequential 4 KiB reads → %d backend reads; stats %+v", reads, st)
	if reads > 40 {
		t.Fatalf("read-ahead ineffective: %d backend reads", reads)
	}
	if st.Hits < 900 {
		t.Fatalf("only %d hits", st.Hits)
	}
}

func TestEvictionKeepsDirty(t *testing.T) {
	ctx := context.Background()
	// A tiny cache (64 pages), dirty limit = the whole cache, and a backend that cannot write:
	// nothing dirty may be evicted by reads streaming through.
	c, dev := newTest(t, 16<<20, stdLimits(4096), Config{Size: 256 << 10, DirtyLimit: 128 << 10, MaxDirtyAge: time.Hour, ReadAround: -1})
	dev.SetFault(func(op fakedev.Op) error {
		if op.Kind == fakedev.Write {
			return block.ErrIO
		}
		return nil
	})
	for i := int64(0); i < 32; i++ {
		if err := c.WriteAt(ctx, fill(4096, byte(i)), i*4096, 0); err != nil {
			t.Fatal(err)
		}
	}
	buf := make([]byte, 64<<10)
	for off := int64(1 << 20); off < 8<<20; off += int64(len(buf)) {
		if err := c.ReadAt(ctx, buf, off); err != nil {
			t.Fatal(err)
		}
	}
	for i := int64(0); i < 32; i++ {
		got := make([]byte, 4096)
		if err := c.ReadAt(ctx, got, i*4096); err != nil || !bytes.Equal(got, fill(4096, byte(i))) {
			t.Fatalf("dirty page %d evicted", i)
		}
	}
	if c.Stats().Evictions == 0 {
		t.Fatal("no evictions happened; the test did not test anything")
	}
	if err := c.Flush(ctx); !errors.Is(err, block.ErrIO) {
		t.Fatalf("Flush while write-backs fail: %v", err)
	}
	dev.SetFault(nil)
	if err := c.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	for i := int64(0); i < 32; i++ {
		if !bytes.Equal(dev.Durable(i*4096, 4096), fill(4096, byte(i))) {
			t.Fatalf("page %d not on the backend after recovery", i)
		}
	}
}

func TestWriteZeroesAndDiscard(t *testing.T) {
	ctx := context.Background()
	for _, native := range []bool{true, false} {
		t.Run(fmt.Sprint("native=", native), func(t *testing.T) {
			lim := stdLimits(512)
			lim.CanWriteZeroes = native
			c, dev := newTest(t, 1<<20, lim, Config{Size: 1 << 20, MaxDirtyAge: time.Hour})
			if err := c.WriteAt(ctx, fill(16384, 1), 0, 0); err != nil {
				t.Fatal(err)
			}
			// Zero a range that starts and ends inside pages.
			if err := c.WriteZeroes(ctx, 1024, 8192, 0); err != nil {
				t.Fatal(err)
			}
			want := fill(16384, 1)
			copy(want[1024:1024+8192], make([]byte, 8192))
			got := make([]byte, 16384)
			if err := c.ReadAt(ctx, got, 0); err != nil || !bytes.Equal(got, want) {
				t.Fatalf("after zeroing: %v", err)
			}
			if err := c.Flush(ctx); err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(dev.Durable(0, 16384), want) {
				t.Fatal("backend wrong after zeroing + flush")
			}
			if err := c.WriteZeroes(ctx, 0, 4096, block.FastOnly); native == errors.Is(err, block.ErrNotSupported) && !native {
				t.Fatalf("fast zero: %v", err)
			}
		})
	}
}

func TestRangeChecks(t *testing.T) {
	ctx := context.Background()
	c, _ := newTest(t, 1<<20, stdLimits(4096), Config{Size: 1 << 20})
	for _, err := range []error{
		c.ReadAt(ctx, make([]byte, 4096), 1<<20),
		c.WriteAt(ctx, make([]byte, 100), 0, 0),
		c.Discard(ctx, -4096, 4096),
		c.WriteZeroes(ctx, 4096, 1<<20, 0),
	} {
		if !errors.Is(err, block.ErrInvalid) {
			t.Errorf("got %v, want ErrInvalid", err)
		}
	}
}

func TestCloseFlushesAndReportsFailure(t *testing.T) {
	ctx := context.Background()
	dev := fakedev.New(1<<20, stdLimits(4096))
	c, err := New(dev, Config{Size: 1 << 20, MaxDirtyAge: time.Hour}, nil)
	if err != nil {
		t.Fatal(err)
	}
	data := fill(4096, 8)
	if err := c.WriteAt(ctx, data, 0, 0); err != nil {
		t.Fatal(err)
	}
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(dev.Durable(0, 4096), data) {
		t.Fatal("Close did not flush")
	}
	if err := c.WriteAt(ctx, data, 0, 0); !errors.Is(err, block.ErrClosed) {
		t.Fatalf("write after close: %v", err)
	}

	dev2 := fakedev.New(1<<20, stdLimits(4096))
	c2, err := New(dev2, Config{Size: 1 << 20, MaxDirtyAge: time.Hour}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := c2.WriteAt(ctx, data, 0, 0); err != nil {
		t.Fatal(err)
	}
	dev2.SetFault(func(op fakedev.Op) error {
		if op.Kind == fakedev.Write {
			return block.ErrIO
		}
		return nil
	})
	if err := c2.Close(); !errors.Is(err, block.ErrIO) {
		t.Fatalf("Close with a failing backend: %v", err)
	}
}

// Abandon (block.Abandoner: the final flush failed or was aborted, and the caller reported the
// loss) runs no final flush, returns no error of one, logs nothing, and closes the cache and the
// backend.
func TestAbandonWritesNothingBackAndLogsNothing(t *testing.T) {
	ctx := context.Background()
	dev := fakedev.New(1<<20, stdLimits(4096))
	core, logs := observer.New(zapcore.DebugLevel)
	c, err := New(dev, Config{Size: 1 << 20, MaxDirtyAge: time.Hour}, zap.New(core))
	if err != nil {
		t.Fatal(err)
	}
	if err := c.WriteAt(ctx, fill(4096, 8), 0, 0); err != nil {
		t.Fatal(err)
	}
	if d := c.DirtyBytes(); d != 4096 {
		t.Fatalf("%d bytes dirty before Abandon, want 4096", d)
	}
	dev.ResetLog()
	if err := c.Abandon(); err != nil {
		t.Fatal(err)
	}
	// The flusher may have begun writing the page back before Abandon stopped it; what Abandon
	// must not do is a final flush of its own, which ends in a backend Flush.
	for _, op := range dev.Log() {
		if op.Kind == fakedev.Flush {
			t.Fatalf("Abandon flushed the backend: %v", dev.Log())
		}
	}
	if loud := logs.Filter(func(e observer.LoggedEntry) bool { return e.Level >= zapcore.WarnLevel }).All(); len(loud) != 0 {
		t.Fatalf("Abandon logged %+v", loud)
	}
	if err := c.WriteAt(ctx, fill(4096, 9), 0, 0); !errors.Is(err, block.ErrClosed) {
		t.Fatalf("write after Abandon: %v", err)
	}
	if err := dev.ReadAt(ctx, make([]byte, 4096), 0); !errors.Is(err, block.ErrClosed) {
		t.Fatalf("the backend after Abandon: %v, want closed", err)
	}
}

func TestReadHitZeroAllocs(t *testing.T) {
	ctx := context.Background()
	c, _ := newTest(t, 4<<20, stdLimits(4096), Config{Size: 4 << 20})
	buf := make([]byte, 4096)
	if err := c.ReadAt(ctx, buf, 0); err != nil {
		t.Fatal(err)
	}
	if err := c.ReadAt(ctx, buf, 0); err != nil {
		t.Fatal(err)
	}
	allocs := allocsPerCall(t, 1000, func() {
		if err := c.ReadAt(ctx, buf, 0); err != nil {
			panic(err)
		}
	})
	if allocs != 0 {
		t.Fatalf("read hit allocates %.1f times", allocs)
	}
}

// BenchmarkReadHit measures steady-state hits; the qd128 variants run 128 goroutines (4 NBD
// connections × 32 requests deep) to show the sharded index does not collapse under contention.
func BenchmarkReadHit(b *testing.B) {
	for _, bc := range []struct {
		size, par int
	}{{4096, 1}, {65536, 1}, {1 << 20, 1}, {4096, 64}} {
		size := bc.size
		b.Run(fmt.Sprintf("%d/qd%d", size, bc.par*runtime.GOMAXPROCS(0)), func(b *testing.B) {
			ctx := context.Background()
			c, _ := newTest(b, 64<<20, stdLimits(4096), Config{Size: 64 << 20, ReadAround: -1}) // warmed by 1 MiB reads
			const span = 32 << 20
			warm := make([]byte, 1<<20)
			for off := int64(0); off < span; off += int64(len(warm)) {
				if err := c.ReadAt(ctx, warm, off); err != nil {
					b.Fatal(err)
				}
			}
			b.SetBytes(int64(size))
			b.ReportAllocs()
			b.ResetTimer()
			var next atomic.Int64
			b.SetParallelism(bc.par)
			b.RunParallel(func(pb *testing.PB) {
				buf := make([]byte, size)
				i := next.Add(7919)
				for pb.Next() {
					i = (i*1103515245 + 12345) & (1<<31 - 1)
					off := (i % (span / int64(size))) * int64(size)
					if err := c.ReadAt(ctx, buf, off); err != nil {
						b.Error(err)
						return
					}
				}
			})
			b.StopTimer()
			if st := c.Stats(); st.Misses > uint64(span/4096)+16 {
				b.Fatalf("not steady state: %+v", st)
			}
		})
	}
}

func BenchmarkWrite4K(b *testing.B) {
	ctx := context.Background()
	c, _ := newTest(b, 256<<20, stdLimits(4096), Config{Size: 64 << 20})
	b.SetBytes(4096)
	b.ReportAllocs()
	b.ResetTimer() // the fake device's 256 MiB images are not the write path's cost
	var next atomic.Int64
	b.RunParallel(func(pb *testing.PB) {
		buf := make([]byte, 4096)
		i := next.Add(7919)
		for pb.Next() {
			i = (i*1103515245 + 12345) & (1<<31 - 1)
			if err := c.WriteAt(ctx, buf, (i%(64<<8))*4096, 0); err != nil {
				b.Error(err)
				return
			}
		}
	})
}

func TestIOPoolStaging(t *testing.T) {
	ctx := context.Background()
	io, err := pool.New(pool.Config{MaxBytes: 8 << 20, MaxClass: 1 << 20})
	if err != nil {
		t.Fatal(err)
	}
	defer io.Close()
	c, dev := newTest(t, 8<<20, stdLimits(4096), Config{Size: 1 << 20, IOPool: io, MaxDirtyAge: time.Hour, WriteAround: -1})
	data := fill(256<<10, 3)
	if err := c.WriteAt(ctx, data, 0, 0); err != nil {
		t.Fatal(err)
	}
	if err := c.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	got := make([]byte, 64<<10)
	if err := c.ReadAt(ctx, got, 1<<20); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(dev.Durable(0, 256<<10), data) {
		t.Fatal("data not on the backend")
	}
	st := io.Stats()
	if st.Gets < 2 || st.InUseBytes != 0 {
		t.Fatalf("staging buffers not taken from (or not returned to) the I/O pool: %+v", st)
	}
}

// TestCachePagesOutsideHeap fills a 128 MiB cache and checks that the Go heap grew by far less:
// only the per-page metadata lives there.
func TestCachePagesOutsideHeap(t *testing.T) {
	ctx := context.Background()
	const size = 128 << 20
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	dev := fakedev.New(size, stdLimits(4096))
	devBytes := int64(2 * size) // the fake keeps two images in the heap
	// Staging buffers come from an I/O pool (outside the heap too), as in production.
	io, err := pool.New(pool.Config{MaxBytes: 64 << 20, MaxClass: 1 << 20})
	if err != nil {
		t.Fatal(err)
	}
	c, err := New(dev, Config{Size: size, IOPool: io, WriteAround: -1}, nil) // 1 MiB writes fill pages
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		c.shutdown()
		if err := io.Close(); err != nil {
			t.Error(err)
		}
	}()
	buf := make([]byte, 1<<20)
	for off := int64(0); off < size; off += int64(len(buf)) {
		if err := c.WriteAt(ctx, buf, off, 0); err != nil {
			t.Fatal(err)
		}
	}
	runtime.GC()
	runtime.ReadMemStats(&after)
	grew := int64(after.HeapAlloc) - int64(before.HeapAlloc) - devBytes
	t.Logf("cache holds %d MiB; Go heap grew by %d KiB besides the fake device", c.Stats().CachedBytes>>20, grew>>10)
	if c.Stats().CachedBytes != size {
		t.Fatalf("cache holds %d bytes, want %d", c.Stats().CachedBytes, size)
	}
	if grew > size/16 {
		t.Fatalf("heap grew by %d bytes for a %d-byte cache: pages are on the Go heap", grew, size)
	}
}

// TestOddDeviceSize uses a device whose size is not a multiple of the page size.
func TestOddDeviceSize(t *testing.T) {
	ctx := context.Background()
	const size = 1<<20 + 1536
	c, dev := newTest(t, size, stdLimits(512), Config{Size: 1 << 20, MaxDirtyAge: time.Hour})
	tail := fill(2048, 42)
	if err := c.WriteAt(ctx, tail, size-2048, 0); err != nil {
		t.Fatal(err)
	}
	got := make([]byte, 2048)
	if err := c.ReadAt(ctx, got, size-2048); err != nil || !bytes.Equal(got, tail) {
		t.Fatalf("tail read: %v", err)
	}
	// Sequential reads up to the end exercise read-ahead clipping at the device end.
	buf := make([]byte, 512)
	for off := int64(size - 64<<10); off < size; off += 512 {
		if err := c.ReadAt(ctx, buf, off); err != nil {
			t.Fatal(err)
		}
	}
	if err := c.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(dev.Durable(size-2048, 2048), tail) {
		t.Fatal("tail not on the backend")
	}
	if err := c.ReadAt(ctx, buf, size); !errors.Is(err, block.ErrInvalid) {
		t.Fatalf("read past the end: %v", err)
	}
}

func TestFlushHonoursContext(t *testing.T) {
	c, dev := newTest(t, 1<<20, stdLimits(4096), Config{Size: 1 << 20, MaxDirtyAge: time.Hour})
	if err := c.WriteAt(context.Background(), fill(4096, 1), 0, 0); err != nil {
		t.Fatal(err)
	}
	_, release := blockingWrites(dev, 0, 4096)
	defer close(release)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	if err := c.Flush(ctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Flush with a stuck backend: %v, want the context's error", err)
	}
	dev.SetBefore(nil)
}

// TestThrottledWriterHonoursContext: a writer blocked at the dirty limit gives up with its
// context's error, never with a spurious I/O error.
//
// It also checks the status's ThrottledSeconds: zero while nobody waited, and at least about the
// time the writer was held at the limit afterwards.
func TestThrottledWriterHonoursContext(t *testing.T) {
	c, dev := newTest(t, 4<<20, stdLimits(4096), Config{Size: 1 << 20, DirtyLimit: 64 << 10, MaxDirtyAge: time.Hour})
	if s := c.CacheStatus().ThrottledSeconds; s != 0 {
		t.Fatalf("throttled %v s before any write", s)
	}
	_, release := blockingWrites(dev, 0, 4<<20)
	defer close(release)
	const wait = 50 * time.Millisecond
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	var err error
	for i := int64(0); i < 64 && err == nil; i++ {
		err = c.WriteAt(ctx, fill(4096, byte(i)), i*4096, 0)
	}
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("writer at the limit: %v, want the context's error", err)
	}
	if c.Stats().DirtyBytes > 64<<10 || c.Stats().ThrottledWrites == 0 {
		t.Fatalf("stats %+v", c.Stats())
	}
	if s := c.CacheStatus().ThrottledSeconds; s < wait.Seconds()/2 || s > 10 {
		t.Fatalf("status: throttled %v s, want about %v", s, wait.Seconds())
	}
	dev.SetBefore(nil)
}

// TestDirtyAgeLimit: a lone dirty page (far below the low watermark) is written back once it
// is older than MaxDirtyAge, without any Flush.
func TestDirtyAgeLimit(t *testing.T) {
	ctx := context.Background()
	c, dev := newTest(t, 1<<20, stdLimits(4096), Config{Size: 1 << 20, MaxDirtyAge: 30 * time.Millisecond})
	data := fill(4096, 77)
	start := time.Now()
	if err := c.WriteAt(ctx, data, 8192, 0); err != nil {
		t.Fatal(err)
	}
	deadline := time.After(10 * time.Second)
	for {
		ch := c.progress.wait() // closed by every write-back completion
		if c.DirtyBytes() == 0 {
			break
		}
		select {
		case <-ch:
		case <-deadline:
			t.Fatal("dirty page never written back by age")
		}
	}
	if age := time.Since(start); age < 30*time.Millisecond {
		t.Fatalf("written back after %v, before the age limit", age)
	}
	if !bytes.Equal(dev.Current(8192, 4096), data) {
		t.Fatal("backend does not have the aged page")
	}
}

// TestFlushNotStarvedByNewWrites: writers that keep dirtying new pages cannot keep a Flush from
// completing; it waits only for what was dirty when it started.
//
// Each writer yields after each write, as a frontend's goroutine does when it goes back to its
// socket for the next request. Writers that never block, on one P (-cpu 1, the gateway's
// GOMAXPROCS on small hosts), each ran a whole 10 ms time slice for every backend operation of
// the flusher (which yields there, SetBefore): a flush then took 3–13 s without the race
// detector (0.5–2 s with it) and once ran past the deadline on a loaded host. That measured the
// scheduler's time slices; a flush whose goal moved with new writes never completes either way.
func TestFlushNotStarvedByNewWrites(t *testing.T) {
	ctx := context.Background()
	c, dev := newTest(t, 64<<20, stdLimits(4096), Config{Size: 8 << 20, DirtyLimit: 4 << 20, MaxDirtyAge: time.Hour})
	dev.SetBefore(func(op fakedev.Op) { runtime.Gosched() })
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for w := 0; w < 4; w++ {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			buf := fill(4096, byte(w))
			for i := int64(0); ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				if err := c.WriteAt(ctx, buf, ((i*4+int64(w))%(16<<8))*4096, 0); err != nil {
					t.Error(err)
					return
				}
				runtime.Gosched()
			}
		}(w)
	}
	fctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	for i := 0; i < 5; i++ {
		if err := c.Flush(fctx); err != nil {
			t.Fatalf("flush %d under a write storm: %v", i, err)
		}
	}
	close(stop)
	wg.Wait()
}

// TestConcurrentSequentialReadsShareFills: readers streaming through the same region at once
// (like the kernel's parallel read-ahead requests) wait for fills in progress instead of reading
// the same pages from the backend again. Read-around is off: a stream of 64 KiB reads goes around
// the pages once it has read ReadAround bytes, and reads around are not shared.
func TestConcurrentSequentialReadsShareFills(t *testing.T) {
	ctx := context.Background()
	c, dev := newTest(t, 16<<20, stdLimits(4096), Config{Size: 16 << 20, ReadAhead: 512 << 10, ReadAround: -1})
	dev.SetBefore(func(op fakedev.Op) { runtime.Gosched() })
	const span = 8 << 20
	var wg sync.WaitGroup
	for r := 0; r < 4; r++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			buf := make([]byte, 64<<10)
			for off := int64(0); off < span; off += int64(len(buf)) {
				if err := c.ReadAt(ctx, buf, off); err != nil {
					t.Error(err)
					return
				}
			}
		}()
	}
	wg.Wait()
	var read int64
	for _, op := range dev.Log() {
		if op.Kind == fakedev.Read {
			read += op.Len
		}
	}
	t.Logf("4 readers × %d MiB: %d MiB read from the backend; stats %+v", span>>20, read>>20, c.Stats())
	if read > 2*span {
		t.Fatalf("backend read %d bytes for 4 concurrent passes over %d", read, span)
	}
}

// TestReadCached checks the non-blocking read path frontends use inline: it answers only when
// every sector is in memory, never reads the backend, and refuses bad ranges and a closed cache.
func TestReadCached(t *testing.T) {
	ctx := context.Background()
	c, dev := newTest(t, 4<<20, stdLimits(512), Config{Size: 1 << 20, ReadAhead: -1})
	data := fill(8192, 3)
	if err := c.WriteAt(ctx, data, 8192, 0); err != nil {
		t.Fatal(err)
	}
	if err := c.WriteAt(ctx, data[:512], 65536, 0); err != nil { // one sector of a page
		t.Fatal(err)
	}
	dev.ResetLog()
	got := make([]byte, 8192)
	for _, tc := range []struct {
		name string
		off  int64
		n    int
		want bool
	}{
		{"two dirty pages", 8192, 8192, true},
		{"inside a page", 8192 + 512, 1024, true},
		{"straddles into an absent page", 12288, 8192, false},
		{"absent", 1 << 20, 4096, false},
		{"valid sector", 65536, 512, true},
		{"page with only one valid sector", 65536, 4096, false},
		{"misaligned", 8193, 512, false},
		{"past the end", 4 << 20, 4096, false},
		{"empty", 8192, 0, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ok := c.ReadCached(got[:tc.n], tc.off)
			if ok != tc.want {
				t.Fatalf("ReadCached = %v, want %v", ok, tc.want)
			}
			if ok {
				want := data[:tc.n]
				if tc.off != 65536 {
					want = data[tc.off-8192 : tc.off-8192+int64(tc.n)]
				}
				if !bytes.Equal(got[:tc.n], want) {
					t.Fatal("ReadCached returned the wrong bytes")
				}
			}
		})
	}
	for _, op := range dev.Log() {
		if op.Kind == fakedev.Read {
			t.Fatalf("ReadCached read the backend: %+v", op)
		}
	}
	allocs := allocsPerCall(t, 1000, func() {
		if !c.ReadCached(got[:4096], 8192) {
			panic("miss")
		}
	})
	if allocs != 0 {
		t.Fatalf("ReadCached allocates %.1f times", allocs)
	}
	c.shutdown()
	if c.ReadCached(got[:4096], 8192) {
		t.Fatal("ReadCached on a closed cache succeeded")
	}
}

func TestWriteCached(t *testing.T) {
	ctx := context.Background()
	const limit = 64 << 10 // 16 dirty pages
	c, dev := newTest(t, 4<<20, stdLimits(512), Config{Size: 1 << 20, DirtyLimit: limit, Workers: 1,
		MaxDirtyAge: time.Hour, LowWater: limit - 4096})
	hold := make(chan struct{})
	dev.SetBefore(func(op fakedev.Op) {
		if op.Kind == fakedev.Write {
			<-hold // no write-back completes: dirty room is never made
		}
	})
	defer close(hold)
	data := fill(8192, 9)
	for _, tc := range []struct {
		name string
		off  int64
		n    int
		want bool
	}{
		{"two pages", 0, 8192, true},
		{"sub-page", 16384 + 512, 1024, true},
		{"misaligned", 8193, 512, false},
		{"past the end", 4 << 20, 4096, false},
		{"empty", 0, 0, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := c.WriteCached(data[:tc.n], tc.off); got != tc.want {
				t.Fatalf("WriteCached = %v, want %v", got, tc.want)
			}
		})
	}
	got := make([]byte, 8192)
	if !c.ReadCached(got, 0) || !bytes.Equal(got, data) {
		t.Fatal("WriteCached data not readable")
	}
	// Fill the dirty limit (3 pages are dirty), then: a clean page must not be dirtied without
	// waiting, while rewriting a dirty page needs no room.
	for pg := int64(3); pg < limit/4096; pg++ {
		if !c.WriteCached(data[:4096], 65536+pg*4096) {
			t.Fatalf("page %d refused below the dirty limit", pg)
		}
	}
	if c.WriteCached(data[:4096], 1<<20) {
		t.Fatal("WriteCached dirtied a page beyond the dirty limit")
	}
	if !c.WriteCached(data[4096:], 0) {
		t.Fatal("WriteCached refused to rewrite a page that is already dirty")
	}
	if r := c.reserved.Load(); r != limit/4096 {
		t.Fatalf("reserved %d pages, want %d", r, limit/4096)
	}
	allocs := allocsPerCall(t, 1000, func() {
		if !c.WriteCached(data[:4096], 0) {
			panic("refused")
		}
	})
	if allocs != 0 {
		t.Fatalf("WriteCached allocates %.1f times", allocs)
	}
	wt, _ := newTest(t, 4<<20, stdLimits(512), Config{Size: 1 << 20, Mode: WriteThrough})
	if wt.WriteCached(data[:4096], 0) {
		t.Fatal("write-through cache acknowledged a write from memory")
	}
	_ = ctx
}

// TestDirtyRewriteAtLimitNotThrottled: with every allowed page dirty, WriteAt to a page that is
// already dirty completes without waiting for write-back.
func TestDirtyRewriteAtLimitNotThrottled(t *testing.T) {
	ctx := context.Background()
	const limit = 64 << 10
	c, dev := newTest(t, 4<<20, stdLimits(4096), Config{Size: 1 << 20, DirtyLimit: limit, Workers: 1,
		MaxDirtyAge: time.Hour, LowWater: limit - 4096})
	hold := make(chan struct{})
	dev.SetBefore(func(op fakedev.Op) {
		if op.Kind == fakedev.Write {
			<-hold
		}
	})
	defer close(hold)
	buf := fill(4096, 1)
	for pg := int64(0); pg < limit/4096; pg++ {
		if err := c.WriteAt(ctx, buf, pg*4096, 0); err != nil {
			t.Fatal(err)
		}
	}
	for pg := int64(0); pg < limit/4096; pg++ {
		if err := c.WriteAt(ctx, buf, pg*4096, 0); err != nil {
			t.Fatal(err)
		}
	}
	if st := c.Stats(); st.ThrottledWrites != 0 {
		t.Fatalf("%d rewrites of dirty pages were throttled", st.ThrottledWrites)
	}
}

// closeCounter counts the Close calls that reach the backend.
type closeCounter struct {
	block.Device
	closes atomic.Int32
}

func (d *closeCounter) Close() error {
	d.closes.Add(1)
	return d.Device.Close()
}

// TestConcurrentCloseClosesOnce interleaves two Closes: the first is held in its final flush (the
// write-back of a dirty page is blocked) while the second starts. Both must return nil, the
// backend must be closed exactly once, and neither may return before the cache is closed. (Before
// CloseContext serialised its callers, both saw "not closed", both flushed and both closed the
// backend; or the second returned ErrClosed.)
func TestConcurrentCloseClosesOnce(t *testing.T) {
	ctx := context.Background()
	dev := fakedev.New(1<<20, stdLimits(4096))
	be := &closeCounter{Device: dev}
	c, err := New(be, Config{Size: 1 << 20, MaxDirtyAge: time.Hour}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := c.WriteAt(ctx, fill(4096, 3), 0, 0); err != nil {
		t.Fatal(err)
	}
	started, release := blockingWrites(dev, 0, 4096)
	results := make(chan error, 2)
	closeAndCheck := func() {
		err := c.Close()
		if err == nil && be.closes.Load() != 1 {
			err = fmt.Errorf("Close returned with the backend closed %d times", be.closes.Load())
		}
		if err == nil && !c.closed.Load() {
			err = errors.New("Close returned before the cache was closed")
		}
		results <- err
	}
	go closeAndCheck()
	<-started // the first Close's flush is waiting for this write-back
	go closeAndCheck()
	dev.SetBefore(nil)
	close(release)
	for range 2 {
		if err := <-results; err != nil {
			t.Error(err)
		}
	}
	if n := be.closes.Load(); n != 1 {
		t.Errorf("backend closed %d times, want once", n)
	}
}

// A cache size that is not a whole number of the page pool's slabs (--cache-size 1000000, or
// the RAM left beside a cache device's index) starts: New used to wait forever for pages the
// pool would never map.
func TestOddSizeStarts(t *testing.T) {
	done := make(chan error, 1)
	go func() {
		c, err := New(fakedev.New(1<<20, stdLimits(512)), Config{Size: 1000000}, nil)
		if err == nil {
			err = c.Close()
		}
		done <- err
	}()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(time.Minute):
		t.Fatal("New with a 1000000-byte cache did not return within a minute")
	}
}
