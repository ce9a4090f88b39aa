package nbd

import (
	"bytes"
	"context"
	"crypto/rand"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/iser-blk/iser-blk/block"
)

// cachedDevice pretends that [0, hitLimit) is in memory: ReadCached serves it, everything else
// must go through ReadAt. It counts both.
type cachedDevice struct {
	block.Device
	hitLimit     int64
	cachedReads  atomic.Int64
	deviceReads  atomic.Int64
	cachedMisses atomic.Int64
}

func (d *cachedDevice) ReadCached(p []byte, off int64) bool {
	if off+int64(len(p)) > d.hitLimit {
		d.cachedMisses.Add(1)
		return false
	}
	if d.Device.ReadAt(context.Background(), p, off) != nil {
		return false
	}
	d.cachedReads.Add(1)
	return true
}

func (d *cachedDevice) ReadAt(ctx context.Context, p []byte, off int64) error {
	d.deviceReads.Add(1)
	return d.Device.ReadAt(ctx, p, off)
}

// TestCachedReadsAnsweredInline checks that reads the device can serve from memory are answered
// without ReadAt (on the reader goroutine), that the rest still reach ReadAt, and that both kinds
// return the right bytes with simple and structured replies.
func TestCachedReadsAnsweredInline(t *testing.T) {
	for _, structured := range []bool{false, true} {
		t.Run(fmt.Sprintf("structured=%v", structured), func(t *testing.T) {
			mem := newMem(t, 16<<20, "")
			data := make([]byte, 2<<20)
			rand.Read(data)
			if err := mem.WriteAt(context.Background(), data, 0, 0); err != nil {
				t.Fatal(err)
			}
			dev := &cachedDevice{Device: mem, hitLimit: 1 << 20}
			f := startServer(t, dev, Options{})
			c := f.dial().connect(structured)
			for _, tc := range []struct {
				off    uint64
				n      uint32
				cached bool
			}{
				{0, 4096, true},
				{512, 512, true},
				{1<<20 - 4096, 4096, true},
				{1<<20 - 4096, 8192, false}, // crosses the limit
				{1 << 20, 4096, false},
				{0, 1 << 20, true},
				{0, 4 << 20, false}, // more than one segment: always a worker
			} {
				c0, d0 := dev.cachedReads.Load(), dev.deviceReads.Load()
				r := c.do(cmdRead, 0, tc.off, tc.n, nil)
				if r.errno != 0 {
					t.Fatalf("read %d+%d: errno %d", tc.off, tc.n, r.errno)
				}
				want := make([]byte, tc.n)
				if err := mem.ReadAt(context.Background(), want, int64(tc.off)); err != nil {
					t.Fatal(err)
				}
				if !bytes.Equal(r.data, want) {
					t.Fatalf("read %d+%d returned the wrong bytes", tc.off, tc.n)
				}
				gotCached := dev.cachedReads.Load() > c0
				gotDevice := dev.deviceReads.Load() > d0
				if gotCached != tc.cached || gotDevice == tc.cached {
					t.Fatalf("read %d+%d: cached %v device %v, want cached %v", tc.off, tc.n, gotCached, gotDevice, tc.cached)
				}
			}
			// A write followed by a read of the same range sees the write either way.
			buf := make([]byte, 4096)
			rand.Read(buf)
			if r := c.do(cmdWrite, 0, 8192, 4096, buf); r.errno != 0 {
				t.Fatalf("write: errno %d", r.errno)
			}
			if r := c.do(cmdRead, 0, 8192, 4096, nil); r.errno != 0 || !bytes.Equal(r.data, buf) {
				t.Fatalf("read after write: errno %d, equal %v", r.errno, bytes.Equal(r.data, buf))
			}
		})
	}
}

// cachedSubmitDevice is a cachedDevice that also starts reads below declineFrom on SubmitAt,
// completing them on a goroutine of its own.
type cachedSubmitDevice struct {
	cachedDevice
	declineFrom       int64
	submits, declines atomic.Int64
}

func (d *cachedSubmitDevice) SubmitAt(ctx context.Context, p []byte, off int64, write bool, flags block.WriteFlags, done block.Completion) bool {
	if write || off >= d.declineFrom {
		d.declines.Add(1)
		return false
	}
	d.submits.Add(1)
	go func() { done.Complete(d.Device.ReadAt(ctx, p, off)) }()
	return true
}

func (d *cachedSubmitDevice) Kick() {}

// countingPool is the heap pool counting the buffers taken without waiting.
type countingPool struct {
	*heapPool
	tryGets atomic.Int64
}

func (p *countingPool) TryGet(n int) ([]byte, bool) {
	p.tryGets.Add(1)
	return p.heapPool.TryGet(n)
}

// TestCachedMissKeepsItsBufferForSubmit checks that a READ that misses the device's memory is
// started on SubmitAt with the buffer (and budget) it was probed with, not a second one taken
// after the first was given back, and that a miss SubmitAt declines still reaches ReadAt with the
// right bytes.
func TestCachedMissKeepsItsBufferForSubmit(t *testing.T) {
	mem := newMem(t, 16<<20, "")
	data := make([]byte, 4<<20)
	rand.Read(data)
	if err := mem.WriteAt(context.Background(), data, 0, 0); err != nil {
		t.Fatal(err)
	}
	dev := &cachedSubmitDevice{cachedDevice: cachedDevice{Device: mem, hitLimit: 1 << 20}, declineFrom: 3 << 20}
	pool := &countingPool{heapPool: newHeapPool()}
	f := startServer(t, dev, Options{Pool: pool, PayloadBudget: 1 << 20})
	c := f.dial().connect(true)
	for _, tc := range []struct {
		off     uint64
		tryGets int64
	}{
		{4096, 1},         // a hit: the probe's buffer carries the reply
		{1<<20 + 4096, 1}, // a miss: the same buffer is submitted
		{2<<20 + 8192, 1}, // another
		{3<<20 + 4096, 1}, // a miss SubmitAt declines: a worker reads with Get
	} {
		before := pool.tryGets.Load()
		r := c.do(cmdRead, 0, tc.off, 4096, nil)
		if r.errno != 0 || !bytes.Equal(r.data, data[tc.off:tc.off+4096]) {
			t.Fatalf("read %d: errno %d, right bytes %v", tc.off, r.errno, bytes.Equal(r.data, data[tc.off:tc.off+4096]))
		}
		if n := pool.tryGets.Load() - before; n != tc.tryGets {
			t.Fatalf("read %d took %d buffers without waiting, want %d", tc.off, n, tc.tryGets)
		}
	}
	if dev.cachedReads.Load() != 1 || dev.submits.Load() != 2 || dev.declines.Load() != 1 || dev.deviceReads.Load() != 1 {
		t.Fatalf("cached %d, submitted %d, declined %d, through ReadAt %d: want 1, 2, 1, 1",
			dev.cachedReads.Load(), dev.submits.Load(), dev.declines.Load(), dev.deviceReads.Load())
	}
	// Every reply has arrived; the server gives a request's budget back once its reply is
	// written, which may come just after the client read it.
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(time.Millisecond) {
		f.srv.budget.mu.Lock()
		used := f.srv.budget.used
		f.srv.budget.mu.Unlock()
		if used == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d bytes of payload budget still held 10 s after the last reply", used)
		}
	}
}
