package nbd

import (
	"bytes"
	"context"
	"crypto/rand"
	"fmt"
	"sync/atomic"
	"testing"

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
