//go:build vm && cgo && linux && !nordma

package rdma_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zaptest"

	"github.com/iser-blk/iser-blk/backend/iser"
	"github.com/iser-blk/iser-blk/test/vm/vmtest"
)

// completion is a block.Completion that hands its result to a channel.
type completion chan error

func (c completion) Complete(err error) { c <- err }

func (c completion) wait(t *testing.T) error {
	t.Helper()
	select {
	case err := <-c:
		return err
	case <-time.After(2 * time.Minute):
		t.Fatal("a submitted command never completed")
		return nil
	}
}

// TestDeviceSubmitISER: over iSER a read or write from registered memory starts without a
// goroutine (SubmitAt takes it) and the session's reader completes it, whatever its size up to
// the transfer limit: the target fetches a write's data beyond the immediate data by RDMA Read
// and places a read's data by RDMA Write. A buffer iSER would have to bounce is declined (the
// bounce may wait for the pool) and served by WriteAt/ReadAt. What was written reads back.
func TestDeviceSubmitISER(t *testing.T) {
	vmtest.Require(t)
	tg := vmtest.StartLIO(t, vmtest.LIOOptions{SizeMiB: 64})
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	p := registeredPool(t, 64<<20, 4<<20)
	log := zaptest.NewLogger(t, zaptest.Level(zap.WarnLevel))
	d, err := iser.Open(ctx, tg.URL("iser"), iser.Options{InitiatorName: devInitiator, Logger: log})
	if err != nil {
		t.Fatalf("open: %v", err)
	}
	defer d.Close()
	maxXfer := int(d.Limits().MaxTransfer)
	if got := d.SubmitWriteMax(); got != maxXfer {
		t.Fatalf("SubmitWriteMax = %d, want the transfer limit %d (iSER needs no R2T)", got, maxXfer)
	}
	off := int64(0)
	for _, n := range []int{4096, 64 << 10, 256 << 10, maxXfer} {
		w, err := p.Get(ctx, n)
		if err != nil {
			t.Fatal(err)
		}
		pattern(w, off, false)
		done := make(completion, 1)
		if !d.SubmitAt(ctx, w, off, true, 0, done) {
			t.Fatalf("SubmitAt declined a %d-byte write from registered memory", n)
		}
		d.Kick()
		if err := done.wait(t); err != nil {
			t.Fatalf("submitted %d-byte write: %v", n, err)
		}
		r, err := p.Get(ctx, n)
		if err != nil {
			t.Fatal(err)
		}
		clear(r)
		done = make(completion, 1)
		if !d.SubmitAt(ctx, r, off, false, 0, done) {
			t.Fatalf("SubmitAt declined a %d-byte read into registered memory", n)
		}
		d.Kick()
		if err := done.wait(t); err != nil {
			t.Fatalf("submitted %d-byte read: %v", n, err)
		}
		if bad := pattern(r, off, true); bad >= 0 {
			t.Fatalf("%d-byte read at %d: byte %d differs from what was written", n, off, bad)
		}
		p.Put(w)
		p.Put(r)
		off += int64(n)
	}

	// Go heap memory is not registered: declined, and the owning path bounces it.
	heap := make([]byte, 8192)
	pattern(heap, off, false)
	if d.SubmitAt(ctx, heap, off, true, 0, make(completion, 1)) {
		t.Fatal("SubmitAt took a write from unregistered memory")
	}
	if err := d.WriteAt(ctx, heap, off, 0); err != nil {
		t.Fatalf("WriteAt from unregistered memory: %v", err)
	}
	back := make([]byte, len(heap))
	if d.SubmitAt(ctx, back, off, false, 0, make(completion, 1)) {
		t.Fatal("SubmitAt took a read into unregistered memory")
	}
	if err := d.ReadAt(ctx, back, off); err != nil {
		t.Fatalf("ReadAt into unregistered memory: %v", err)
	}
	if bad := pattern(back, off, true); bad >= 0 {
		t.Fatalf("bounced read: byte %d differs", bad)
	}

	// Out of range: declined, and ReadAt says why.
	if d.SubmitAt(ctx, back, d.Size(), false, 0, make(completion, 1)) {
		t.Fatal("SubmitAt took a read beyond the end of the LUN")
	}
	if err := d.ReadAt(ctx, back, d.Size()); err == nil || errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("ReadAt beyond the end: %v, want a range error", err)
	}
}
