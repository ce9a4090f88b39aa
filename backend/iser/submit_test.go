package iser

import (
	"bytes"
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/iser-blk/iser-blk/backend/iser/internal/session"
	"github.com/iser-blk/iser-blk/backend/iser/scsi"
	"github.com/iser-blk/iser-blk/backend/iser/scsi/scsitest"
	"github.com/iser-blk/iser-blk/block"
)

// submitLUN is a scsitest LUN that also takes commands through Submit, like a session: they are
// held until Kick and then completed from other goroutines.
type submitLUN struct {
	*scsitest.LUN
	mu      sync.Mutex
	queued  []func()
	decline bool
}

func (s *submitLUN) Submit(cmd *scsi.Command, resp *scsi.Response, done session.Completer) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.decline {
		return false
	}
	s.queued = append(s.queued, func() {
		*resp = scsi.Response{}
		done.Complete(s.LUN.Execute(context.Background(), cmd, resp))
	})
	return true
}

func (s *submitLUN) Kick() {
	s.mu.Lock()
	q := s.queued
	s.queued = nil
	s.mu.Unlock()
	for _, f := range q {
		go f()
	}
}

type devCompletion chan error

func (c devCompletion) Complete(err error) { c <- err }

func (c devCompletion) wait(t *testing.T) error {
	t.Helper()
	select {
	case err := <-c:
		return err
	case <-time.After(10 * time.Second):
		t.Fatal("request never completed")
		return nil
	}
}

func openSubmit(t *testing.T, cfg scsitest.Config) (*Device, *submitLUN) {
	t.Helper()
	return openWith(t, cfg, func(lun *scsitest.LUN) *submitLUN { return &submitLUN{LUN: lun} })
}

func TestSubmitAt(t *testing.T) {
	ctx := context.Background()
	d, lun := openSubmit(t, scsitest.Config{DPOFUA: true})
	if got := d.SubmitWriteMax(); got != defaultMaxTransfer {
		t.Fatalf("SubmitWriteMax = %d, want one command's worth (%d): the executor sets no limit", got, defaultMaxTransfer)
	}
	data := randBytes(8192)
	done := make(devCompletion, 2)
	if !d.SubmitAt(ctx, data[:4096], 4096, true, 0, done) || !d.SubmitAt(ctx, data[4096:], 8192, true, block.FUA, done) {
		t.Fatal("writes not submitted")
	}
	d.Kick()
	for range 2 {
		if err := done.wait(t); err != nil {
			t.Fatal(err)
		}
	}
	got := make([]byte, 8192)
	if !d.SubmitAt(ctx, got, 4096, false, 0, done) {
		t.Fatal("read not submitted")
	}
	d.Kick()
	if err := done.wait(t); err != nil || !bytes.Equal(got, data) {
		t.Fatalf("read back: %v, equal %v", err, bytes.Equal(got, data))
	}
	w := opsWith(lun.LUN, 0x2a, 0x8a)
	if len(w) != 2 || w[0].FUA != (w[0].LBA == 16) || w[1].FUA != (w[1].LBA == 16) {
		t.Fatalf("writes on the LUN (the one at LBA 16 with FUA): %+v", w)
	}
	if p := d.paths[0]; p.outstanding.Load() != 0 || p.commands.Load() != 3 {
		t.Fatalf("path counters: outstanding %d, commands %d", p.outstanding.Load(), p.commands.Load())
	}

	for _, tc := range []struct {
		name  string
		p     []byte
		off   int64
		write bool
	}{
		{"empty", nil, 0, false},
		{"misaligned", make([]byte, 512), 100, false},
		{"past the end", make([]byte, 512), 64 << 20, false},
		{"over one command", make([]byte, defaultMaxTransfer+512), 0, false},
	} {
		if d.SubmitAt(ctx, tc.p, tc.off, tc.write, 0, done) {
			t.Errorf("%s: submitted", tc.name)
		}
	}
	lun.mu.Lock()
	lun.decline = true
	lun.mu.Unlock()
	if d.SubmitAt(ctx, got, 0, false, 0, done) {
		t.Fatal("submitted although the executor declined")
	}
	if p := d.paths[0]; p.outstanding.Load() != 0 {
		t.Fatalf("a declined submit left outstanding %d", p.outstanding.Load())
	}
}

// limitedLUN is a submitLUN whose Submit takes writes of at most writeMax bytes, as a session
// over iSCSI/TCP takes only writes whose data all goes as immediate data; it counts the writes
// offered to Submit.
type limitedLUN struct {
	*submitLUN
	writeMax int
	writes   int
}

func (l *limitedLUN) SubmitWriteMax() int { return l.writeMax }

func (l *limitedLUN) Submit(cmd *scsi.Command, resp *scsi.Response, done session.Completer) bool {
	if cmd.Dir == scsi.DirWrite {
		l.writes++
		if len(cmd.Data) > l.writeMax {
			return false
		}
	}
	return l.submitLUN.Submit(cmd, resp, done)
}

// TestSubmitAtWriteLimit: the device answers SubmitWriteMax with its executor's limit and
// declines a larger write before it builds and starts a command (the executor never sees it),
// while a read of the same size and a write within the limit go.
func TestSubmitAtWriteLimit(t *testing.T) {
	ctx := context.Background()
	d, lun := openWith(t, scsitest.Config{}, func(l *scsitest.LUN) *limitedLUN {
		return &limitedLUN{submitLUN: &submitLUN{LUN: l}, writeMax: 8192}
	})
	if got := d.SubmitWriteMax(); got != 8192 {
		t.Fatalf("SubmitWriteMax = %d, want the executor's 8192", got)
	}
	done := make(devCompletion, 2)
	if d.SubmitAt(ctx, randBytes(16384), 0, true, 0, done) {
		t.Fatal("a 16 KiB write was submitted over an 8 KiB limit")
	}
	if lun.writes != 0 {
		t.Fatalf("the executor was offered %d writes over its limit, want none", lun.writes)
	}
	if !d.SubmitAt(ctx, make([]byte, 16384), 0, false, 0, done) || !d.SubmitAt(ctx, randBytes(8192), 0, true, 0, done) {
		t.Fatal("a 16 KiB read or an 8 KiB write was not submitted")
	}
	d.Kick()
	for range 2 {
		if err := done.wait(t); err != nil {
			t.Fatal(err)
		}
	}
	if p := d.paths[0]; p.outstanding.Load() != 0 {
		t.Fatalf("outstanding %d after every request completed", p.outstanding.Load())
	}
}

// TestSubmitAtFallback: a first attempt that is not a final answer is redone by the synchronous
// path (retries, UNIT ATTENTION reporting), a final SCSI error is reported as ReadAt would.
func TestSubmitAtFallback(t *testing.T) {
	ctx := context.Background()
	t.Run("unit attention", func(t *testing.T) {
		d, lun := openSubmit(t, scsitest.Config{})
		lun.SetUnitAttention(0x2A, 0x09) // capacity data has changed
		done := make(devCompletion, 1)
		if !d.SubmitAt(ctx, make([]byte, 4096), 0, false, 0, done) {
			t.Fatal("not submitted")
		}
		d.Kick()
		if err := done.wait(t); err != nil {
			t.Fatal(err)
		}
		if n := len(opsWith(lun.LUN, 0x28, 0x88)); n != 2 {
			t.Fatalf("%d READs reached the LUN, want the failed one and its re-issue", n)
		}
	})
	t.Run("transport error", func(t *testing.T) {
		d, lun := openSubmit(t, scsitest.Config{})
		lun.InjectFault(scsitest.Fault{Opcode: -1, Err: &session.ConnError{Err: errors.New("connection reset")}})
		done := make(devCompletion, 1)
		data := randBytes(4096)
		if !d.SubmitAt(ctx, data, 0, true, 0, done) {
			t.Fatal("not submitted")
		}
		d.Kick()
		if err := done.wait(t); err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(lun.Bytes(0, 4096), data) {
			t.Fatal("the re-issued write did not land")
		}
	})
	t.Run("medium error", func(t *testing.T) {
		d, lun := openSubmit(t, scsitest.Config{})
		lun.InjectFault(scsitest.Fault{Opcode: -1, Key: scsi.KeyMediumError, ASC: 0x11})
		done := make(devCompletion, 1)
		if !d.SubmitAt(ctx, make([]byte, 4096), 0, false, 0, done) {
			t.Fatal("not submitted")
		}
		d.Kick()
		if err := done.wait(t); !errors.Is(err, block.ErrMedium) {
			t.Fatalf("got %v, want a medium error", err)
		}
		if n := len(opsWith(lun.LUN, 0x28, 0x88)); n != 1 {
			t.Fatalf("%d READs reached the LUN for a final error", n)
		}
	})
	t.Run("no native FUA", func(t *testing.T) {
		d, _ := openSubmit(t, scsitest.Config{})
		if d.SubmitAt(ctx, make([]byte, 512), 0, true, block.FUA, make(devCompletion, 1)) {
			t.Fatal("a FUA write was submitted to a LUN without FUA (it needs SYNCHRONIZE CACHE after)")
		}
	})
}

// syncLUN answers every READ that Submit or SubmitToPipe takes with GOOD at once, on the
// submitting goroutine, without touching the LUN (which only serves the probe at open): the
// benchmarks below then measure the Device's own per-request cost of the asynchronous paths.
// SubmitToPipe writes n bytes of zeros into the pipe, as a session splicing them would.
type syncLUN struct {
	*scsitest.LUN
	zeros []byte
}

func (s *syncLUN) Submit(_ *scsi.Command, resp *scsi.Response, done session.Completer) bool {
	*resp = scsi.Response{}
	done.Complete(nil)
	return true
}

func (s *syncLUN) Kick() {}

func (s *syncLUN) SubmitToPipe(_ *scsi.Command, n, pipeW int, resp *scsi.Response, done session.Completer) bool {
	*resp = scsi.Response{}
	done.Complete(fillPipe(pipeW, s.zeros[:n]))
	return true
}

// BenchmarkDeviceSubmitRead4K: a 4 KiB read through SubmitAt and its completion allocate nothing
// (0 allocs/op).
func BenchmarkDeviceSubmitRead4K(b *testing.B) {
	d, _ := openWith(b, scsitest.Config{}, func(lun *scsitest.LUN) *syncLUN { return &syncLUN{LUN: lun} })
	ctx, buf, done := context.Background(), make([]byte, 4096), make(devCompletion, 1)
	b.ReportAllocs()
	b.SetBytes(4096)
	for i := 0; b.Loop(); i++ {
		if !d.SubmitAt(ctx, buf, int64(i%1024)*4096, false, 0, done) {
			b.Fatal("SubmitAt declined")
		}
		if err := <-done; err != nil {
			b.Fatal(err)
		}
	}
}
