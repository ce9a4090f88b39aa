// Package blocktest is a conformance suite for block.Device implementations, in the spirit of
// testing/fstest.TestFS: one Run call checks that a Device keeps the contract package block
// states — ranges and alignment, reads of what was written, FLUSH and FUA, TRIM and write-zeroes
// where Limits advertises them, concurrent requests, context cancellation, closing twice and I/O
// after close — each failure naming the sentinel error the contract promises.
//
// The suite knows nothing about the device under test: it uses only the block.Device methods and
// what Limits advertises. It cannot see durability (what survives a crash); implementations test
// that themselves. Every subtest gets a fresh device from open, so no subtest depends on what
// another wrote.
package blocktest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/iser-blk/iser-blk/block"
)

// Run runs the conformance suite as subtests of t. open returns a new, open device for one
// subtest; Run closes it when the subtest ends (a second Close must be harmless, see block). The
// device should be small (16 MiB is plenty, 1 MiB the least: the suite touches its start, its
// middle and its end) and, unless
// it advertises ReadOnly, writable; it must read back as zeroes where nothing was written only if
// it advertises DiscardZeroes (the suite never assumes initial contents).
func Run(t *testing.T, open func(t *testing.T) block.Device) {
	t.Helper()
	tests := []struct {
		name string
		fn   func(t *testing.T, d block.Device)
	}{
		{"Geometry", testGeometry},
		{"Ranges", testRanges},
		{"ReadWrite", testReadWrite},
		{"FlushFUA", testFlushFUA},
		{"Discard", testDiscard},
		{"WriteZeroes", testWriteZeroes},
		{"ReadOnly", testReadOnly},
		{"Concurrent", testConcurrent},
		{"Context", testContext},
		{"Close", testClose},
		{"CloseConcurrent", testCloseConcurrent},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			d := open(t)
			t.Cleanup(func() {
				if err := d.Close(); err != nil {
					t.Errorf("Close: %v", err)
				}
			})
			tc.fn(t, d)
		})
	}
}

// unit is the transfer size the suite uses: a few blocks, within MaxTransfer.
func unit(d block.Device) int64 {
	n := int64(8 * d.BlockSize())
	if mt := d.Limits().MaxTransfer; mt > 0 && n > mt {
		n = mt
	}
	return n
}

// pattern returns n bytes that differ by seed and by position, so a misplaced block shows.
func pattern(n int64, seed byte) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = seed ^ byte(i) ^ byte(i>>9)*31
	}
	return b
}

func needWritable(t *testing.T, d block.Device) {
	t.Helper()
	if d.Limits().ReadOnly {
		t.Skip("device is read-only")
	}
}

// wantIs fails unless err satisfies errors.Is with want (and Errno maps it to errno, when set).
func wantIs(t *testing.T, what string, err, want error, errno syscall.Errno) {
	t.Helper()
	if !errors.Is(err, want) {
		t.Errorf("%s: got %v, want an error satisfying %v", what, err, want)
		return
	}
	if errno != 0 && block.Errno(err) != errno {
		t.Errorf("%s: Errno(%v) = %v, want %v", what, err, block.Errno(err), errno)
	}
}

func mustWrite(t *testing.T, d block.Device, p []byte, off int64, flags block.WriteFlags) {
	t.Helper()
	if err := d.WriteAt(context.Background(), p, off, flags); err != nil {
		t.Fatalf("WriteAt(+%d, %d): %v", len(p), off, err)
	}
}

func mustRead(t *testing.T, d block.Device, off, n int64, want []byte) {
	t.Helper()
	got := make([]byte, n)
	if err := d.ReadAt(context.Background(), got, off); err != nil {
		t.Fatalf("ReadAt(+%d, %d): %v", n, off, err)
	}
	if want != nil && !bytes.Equal(got, want) {
		t.Fatalf("ReadAt(+%d, %d) does not return what was written", n, off)
	}
}

func testGeometry(t *testing.T, d block.Device) {
	bs, size, lim := d.BlockSize(), d.Size(), d.Limits()
	if bs < 512 || bs&(bs-1) != 0 {
		t.Errorf("BlockSize %d is not a power of two >= 512", bs)
	}
	if size <= 0 || size%int64(bs) != 0 {
		t.Errorf("Size %d is not a positive multiple of the block size %d", size, bs)
	}
	if lim.LogicalBlockSize != uint32(bs) {
		t.Errorf("Limits.LogicalBlockSize %d != BlockSize %d", lim.LogicalBlockSize, bs)
	}
	if lim.PhysicalBlockSize != 0 && (lim.PhysicalBlockSize < lim.LogicalBlockSize || lim.PhysicalBlockSize%lim.LogicalBlockSize != 0) {
		t.Errorf("Limits.PhysicalBlockSize %d is not a multiple of the logical block size %d", lim.PhysicalBlockSize, bs)
	}
	if lim.MaxTransfer < 0 || lim.MaxTransfer%int64(bs) != 0 {
		t.Errorf("Limits.MaxTransfer %d is not a multiple of the block size", lim.MaxTransfer)
	}
	if d.Limits() != lim {
		t.Error("Limits changed while the device is open")
	}
}

// testRanges checks that misaligned and out-of-range requests fail with ErrInvalid (EINVAL).
func testRanges(t *testing.T, d block.Device) {
	ctx := context.Background()
	bs, size, lim := int64(d.BlockSize()), d.Size(), d.Limits()
	bad := []struct {
		name     string
		off, len int64
	}{
		{"misaligned offset", bs / 2, bs},
		{"misaligned length", 0, bs + bs/2},
		{"past the end", size - bs, 2 * bs},
		{"offset past the end", size + bs, bs},
		{"negative offset", -bs, bs},
	}
	for _, r := range bad {
		buf := make([]byte, max(r.len, 0))
		wantIs(t, "ReadAt "+r.name, d.ReadAt(ctx, buf, r.off), block.ErrInvalid, syscall.EINVAL)
		if lim.ReadOnly {
			continue
		}
		wantIs(t, "WriteAt "+r.name, d.WriteAt(ctx, buf, r.off, 0), block.ErrInvalid, syscall.EINVAL)
		if lim.CanDiscard {
			wantIs(t, "Discard "+r.name, d.Discard(ctx, r.off, r.len), block.ErrInvalid, syscall.EINVAL)
		}
		if lim.CanWriteZeroes {
			wantIs(t, "WriteZeroes "+r.name, d.WriteZeroes(ctx, r.off, r.len, 0), block.ErrInvalid, syscall.EINVAL)
		}
	}
	if err := d.ReadAt(ctx, nil, size); err != nil {
		t.Errorf("empty ReadAt at the end of the device: %v", err)
	}
	mustRead(t, d, size-bs, bs, nil) // the last block is in range
}

// testReadWrite checks that reads return what was written: at the start, the end, across the
// 4 KiB boundaries a page-based layer has, in part overwritten, one block at a time, and in a
// write of up to 1 MiB.
func testReadWrite(t *testing.T, d block.Device) {
	needWritable(t, d)
	bs, size, u := int64(d.BlockSize()), d.Size(), unit(d)
	spots := []int64{0, size - u, 2*u + bs, 4*u + 3*bs, size/2 + bs}
	for i, off := range spots {
		mustWrite(t, d, pattern(u, byte(i+1)), off, 0)
	}
	for i, off := range spots {
		mustRead(t, d, off, u, pattern(u, byte(i+1)))
	}
	// Overwrite the middle blocks of the first spot and read the three parts.
	mid := pattern(u-2*bs, 0xA5)
	mustWrite(t, d, mid, bs, 0)
	want := pattern(u, 1)
	copy(want[bs:], mid)
	mustRead(t, d, 0, u, want)
	// One block at a time reads the same bytes as the whole.
	for k := int64(0); k < u/bs; k++ {
		mustRead(t, d, k*bs, bs, want[k*bs:(k+1)*bs])
	}
	big := int64(1 << 20)
	if mt := d.Limits().MaxTransfer; mt > 0 && big > mt {
		big = mt
	}
	big = min(big, size/4) / bs * bs
	mustWrite(t, d, pattern(big, 0x3C), size/4, 0)
	mustRead(t, d, size/4, big, pattern(big, 0x3C))
}

// testFlushFUA checks that Flush and FUA writes succeed and that FUA data reads back.
func testFlushFUA(t *testing.T, d block.Device) {
	ctx := context.Background()
	if err := d.Flush(ctx); err != nil {
		t.Fatalf("Flush on an idle device: %v", err)
	}
	needWritable(t, d)
	u := unit(d)
	mustWrite(t, d, pattern(u, 7), 0, 0)
	if err := d.Flush(ctx); err != nil {
		t.Fatalf("Flush: %v", err)
	}
	mustWrite(t, d, pattern(u, 8), u, block.FUA)
	mustRead(t, d, 0, 2*u, append(pattern(u, 7), pattern(u, 8)...))
	if err := d.Flush(ctx); err != nil {
		t.Fatalf("Flush after FUA: %v", err)
	}
}

// testDiscard checks TRIM where advertised (and ErrNotSupported where not).
func testDiscard(t *testing.T, d block.Device) {
	needWritable(t, d)
	ctx := context.Background()
	lim, u := d.Limits(), unit(d)
	if !lim.CanDiscard {
		wantIs(t, "Discard without CanDiscard", d.Discard(ctx, 0, u), block.ErrNotSupported, syscall.EOPNOTSUPP)
		return
	}
	gran := max(int64(lim.DiscardAlignment), int64(lim.PhysicalBlockSize), int64(d.BlockSize()), u)
	mustWrite(t, d, pattern(3*gran, 9), 0, 0)
	if err := d.Discard(ctx, gran, gran); err != nil {
		t.Fatalf("Discard: %v", err)
	}
	if err := d.Discard(ctx, 0, 0); err != nil {
		t.Errorf("empty Discard: %v", err)
	}
	want := pattern(3*gran, 9)
	mustRead(t, d, 0, gran, want[:gran])
	mustRead(t, d, 2*gran, gran, want[2*gran:])
	if lim.DiscardZeroes {
		mustRead(t, d, gran, gran, make([]byte, gran))
	}
}

// testWriteZeroes checks write-zeroes where advertised, with and without NoHole, and FastOnly
// against CanFastZero.
func testWriteZeroes(t *testing.T, d block.Device) {
	needWritable(t, d)
	ctx := context.Background()
	lim, bs, u := d.Limits(), int64(d.BlockSize()), unit(d)
	if !lim.CanWriteZeroes {
		wantIs(t, "WriteZeroes without CanWriteZeroes", d.WriteZeroes(ctx, 0, u, 0), block.ErrNotSupported, syscall.EOPNOTSUPP)
		return
	}
	for i, flags := range []block.ZeroFlags{0, block.NoHole, block.ZeroFUA} {
		off := int64(i) * 4 * u
		mustWrite(t, d, pattern(3*u, byte(i+20)), off, 0)
		if err := d.WriteZeroes(ctx, off+u+bs, u-bs, flags); err != nil {
			t.Fatalf("WriteZeroes(flags %#x): %v", flags, err)
		}
		want := pattern(3*u, byte(i+20))
		clear(want[u+bs : 2*u])
		mustRead(t, d, off, 3*u, want)
	}
	err := d.WriteZeroes(ctx, 0, u, block.FastOnly)
	if lim.CanFastZero {
		// CanFastZero says FastOnly can succeed, not that it will (nor does NBD's
		// SEND_FAST_ZERO): a device that learns at its first zeroing that the fast way is
		// missing (an iSCSI LUN that does not report its WRITE SAME support) still refuses
		// with ErrNotSupported, as the flag asks.
		if err != nil {
			wantIs(t, "WriteZeroes(FastOnly) with CanFastZero", err, block.ErrNotSupported, syscall.EOPNOTSUPP)
		} else {
			mustRead(t, d, 0, u, make([]byte, u))
		}
	} else {
		wantIs(t, "WriteZeroes(FastOnly) without CanFastZero", err, block.ErrNotSupported, syscall.EOPNOTSUPP)
	}
}

// testReadOnly checks that a read-only device refuses every modification with ErrReadOnly.
func testReadOnly(t *testing.T, d block.Device) {
	if !d.Limits().ReadOnly {
		t.Skip("device is writable")
	}
	ctx := context.Background()
	u := unit(d)
	wantIs(t, "WriteAt", d.WriteAt(ctx, make([]byte, u), 0, 0), block.ErrReadOnly, syscall.EROFS)
	wantIs(t, "Discard", d.Discard(ctx, 0, u), block.ErrReadOnly, syscall.EROFS)
	wantIs(t, "WriteZeroes", d.WriteZeroes(ctx, 0, u, 0), block.ErrReadOnly, syscall.EROFS)
}

// testConcurrent runs writers of disjoint ranges, readers of what they wrote and flushes at once,
// then checks every range.
func testConcurrent(t *testing.T, d block.Device) {
	needWritable(t, d)
	ctx := context.Background()
	const workers, rounds = 8, 16
	u := unit(d)
	var wg sync.WaitGroup
	errs := make(chan error, workers)
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs <- concurrentWorker(ctx, d, w, rounds, u)
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Error(err)
		}
	}
	for w := range workers {
		for r := range rounds {
			mustRead(t, d, int64(w*rounds+r)*u, u, pattern(u, byte(w*rounds+r)))
		}
	}
}

func concurrentWorker(ctx context.Context, d block.Device, w, rounds int, u int64) error {
	got := make([]byte, u)
	for r := range rounds {
		k := w*rounds + r
		off := int64(k) * u
		want := pattern(u, byte(k))
		if err := d.WriteAt(ctx, want, off, 0); err != nil {
			return fmt.Errorf("worker %d: WriteAt(%d): %w", w, off, err)
		}
		if err := d.ReadAt(ctx, got, off); err != nil {
			return fmt.Errorf("worker %d: ReadAt(%d): %w", w, off, err)
		}
		if !bytes.Equal(got, want) {
			return fmt.Errorf("worker %d: ReadAt(%d) does not return what it wrote", w, off)
		}
		if r%4 == w%4 {
			if err := d.Flush(ctx); err != nil {
				return fmt.Errorf("worker %d: Flush: %w", w, err)
			}
		}
	}
	return nil
}

// testContext checks every call with a canceled context and with one past its deadline: a
// Device may still complete the request, but when it fails it names ErrCanceled or ErrTimeout
// (and the context error), which Errno maps to EIO.
func testContext(t *testing.T, d block.Device) {
	canceled, cancel := context.WithCancel(context.Background())
	cancel()
	expired, cancel2 := context.WithDeadline(context.Background(), time.Unix(1, 0))
	defer cancel2()
	cases := []struct {
		name     string
		ctx      context.Context
		sentinel error
		cause    error
	}{
		{"canceled", canceled, block.ErrCanceled, context.Canceled},
		{"deadline", expired, block.ErrTimeout, context.DeadlineExceeded},
	}
	lim, u := d.Limits(), unit(d)
	for _, c := range cases {
		check := func(op string, err error) {
			t.Helper()
			if err == nil {
				return // completed anyway: allowed
			}
			if !errors.Is(err, c.sentinel) || !errors.Is(err, c.cause) {
				t.Errorf("%s with a %s context: got %v, want an error satisfying %v and %v", op, c.name, err, c.sentinel, c.cause)
			} else if block.Errno(err) != syscall.EIO {
				t.Errorf("%s with a %s context: Errno %v, want EIO", op, c.name, block.Errno(err))
			}
		}
		check("ReadAt", d.ReadAt(c.ctx, make([]byte, u), 0))
		check("Flush", d.Flush(c.ctx))
		if lim.ReadOnly {
			continue
		}
		check("WriteAt", d.WriteAt(c.ctx, pattern(u, 1), 0, 0))
		check("WriteAt FUA", d.WriteAt(c.ctx, pattern(u, 2), u, block.FUA))
		if lim.CanDiscard {
			check("Discard", d.Discard(c.ctx, 0, u))
		}
		if lim.CanWriteZeroes {
			check("WriteZeroes", d.WriteZeroes(c.ctx, 0, u, 0))
		}
	}
	// The device still serves requests with a live context.
	mustRead(t, d, 0, u, nil)
}

// testClose checks that a second Close returns nil and that every call after Close fails with
// ErrClosed (ESHUTDOWN).
func testClose(t *testing.T, d block.Device) {
	ctx := context.Background()
	lim, u := d.Limits(), unit(d)
	if !lim.ReadOnly {
		mustWrite(t, d, pattern(u, 5), 0, 0)
	}
	if err := d.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	if err := d.Close(); err != nil {
		t.Errorf("second Close: got %v, want nil", err)
	}
	wantIs(t, "ReadAt after Close", d.ReadAt(ctx, make([]byte, u), 0), block.ErrClosed, syscall.ESHUTDOWN)
	wantIs(t, "WriteAt after Close", d.WriteAt(ctx, make([]byte, u), 0, 0), block.ErrClosed, syscall.ESHUTDOWN)
	wantIs(t, "Flush after Close", d.Flush(ctx), block.ErrClosed, syscall.ESHUTDOWN)
	if lim.CanDiscard {
		wantIs(t, "Discard after Close", d.Discard(ctx, 0, u), block.ErrClosed, syscall.ESHUTDOWN)
	}
	if lim.CanWriteZeroes {
		wantIs(t, "WriteZeroes after Close", d.WriteZeroes(ctx, 0, u, 0), block.ErrClosed, syscall.ESHUTDOWN)
	}
}

// testCloseConcurrent closes from several goroutines at once (a signal handler and deferred
// cleanup): every call returns nil, and none returns before the device is closed.
func testCloseConcurrent(t *testing.T, d block.Device) {
	if !d.Limits().ReadOnly {
		mustWrite(t, d, pattern(unit(d), 6), 0, 0)
	}
	const closers = 4
	errs := make(chan error, closers)
	for range closers {
		go func() {
			err := d.Close()
			if err == nil {
				err = d.Flush(context.Background())
				if errors.Is(err, block.ErrClosed) {
					err = nil
				} else {
					err = fmt.Errorf("flush after Close returned: %v, want ErrClosed", err)
				}
			}
			errs <- err
		}()
	}
	for range closers {
		if err := <-errs; err != nil {
			t.Errorf("concurrent Close: %v", err)
		}
	}
}
