package takeover

import (
	"context"
	"errors"
	"os"
	"strings"
	"syscall"
	"testing"

	"github.com/iser-blk/iser-blk/backend/memdev/memdevtest"
	"github.com/iser-blk/iser-blk/block"
	"github.com/iser-blk/iser-blk/internal/modes"
	"github.com/iser-blk/iser-blk/internal/statefile"
)

func memDevice(t *testing.T, size int64) block.Device { return memdevtest.New(t, size) }

const testTarget = "iscsi://192.0.2.1/iqn.2026-01.test:t1/1"

// prepare is Prepare as attach --name calls it for gateway name in dir serving dev.
func prepare(t *testing.T, dir, name string, kind modes.Frontend, cacheMode modes.Cache, dev block.Device) (*Takeover, error) {
	t.Helper()
	return Prepare(Options{Dir: dir, Name: name, Kind: kind, CacheMode: cacheMode,
		LUN: statefile.Identity{Target: testTarget, Size: dev.Size(), BlockSize: dev.BlockSize()}})
}

func mustPrepare(t *testing.T, dir, name string, kind modes.Frontend, cacheMode modes.Cache, dev block.Device) *Takeover {
	t.Helper()
	tk, err := prepare(t, dir, name, kind, cacheMode, dev)
	if err != nil {
		t.Fatal(err)
	}
	return tk
}

func readState(t *testing.T, tk *Takeover) statefile.State {
	t.Helper()
	st, err := statefile.Read(tk.Path())
	if err != nil {
		t.Fatal(err)
	}
	return st
}

func TestPrepareFreshThenResume(t *testing.T) {
	dir := t.TempDir()
	dev := memDevice(t, 1<<20)
	tk := mustPrepare(t, dir, "gw1", modes.Ublk, modes.WriteThrough, dev)
	if tk.Previous() != nil {
		t.Fatal("a fresh takeover has a predecessor")
	}
	if err := tk.Record(modes.Ublk, 5); err != nil {
		t.Fatal(err)
	}
	again := mustPrepare(t, dir, "gw1", modes.Ublk, modes.WriteThrough, dev)
	if p := again.Previous(); p == nil || p.DevID != 5 || p.Dirty {
		t.Fatalf("successor's predecessor: %+v", p)
	}
	if again.FenceReason() != "" {
		t.Fatal("a write-through device is fenced")
	}
	again.Forget()
	if _, err := os.Stat(again.Path()); !os.IsNotExist(err) {
		t.Fatalf("state file survived Forget: %v", err)
	}
}

func TestPrepareRefuses(t *testing.T) {
	dir := t.TempDir()
	dev := memDevice(t, 1<<20)
	if err := mustPrepare(t, dir, "gw", modes.Ublk, modes.Off, dev).Record(modes.Ublk, 0); err != nil {
		t.Fatal(err)
	}
	if _, err := prepare(t, dir, "gw", modes.NBD, modes.Off, dev); !errors.Is(err, ErrNoResume) {
		t.Errorf("other kind: %v", err)
	}
	other := Options{Dir: dir, Name: "gw", Kind: modes.Ublk, CacheMode: modes.Off,
		LUN: statefile.Identity{Target: "iscsi://192.0.2.1/iqn.other/1", Size: dev.Size(), BlockSize: dev.BlockSize()}}
	if _, err := Prepare(other); !errors.Is(err, ErrNoResume) || !errors.Is(err, statefile.ErrForeign) {
		t.Errorf("other LUN: %v", err)
	}
	if _, err := prepare(t, dir, "gw", modes.Ublk, modes.Off, memDevice(t, 2<<20)); !errors.Is(err, statefile.ErrForeign) {
		t.Errorf("other size: %v", err)
	}
	if err := os.WriteFile(statefile.Path(dir, "gw"), []byte("{torn"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := prepare(t, dir, "gw", modes.Ublk, modes.Off, dev); !errors.Is(err, ErrNoResume) || !errors.Is(err, statefile.ErrCorrupt) {
		t.Errorf("corrupt: %v", err)
	}
}

// The state is dirty only while acknowledged writes may be unwritten: a write-back gateway
// that died right after a flush (or idle) is resumed, one that died with dirty pages fenced.
func TestWriteBackStateFollowsTheDirtyMark(t *testing.T) {
	dir := t.TempDir()
	dev := memDevice(t, 1<<20)
	tk := mustPrepare(t, dir, "wb", modes.Ublk, modes.WriteBack, dev)
	g := tk.Serving(dev)
	if err := tk.Record(modes.Ublk, 2); err != nil {
		t.Fatal(err)
	}
	if readState(t, tk).Dirty {
		t.Fatal("a write-back device that took no write is recorded dirty")
	}
	// an idle crash: the successor resumes
	if why := mustPrepare(t, dir, "wb", modes.Ublk, modes.WriteBack, dev).FenceReason(); why != "" {
		t.Fatalf("idle crash fenced: %s", why)
	}
	if err := g.WriteAt(context.Background(), make([]byte, 4096), 0, 0); err != nil {
		t.Fatal(err)
	}
	if !readState(t, tk).Dirty {
		t.Fatal("a write was acknowledged with the state clean")
	}
	if why := mustPrepare(t, dir, "wb", modes.Ublk, modes.WriteBack, dev).FenceReason(); why == "" {
		t.Fatal("a crash after an unflushed write is not fenced")
	}
	if err := g.Flush(context.Background()); err != nil {
		t.Fatal(err)
	}
	if readState(t, tk).Dirty {
		t.Fatal("still dirty after a flush that left nothing dirty")
	}
}

func TestDirtyWriteBackIsFencedAndStaysFenced(t *testing.T) {
	dir := t.TempDir()
	dev := memDevice(t, 1<<20)
	first := mustPrepare(t, dir, "wb", modes.Ublk, modes.WriteBack, dev)
	g := first.Serving(dev)
	if err := first.Record(modes.Ublk, 2); err != nil {
		t.Fatal(err)
	}
	if err := g.WriteAt(context.Background(), make([]byte, 4096), 0, 0); err != nil {
		t.Fatal(err)
	}
	// The gateway dies here with a dirty page; its successor runs with the cache off.
	next := mustPrepare(t, dir, "wb", modes.Ublk, modes.Off, dev)
	fenced := next.Serving(dev)
	ctx := context.Background()
	buf := make([]byte, 4096)
	for name, err := range map[string]error{
		"read":  fenced.ReadAt(ctx, buf, 0),
		"write": fenced.WriteAt(ctx, buf, 0, 0),
		"flush": fenced.Flush(ctx),
		"trim":  fenced.Discard(ctx, 0, 4096),
		"zero":  fenced.WriteZeroes(ctx, 0, 4096, 0),
	} {
		if block.Errno(err) != syscall.EIO || !strings.Contains(err.Error(), "fsck") {
			t.Errorf("%s on a fenced device: %v", name, err)
		}
	}
	if err := next.Record(modes.Ublk, 2); err != nil {
		t.Fatal(err)
	}
	next.RecordFlushed()
	if !readState(t, next).Dirty {
		t.Fatal("a fenced device's state became clean: the next successor would resume it")
	}
	// The third (write-through) must still fence: the writes the first may have lost are lost.
	third := mustPrepare(t, dir, "wb", modes.Ublk, modes.WriteThrough, dev)
	if third.FenceReason() == "" {
		t.Fatalf("the third gateway resumes a device fenced since the first died (%+v)", third.Previous())
	}
}

// A write-back gateway whose device outlives it and whose final flush succeeded records the
// state clean: the next gateway resumes. Not a state file already removed, not one never written.
func TestRecordFlushed(t *testing.T) {
	dev := memDevice(t, 1<<20)
	dirtyGateway := func(t *testing.T) *Takeover {
		tk := mustPrepare(t, t.TempDir(), "wb", modes.Ublk, modes.WriteBack, dev)
		g := tk.Serving(dev)
		if err := tk.Record(modes.Ublk, 4); err != nil {
			t.Fatal(err)
		}
		if err := g.WriteAt(context.Background(), make([]byte, 4096), 0, 0); err != nil {
			t.Fatal(err)
		}
		return tk
	}
	t.Run("kept device", func(t *testing.T) {
		tk := dirtyGateway(t)
		tk.RecordFlushed()
		if st := readState(t, tk); st.Dirty || st.DevID != 4 {
			t.Fatalf("state after a flushed shutdown: %+v", st)
		}
	})
	t.Run("forgotten", func(t *testing.T) {
		tk := dirtyGateway(t)
		tk.Forget()
		tk.RecordFlushed()
		if _, err := os.Stat(tk.Path()); !os.IsNotExist(err) {
			t.Fatalf("a removed state file came back: %v", err)
		}
	})
	t.Run("never recorded", func(t *testing.T) {
		tk := mustPrepare(t, t.TempDir(), "wb", modes.Ublk, modes.WriteBack, dev)
		tk.RecordFlushed()
		if _, err := os.Stat(tk.Path()); !os.IsNotExist(err) {
			t.Fatalf("a state file appeared: %v", err)
		}
		if err := tk.RecordDirty(); err == nil {
			t.Fatal("RecordDirty with no recorded device succeeded: a write would be acknowledged unprotected")
		}
	})
}

// A device whose gateway kept written data in a cache device's log (--cache-dev) is resumed only
// by a gateway with the same cache device: without it, the target's older data would show. It
// is never fenced for a crash (the log keeps every acknowledged write), and a successor may add a
// cache device to a device that had none. A gateway with a cache device is recorded as
// write-through whatever its --cache says, so its state never turns dirty.
func TestCacheDevMustFollow(t *testing.T) {
	dir := t.TempDir()
	dev := memDevice(t, 1<<20)
	opts := func(cacheDev string) Options {
		return Options{Dir: dir, Name: "cd", Kind: modes.Ublk, CacheMode: modes.WriteBack, CacheDev: cacheDev,
			LUN: statefile.Identity{Target: testTarget, Size: dev.Size(), BlockSize: dev.BlockSize()}}
	}
	tk, err := Prepare(opts("/var/lib/iser-blk/cd.cache"))
	if err != nil {
		t.Fatal(err)
	}
	tk.Serving(dev)
	if err := tk.Record(modes.Ublk, 3); err != nil {
		t.Fatal(err)
	}
	if st := readState(t, tk); st.CacheDev != "/var/lib/iser-blk/cd.cache" || st.Dirty || st.CacheMode != modes.WriteThrough {
		t.Fatalf("state: %+v", st)
	}
	for _, other := range []string{"", "/elsewhere.cache"} {
		if _, err := Prepare(opts(other)); !errors.Is(err, ErrNoResume) || !strings.Contains(err.Error(), "--cache-dev /var/lib/iser-blk/cd.cache") {
			t.Errorf("successor with cache device %q: %v", other, err)
		}
	}
	same, err := Prepare(opts("/var/lib/iser-blk/cd.cache"))
	if err != nil || same.FenceReason() != "" {
		t.Fatalf("successor with the same cache device: %v, fenced %q", err, same.FenceReason())
	}
	if err := os.Remove(tk.Path()); err != nil {
		t.Fatal(err)
	}
	plain := mustPrepare(t, dir, "cd", modes.Ublk, modes.WriteThrough, dev)
	if err := plain.Record(modes.Ublk, 3); err != nil {
		t.Fatal(err)
	}
	if _, err := Prepare(opts("/var/lib/iser-blk/cd.cache")); err != nil {
		t.Fatalf("adding a cache device: %v", err)
	}
}
