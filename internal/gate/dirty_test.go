package gate

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/iser-blk/iser-blk/block"
	"github.com/iser-blk/iser-blk/block/blocktest"
	"github.com/iser-blk/iser-blk/cache"
)

// fakeRecorder is the state file as a flag, checking at every clean record that the cache
// below holds nothing dirty: the invariant the gate exists for.
type fakeRecorder struct {
	t       *testing.T
	below   block.DirtyReporter // nil: no check
	fail    atomic.Bool         // RecordDirty fails
	dirty   atomic.Bool
	dirties atomic.Int64
	cleans  atomic.Int64
}

func (r *fakeRecorder) RecordDirty() error {
	if r.fail.Load() {
		return errors.New("disk full")
	}
	r.dirty.Store(true)
	r.dirties.Add(1)
	return nil
}

func (r *fakeRecorder) RecordClean() error {
	if r.below != nil {
		if n := r.below.DirtyBytes(); n != 0 {
			r.t.Errorf("clean recorded with %d dirty bytes below", n)
		}
	}
	r.dirty.Store(false)
	r.cleans.Add(1)
	return nil
}

func writeBackCache(t *testing.T, dev block.Device) *cache.Cache {
	t.Helper()
	cfg, err := cache.ParseConfig("writeback", "4MiB", "50%")
	if err != nil {
		t.Fatal(err)
	}
	c, err := cache.New(dev, cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// recordingDevice notes whether the recorder said dirty when each write arrived.
type recordingDevice struct {
	block.Device
	rec        *fakeRecorder
	cleanWrite atomic.Bool // a write arrived while the state was clean
}

func (d *recordingDevice) WriteAt(ctx context.Context, p []byte, off int64, f block.WriteFlags) error {
	if !d.rec.dirty.Load() {
		d.cleanWrite.Store(true)
	}
	return d.Device.WriteAt(ctx, p, off, f)
}

func TestDirtyRecordedBeforeTheFirstWrite(t *testing.T) {
	rec := &fakeRecorder{t: t}
	d := &recordingDevice{Device: memDevice(t, 1<<20), rec: rec}
	g := New(d, Options{Recorder: rec})
	ctx := context.Background()
	for i := range 3 {
		if err := g.WriteAt(ctx, make([]byte, 4096), int64(i)*4096, 0); err != nil {
			t.Fatal(err)
		}
	}
	if d.cleanWrite.Load() {
		t.Fatal("a write reached the device while the state said clean")
	}
	if n := rec.dirties.Load(); n != 1 {
		t.Fatalf("%d dirty records for three writes, want 1", n)
	}
}

func TestFlushThatLeavesNothingDirtyRecordsClean(t *testing.T) {
	c := writeBackCache(t, memDevice(t, 1<<20))
	rec := &fakeRecorder{t: t, below: c}
	g := New(c, Options{Recorder: rec})
	ctx := context.Background()
	buf := make([]byte, 4096)
	if err := g.WriteAt(ctx, buf, 0, 0); err != nil {
		t.Fatal(err)
	}
	if !rec.dirty.Load() || c.DirtyBytes() == 0 {
		t.Fatalf("after a cached write: recorded dirty %v, %d dirty bytes", rec.dirty.Load(), c.DirtyBytes())
	}
	if err := g.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	if rec.dirty.Load() {
		t.Fatal("the state stayed dirty after a flush that left nothing dirty")
	}
	if g.WriteCached(buf, 4096) { // the fast path must not write while the state says clean
		t.Fatal("WriteCached let a write through with the state clean")
	}
	if err := g.WriteAt(ctx, buf, 4096, 0); err != nil {
		t.Fatal(err)
	}
	if !rec.dirty.Load() || rec.dirties.Load() != 2 {
		t.Fatalf("a write after the clean point: dirty %v, %d dirty records, want true, 2", rec.dirty.Load(), rec.dirties.Load())
	}
	if !g.WriteCached(buf, 8192) {
		t.Fatal("WriteCached refused with the state dirty")
	}
}

func TestWriteRefusedWhenTheDirtyMarkCannotBeRecorded(t *testing.T) {
	rec := &fakeRecorder{t: t}
	rec.fail.Store(true)
	d := &recordingDevice{Device: memDevice(t, 1<<20), rec: rec}
	g := New(d, Options{Recorder: rec})
	err := g.WriteAt(context.Background(), make([]byte, 4096), 0, 0)
	if !errors.Is(err, block.ErrIO) || !errors.Is(err, ErrRecord) {
		t.Fatalf("write with the mark unrecordable: %v, want ErrIO and ErrRecord", err)
	}
	if d.cleanWrite.Load() {
		t.Fatal("the write reached the device")
	}
	if err := g.Discard(context.Background(), 0, 4096); !errors.Is(err, ErrRecord) {
		t.Fatalf("discard with the mark unrecordable: %v", err)
	}
	rec.fail.Store(false)
	if err := g.WriteAt(context.Background(), make([]byte, 4096), 0, 0); err != nil {
		t.Fatalf("write once the mark can be recorded: %v", err)
	}
}

// heldWriteDevice blocks writes until release closes.
type heldWriteDevice struct {
	block.Device
	entered chan struct{}
	release chan struct{}
}

func (d *heldWriteDevice) WriteAt(ctx context.Context, p []byte, off int64, f block.WriteFlags) error {
	d.entered <- struct{}{}
	<-d.release
	return d.Device.WriteAt(ctx, p, off, f)
}

func TestNoCleanWhileAWriteIsOnItsWay(t *testing.T) {
	rec := &fakeRecorder{t: t}
	d := &heldWriteDevice{Device: memDevice(t, 1<<20), entered: make(chan struct{}, 1), release: make(chan struct{})}
	g := New(d, Options{Recorder: rec})
	done := make(chan error, 1)
	go func() { done <- g.WriteAt(context.Background(), make([]byte, 4096), 0, 0) }()
	<-d.entered // past the dirty check, not yet stored
	if clean, err := g.MarkClean(); clean || err != nil {
		t.Fatalf("MarkClean with a write on its way: clean %v, %v", clean, err)
	}
	if !rec.dirty.Load() {
		t.Fatal("clean recorded while a write was on its way")
	}
	close(d.release)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if clean, err := g.MarkClean(); !clean || err != nil || rec.dirty.Load() {
		t.Fatalf("MarkClean once it ended (no cache: nothing dirty below): clean %v, %v", clean, err)
	}
}

func TestInheritedDirtyStaysUntilAFlush(t *testing.T) {
	rec := &fakeRecorder{t: t}
	g := New(memDevice(t, 1<<20), Options{Recorder: rec, Dirty: true})
	if err := g.WriteAt(context.Background(), make([]byte, 4096), 0, 0); err != nil {
		t.Fatal(err)
	}
	if rec.dirties.Load() != 0 {
		t.Fatal("recorded dirty again over a state that already said so")
	}
}

// TestDirtyMarkUnderConcurrency races writers (WriteAt and WriteCached) and flushers through a
// real write-back cache: every clean record is checked against the cache (fakeRecorder), and
// after the last flush the state must be clean.
func TestDirtyMarkUnderConcurrency(t *testing.T) {
	c := writeBackCache(t, memDevice(t, 4<<20))
	rec := &fakeRecorder{t: t, below: c}
	g := New(c, Options{Recorder: rec})
	ctx := context.Background()
	var wg sync.WaitGroup
	for w := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			buf := make([]byte, 4096)
			for i := range 300 {
				off := int64((w*300+i)%1024) * 4096
				if i%2 == 0 && g.WriteCached(buf, off) {
					continue
				}
				if err := g.WriteAt(ctx, buf, off, 0); err != nil {
					t.Error(err)
					return
				}
			}
		}()
	}
	for range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 50 {
				if err := g.Flush(ctx); err != nil {
					t.Error(err)
					return
				}
			}
		}()
	}
	wg.Wait()
	if err := g.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	if rec.dirty.Load() {
		t.Fatalf("dirty after the last flush (%d dirty bytes)", c.DirtyBytes())
	}
	if rec.cleans.Load() == 0 || rec.dirties.Load() == 0 {
		t.Fatalf("%d dirty and %d clean records: the race did not happen", rec.dirties.Load(), rec.cleans.Load())
	}
}

func TestConformance(t *testing.T) {
	t.Run("open", func(t *testing.T) {
		blocktest.Run(t, func(t *testing.T) block.Device { return New(memDevice(t, 16<<20), Options{}) })
	})
	t.Run("dirty mark over a write-back cache", func(t *testing.T) {
		blocktest.Run(t, func(t *testing.T) block.Device {
			c := writeBackCache(t, memDevice(t, 16<<20))
			return New(c, Options{Recorder: &fakeRecorder{t: t, below: c}})
		})
	})
}
