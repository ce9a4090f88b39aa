//go:build vm

package ublk

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
	"unsafe"

	"go.uber.org/zap"
	"go.uber.org/zap/zaptest"
	"golang.org/x/sys/unix"

	"github.com/iser-blk/iser-blk/backend/memdev"
	"github.com/iser-blk/iser-blk/block"
	"github.com/iser-blk/iser-blk/test/vm/vmtest"
)

// requireUblk fails (never skips) unless the kernel has ublk: these tests belong in the guest.
func requireUblk(t *testing.T) {
	t.Helper()
	vmtest.Require(t)
	vmtest.LoadModules(t, "ublk")
	c, err := OpenControl("")
	if err != nil {
		t.Fatalf("vm test needs ublk (run it in the 6.12 guest via test/vm): %v", err)
	}
	c.Close()
}

func startMem(t *testing.T, size int64, opts Options) (*Server, *memdev.Device) {
	t.Helper()
	requireUblk(t)
	dev, err := memdev.New(size, memdev.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if opts.Logger == nil {
		opts.Logger = zaptest.NewLogger(t, zaptest.Level(zap.InfoLevel))
	}
	s, err := Start(context.Background(), dev, opts)
	if err != nil {
		t.Fatalf("Start: %v", err)
	}
	t.Cleanup(func() { _ = s.Shutdown(context.Background()) })
	return s, dev
}

// alignedBuf returns n bytes aligned for O_DIRECT.
func alignedBuf(n int) []byte {
	b := make([]byte, n+4096)
	off := int(4096 - uintptr(unsafe.Pointer(&b[0]))%4096)
	return b[off : off+n : off+n]
}

func sysfs(t *testing.T, s *Server, attr string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("/sys/block", filepath.Base(s.BlockPath()), attr))
	if err != nil {
		t.Fatal(err)
	}
	return strings.TrimSpace(string(b))
}

func TestVMReadWriteAndAttributes(t *testing.T) {
	s, mem := startMem(t, 64<<20, Options{Queues: 2, Depth: 16})
	for attr, want := range map[string]string{
		"queue/write_cache":            "write back",
		"queue/fua":                    "1",
		"queue/logical_block_size":     "512",
		"queue/max_hw_sectors_kb":      "512",
		"queue/discard_granularity":    "512",
		"queue/rotational":             "0",
		"ro":                           "0",
		"size":                         "131072",
		"queue/write_zeroes_max_bytes": "",
	} {
		got := sysfs(t, s, attr)
		if want != "" && got != want {
			t.Errorf("%s = %q, want %q", attr, got, want)
		}
		t.Logf("%s = %s", attr, got)
	}
	f, err := os.OpenFile(s.BlockPath(), os.O_RDWR|unix.O_DIRECT, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	data := alignedBuf(1 << 20)
	rand.Read(data)
	for _, off := range []int64{0, 4096, 7 << 20, 63 << 20} {
		if _, err := f.WriteAt(data, off); err != nil {
			t.Fatalf("write at %d: %v", off, err)
		}
		got := alignedBuf(len(data))
		if _, err := f.ReadAt(got, off); err != nil {
			t.Fatalf("read at %d: %v", off, err)
		}
		if !bytes.Equal(got, data) {
			t.Fatalf("read back at %d differs", off)
		}
		// The bytes really went through the Device.
		direct := make([]byte, len(data))
		if err := mem.ReadAt(context.Background(), direct, off); err != nil || !bytes.Equal(direct, data) {
			t.Fatalf("memdev content at %d differs (%v)", off, err)
		}
	}
	if err := f.Sync(); err != nil {
		t.Fatalf("fsync: %v", err)
	}
	if st := mem.Stats(); st.Flushes == 0 {
		t.Errorf("fsync did not reach the device as a flush: %+v", st)
	}
	// Past the end fails cleanly.
	if _, err := f.WriteAt(data[:4096], 64<<20); err == nil {
		t.Error("write past the end succeeded")
	}
	f.Close()
	path := s.BlockPath()
	if err := s.Shutdown(context.Background()); err != nil {
		t.Fatalf("Shutdown: %v", err)
	}
	if _, err := os.Stat(path); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("%s still exists after Shutdown (%v)", path, err)
	}
}

// slowDevice delays the read at slowOff by delay and records when every request finished.
type slowDevice struct {
	block.Device
	slowOff int64
	delay   time.Duration
	started chan struct{}

	mu    sync.Mutex
	order []int64 // offsets of reads in completion order
	armed bool
}

func (d *slowDevice) ReadAt(ctx context.Context, p []byte, off int64) error {
	d.mu.Lock()
	slow := d.armed && off == d.slowOff
	d.mu.Unlock()
	if slow {
		close(d.started)
		select {
		case <-time.After(d.delay):
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	err := d.Device.ReadAt(ctx, p, off)
	d.mu.Lock()
	if d.armed {
		d.order = append(d.order, off)
	}
	d.mu.Unlock()
	return err
}

// TestVMSlowRequestDoesNotBlockQueue: one queue; a read the backend holds for 2 s must not stop
// the other reads on the same queue from completing meanwhile.
func TestVMSlowRequestDoesNotBlockQueue(t *testing.T) {
	requireUblk(t)
	mem, err := memdev.New(16<<20, memdev.Options{})
	if err != nil {
		t.Fatal(err)
	}
	dev := &slowDevice{Device: mem, slowOff: 8 << 20, delay: 2 * time.Second, started: make(chan struct{})}
	s, err := Start(context.Background(), dev, Options{Queues: 1, Depth: 8, Logger: zaptest.NewLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Shutdown(context.Background())
	if got := s.Info().NrHWQueues; got != 1 {
		t.Fatalf("queues = %d", got)
	}
	f, err := os.OpenFile(s.BlockPath(), os.O_RDWR|unix.O_DIRECT, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	dev.mu.Lock()
	dev.armed = true
	dev.mu.Unlock()

	slowDone := make(chan time.Time, 1)
	slowStart := time.Now()
	go func() {
		buf := alignedBuf(4096)
		if _, err := f.ReadAt(buf, dev.slowOff); err != nil {
			t.Errorf("slow read: %v", err)
		}
		slowDone <- time.Now()
	}()
	<-dev.started // the slow request is now held inside the backend
	const fast = 50
	var fastDone []time.Time
	buf := alignedBuf(4096)
	for i := 0; i < fast; i++ {
		if _, err := f.ReadAt(buf, int64(i)*4096); err != nil {
			t.Fatalf("fast read %d: %v", i, err)
		}
		fastDone = append(fastDone, time.Now())
	}
	end := <-slowDone
	took := end.Sub(slowStart)
	t.Logf("slow read took %v; %d other reads on the same queue finished %v..%v after it started",
		took, fast, fastDone[0].Sub(slowStart), fastDone[fast-1].Sub(slowStart))
	if took < dev.delay {
		t.Fatalf("slow read finished after %v, before its %v delay", took, dev.delay)
	}
	for i, ts := range fastDone {
		if !ts.Before(end) {
			t.Fatalf("fast read %d finished at %v, not before the slow one (%v)", i, ts.Sub(slowStart), took)
		}
	}
	dev.mu.Lock()
	order := append([]int64(nil), dev.order...)
	dev.mu.Unlock()
	if len(order) != fast+1 || order[len(order)-1] != dev.slowOff {
		t.Fatalf("backend completion order: slow read at index %d of %d, want last", indexOf(order, dev.slowOff), len(order))
	}
}

func indexOf(s []int64, v int64) int {
	for i, x := range s {
		if x == v {
			return i
		}
	}
	return -1
}

// flagDevice records the flags of zeroing and writing requests.
type flagDevice struct {
	block.Device
	mu        sync.Mutex
	zeroFlags []block.ZeroFlags
	fuaWrites int
}

func (d *flagDevice) WriteZeroes(ctx context.Context, off, n int64, f block.ZeroFlags) error {
	d.mu.Lock()
	d.zeroFlags = append(d.zeroFlags, f)
	d.mu.Unlock()
	return d.Device.WriteZeroes(ctx, off, n, f)
}

func (d *flagDevice) WriteAt(ctx context.Context, p []byte, off int64, f block.WriteFlags) error {
	if f&block.FUA != 0 {
		d.mu.Lock()
		d.fuaWrites++
		d.mu.Unlock()
	}
	return d.Device.WriteAt(ctx, p, off, f)
}

// TestVMDiscardZeroesFUA: BLKDISCARD reaches Discard, BLKZEROOUT (which asks for NOUNMAP) reaches
// WriteZeroes with NoHole, an O_DSYNC write reaches WriteAt with FUA, and the data reads back.
func TestVMDiscardZeroesFUA(t *testing.T) {
	requireUblk(t)
	mem, err := memdev.New(16<<20, memdev.Options{})
	if err != nil {
		t.Fatal(err)
	}
	dev := &flagDevice{Device: mem}
	s, err := Start(context.Background(), dev, Options{Queues: 1, Depth: 8, Logger: zaptest.NewLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Shutdown(context.Background())
	f, err := os.OpenFile(s.BlockPath(), os.O_RDWR|unix.O_DIRECT|unix.O_DSYNC, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	data := alignedBuf(1 << 20)
	for i := range data {
		data[i] = 0xa5
	}
	if _, err := f.WriteAt(data, 0); err != nil {
		t.Fatal(err)
	}
	dev.mu.Lock()
	fua := dev.fuaWrites
	dev.mu.Unlock()
	if fua == 0 {
		t.Errorf("O_DSYNC writes on a FUA-capable disk reached the device without FUA")
	}
	// BLKZEROOUT [0, 64 KiB), BLKDISCARD [512 KiB, +512 KiB)
	rng := [2]uint64{0, 64 << 10}
	if _, _, e := unix.Syscall(unix.SYS_IOCTL, f.Fd(), unix.BLKZEROOUT, uintptr(unsafe.Pointer(&rng))); e != 0 {
		t.Fatalf("BLKZEROOUT: %v", e)
	}
	rng = [2]uint64{512 << 10, 512 << 10}
	if _, _, e := unix.Syscall(unix.SYS_IOCTL, f.Fd(), unix.BLKDISCARD, uintptr(unsafe.Pointer(&rng))); e != 0 {
		t.Fatalf("BLKDISCARD: %v", e)
	}
	st := mem.Stats()
	if st.Discards == 0 || st.WriteZeroes == 0 {
		t.Fatalf("device stats %+v: discard or write-zeroes never arrived", st)
	}
	dev.mu.Lock()
	zf := append([]block.ZeroFlags(nil), dev.zeroFlags...)
	dev.mu.Unlock()
	for _, fl := range zf {
		if fl&block.NoHole == 0 {
			t.Errorf("BLKZEROOUT arrived without NoHole (flags %#x): REQ_NOUNMAP was lost", fl)
		}
	}
	got := alignedBuf(1 << 20)
	if _, err := f.ReadAt(got, 0); err != nil {
		t.Fatal(err)
	}
	for i, b := range got {
		want := byte(0xa5)
		if i < 64<<10 || i >= 512<<10 {
			want = 0 // zeroed, or discarded (memdev discards read back as zeroes)
		}
		if b != want {
			t.Fatalf("byte %d = %#x, want %#x", i, b, want)
		}
	}
	t.Logf("stats %+v, write-zeroes flags %v, FUA writes %d", st, zf, fua)
}

// TestVMReadOnly4K: a read-only LUN with 4 KiB blocks and no volatile cache shows up as such.
func TestVMReadOnly4K(t *testing.T) {
	requireUblk(t)
	mem, err := memdev.New(16<<20, memdev.Options{BlockSize: 4096, Limits: &block.Limits{
		ReadOnly: true, CanFlush: false, Rotational: true, MaxTransfer: 128 << 10,
	}})
	if err != nil {
		t.Fatal(err)
	}
	s, err := Start(context.Background(), mem, Options{Queues: 1, Depth: 4, Logger: zaptest.NewLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Shutdown(context.Background())
	for attr, want := range map[string]string{
		"ro":                        "1",
		"queue/logical_block_size":  "4096",
		"queue/physical_block_size": "4096",
		"queue/write_cache":         "write through",
		"queue/rotational":          "1",
		"queue/max_hw_sectors_kb":   "128",
		"queue/discard_max_bytes":   "0",
	} {
		if got := sysfs(t, s, attr); got != want {
			t.Errorf("%s = %q, want %q", attr, got, want)
		}
	}
	// Linux lets a read-only disk be opened O_RDWR; the write itself must fail (EPERM) and never
	// reach the device.
	if w, err := os.OpenFile(s.BlockPath(), os.O_RDWR|unix.O_DIRECT, 0); err == nil {
		_, werr := w.WriteAt(alignedBuf(4096), 0)
		w.Close()
		if werr == nil {
			t.Error("a write to a read-only ublk disk succeeded")
		}
		t.Logf("write to the read-only disk: %v", werr)
	}
	if st := mem.Stats(); st.Writes != 0 {
		t.Errorf("%d writes reached a read-only device", st.Writes)
	}
	f, err := os.OpenFile(s.BlockPath(), os.O_RDONLY|unix.O_DIRECT, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	buf := alignedBuf(128 << 10)
	if _, err := f.ReadAt(buf, 4<<20); err != nil {
		t.Fatalf("read: %v", err)
	}
}
