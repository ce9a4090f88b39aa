package nbd

import (
	"bytes"
	"context"
	"crypto/rand"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/iser-blk/iser-blk/block"
)

// submitDevice takes reads and writes below declineFrom through SubmitAt, holding them until
// Kick (as the iSCSI backend holds commands in its send queue) and completing them from other
// goroutines; requests at or above failFrom complete with a medium error. Everything else goes
// to ReadAt/WriteAt.
type submitDevice struct {
	block.Device
	declineFrom, failFrom int64
	mu                    sync.Mutex
	held                  []func()
	submitted, sync       atomic.Int64
	fuaSubmitted          atomic.Int64
}

func (d *submitDevice) SubmitAt(ctx context.Context, p []byte, off int64, write bool, flags block.WriteFlags, done block.Completion) bool {
	if off >= d.declineFrom {
		return false
	}
	d.submitted.Add(1)
	if flags&block.FUA != 0 {
		d.fuaSubmitted.Add(1)
	}
	d.mu.Lock()
	d.held = append(d.held, func() {
		if off >= d.failFrom {
			done.Complete(fmt.Errorf("test: %w", block.ErrMedium))
			return
		}
		if write {
			done.Complete(d.Device.WriteAt(ctx, p, off, flags))
		} else {
			done.Complete(d.Device.ReadAt(ctx, p, off))
		}
	})
	d.mu.Unlock()
	return true
}

func (d *submitDevice) Kick() {
	d.mu.Lock()
	held := d.held
	d.held = nil
	d.mu.Unlock()
	for _, f := range held {
		go f()
	}
}

func (d *submitDevice) ReadAt(ctx context.Context, p []byte, off int64) error {
	d.sync.Add(1)
	return d.Device.ReadAt(ctx, p, off)
}

func (d *submitDevice) WriteAt(ctx context.Context, p []byte, off int64, flags block.WriteFlags) error {
	d.sync.Add(1)
	return d.Device.WriteAt(ctx, p, off, flags)
}

// TestSubmittedRequests: reads and writes the device accepts through SubmitAt are answered from
// its completions (nothing hangs, so the reader kicks what it submitted before it waits), with the
// right bytes and errors; declined ones still go through ReadAt/WriteAt.
func TestSubmittedRequests(t *testing.T) {
	for _, structured := range []bool{false, true} {
		t.Run(fmt.Sprintf("structured=%v", structured), func(t *testing.T) {
			mem := newMem(t, 16<<20, "")
			dev := &submitDevice{Device: mem, declineFrom: 8 << 20, failFrom: 6 << 20}
			f := startServer(t, dev, Options{MaxInflight: 16})
			c := f.dial().connect(structured)
			const n = 200
			blocks := make([][]byte, n)
			offs := make([]uint64, n)
			for i := range blocks {
				blocks[i] = make([]byte, 4096)
				rand.Read(blocks[i])
				offs[i] = uint64(i) * 4096
				if i%4 == 3 {
					offs[i] += 8 << 20 // declined: the worker path
				}
			}
			errc := make(chan error, 1)
			go func() {
				for i := range n {
					var fl uint16
					if i%8 == 1 {
						fl = cmdFlagFUA
					}
					if err := c.send(cmdWrite, fl, uint64(i), offs[i], 4096, blocks[i]); err != nil {
						errc <- err
						return
					}
				}
				errc <- nil
			}()
			for range n {
				r, err := c.readReply(nil)
				if err != nil || r.errno != 0 {
					t.Fatalf("write reply %+v: %v", r, err)
				}
			}
			if err := <-errc; err != nil {
				t.Fatal(err)
			}
			go func() {
				for i := range n {
					if err := c.send(cmdRead, 0, uint64(i), offs[i], 4096, nil); err != nil {
						errc <- err
						return
					}
				}
				errc <- nil
			}()
			for range n {
				r, err := c.readReply(func(uint64) int { return 4096 })
				if err != nil || r.errno != 0 {
					t.Fatalf("read reply %+v: %v", r, err)
				}
				if !bytes.Equal(r.data, blocks[r.handle]) {
					t.Fatalf("read %d returned the wrong bytes", r.handle)
				}
			}
			if err := <-errc; err != nil {
				t.Fatal(err)
			}
			if dev.submitted.Load() != 2*150 || dev.sync.Load() != 2*50 || dev.fuaSubmitted.Load() == 0 {
				t.Fatalf("submitted %d (FUA %d), through ReadAt/WriteAt %d", dev.submitted.Load(),
					dev.fuaSubmitted.Load(), dev.sync.Load())
			}
			if r := c.do(cmdRead, 0, 6<<20, 4096, nil); r.errno != eio {
				t.Fatalf("failed submitted read: errno %d, want EIO", r.errno)
			}
			if r := c.do(cmdWrite, 0, 6<<20, 4096, blocks[0]); r.errno != eio {
				t.Fatalf("failed submitted write: errno %d, want EIO", r.errno)
			}
		})
	}
}

// cachedWriteDevice stores writes below hitLimit "in memory" through WriteCached.
type cachedWriteDevice struct {
	block.Device
	hitLimit            int64
	cachedWrites, syncW atomic.Int64
	flushes             atomic.Int64
}

func (d *cachedWriteDevice) WriteCached(p []byte, off int64) bool {
	if off+int64(len(p)) > d.hitLimit || d.Device.WriteAt(context.Background(), p, off, 0) != nil {
		return false
	}
	d.cachedWrites.Add(1)
	return true
}

func (d *cachedWriteDevice) WriteAt(ctx context.Context, p []byte, off int64, flags block.WriteFlags) error {
	d.syncW.Add(1)
	return d.Device.WriteAt(ctx, p, off, flags)
}

func (d *cachedWriteDevice) Flush(ctx context.Context) error {
	d.flushes.Add(1)
	return d.Device.Flush(ctx)
}

// TestCachedWritesAnsweredInline: plain writes the device stores in memory are answered without
// WriteAt; FUA writes and the ones it refuses go to WriteAt; a FLUSH still reaches the device.
func TestCachedWritesAnsweredInline(t *testing.T) {
	mem := newMem(t, 16<<20, "")
	dev := &cachedWriteDevice{Device: mem, hitLimit: 1 << 20}
	f := startServer(t, dev, Options{})
	c := f.dial().connect(true)
	buf := make([]byte, 8192)
	rand.Read(buf)
	for _, tc := range []struct {
		off    uint64
		flags  uint16
		cached bool
	}{
		{0, 0, true},
		{1<<20 - 4096, 0, false}, // crosses the limit
		{4096, cmdFlagFUA, false},
		{2 << 20, 0, false},
	} {
		c0, s0 := dev.cachedWrites.Load(), dev.syncW.Load()
		if r := c.do(cmdWrite, tc.flags, tc.off, 8192, buf); r.errno != 0 {
			t.Fatalf("write at %d: errno %d", tc.off, r.errno)
		}
		if got := dev.cachedWrites.Load() > c0; got != tc.cached || (dev.syncW.Load() > s0) == tc.cached {
			t.Fatalf("write at %d flags %d: cached %v, want %v", tc.off, tc.flags, got, tc.cached)
		}
		if r := c.do(cmdRead, 0, tc.off, 8192, nil); r.errno != 0 || !bytes.Equal(r.data, buf) {
			t.Fatalf("read back at %d: errno %d", tc.off, r.errno)
		}
	}
	if r := c.do(cmdFlush, 0, 0, 0, nil); r.errno != 0 || dev.flushes.Load() != 1 {
		t.Fatalf("flush: errno %d, device flushes %d", r.errno, dev.flushes.Load())
	}
}
