package main

import (
	"context"
	"errors"
	"os"
	"strings"
	"syscall"
	"testing"

	"go.uber.org/zap"

	"github.com/iser-blk/iser-blk/backend/memdev"
	"github.com/iser-blk/iser-blk/block"
	"github.com/iser-blk/iser-blk/internal/lifecycle"
	"github.com/iser-blk/iser-blk/internal/statefile"
	"github.com/iser-blk/iser-blk/internal/status"
)

func memDevice(t *testing.T, size int64) block.Device {
	t.Helper()
	d, err := memdev.New(size, memdev.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.Close() })
	return d
}

const testTarget = "iscsi://user@192.0.2.1/iqn.2026-01.test:t1/1"

func TestPrepareTakeoverFreshThenResume(t *testing.T) {
	dir := t.TempDir()
	dev := memDevice(t, 1<<20)
	tf := &takeoverFlags{name: "gw1", runDir: dir}
	tk, err := prepareTakeover(tf, statefile.KindUblk, testTarget, "wt", dev, zap.NewNop())
	if err != nil || tk == nil || tk.prev != nil {
		t.Fatalf("fresh: %+v, %v", tk, err)
	}
	if strings.Contains(tk.lun.Target, "user") {
		t.Fatalf("credentials in the state file's identity: %s", tk.lun.Target)
	}
	if err := tk.record(statefile.KindUblk, 5); err != nil {
		t.Fatal(err)
	}
	again, err := prepareTakeover(tf, statefile.KindUblk, testTarget, "writethrough", dev, zap.NewNop())
	if err != nil || again.prev == nil || again.prev.DevID != 5 || again.prev.Dirty {
		t.Fatalf("successor: %+v, %v", again, err)
	}
	if got := again.serveDevice(dev); got != dev {
		t.Fatal("a write-through device was fenced")
	}
	again.forget()
	if _, err := os.Stat(statefile.Path(dir, "gw1")); !os.IsNotExist(err) {
		t.Fatalf("state file survived forget: %v", err)
	}
}

func TestPrepareTakeoverRefuses(t *testing.T) {
	dir := t.TempDir()
	dev := memDevice(t, 1<<20)
	tf := &takeoverFlags{name: "gw", runDir: dir}
	tk, err := prepareTakeover(tf, statefile.KindUblk, testTarget, "off", dev, zap.NewNop())
	if err != nil {
		t.Fatal(err)
	}
	if err := tk.record(statefile.KindUblk, 0); err != nil {
		t.Fatal(err)
	}
	if _, err := prepareTakeover(tf, statefile.KindNBD, testTarget, "off", dev, zap.NewNop()); !errors.Is(err, errNoResume) {
		t.Errorf("other kind: %v", err)
	}
	if _, err := prepareTakeover(tf, statefile.KindUblk, "iscsi://192.0.2.1/iqn.other/1", "off", dev, zap.NewNop()); !errors.Is(err, errNoResume) || !errors.Is(err, statefile.ErrForeign) {
		t.Errorf("other LUN: %v", err)
	}
	if _, err := prepareTakeover(tf, statefile.KindUblk, testTarget, "off", memDevice(t, 2<<20), zap.NewNop()); !errors.Is(err, statefile.ErrForeign) {
		t.Errorf("other size: %v", err)
	}
	if err := os.WriteFile(statefile.Path(dir, "gw"), []byte("{torn"), 0o600); err != nil {
		t.Fatal(err)
	}
	_, err = prepareTakeover(tf, statefile.KindUblk, testTarget, "off", dev, zap.NewNop())
	if !errors.Is(err, errNoResume) || !errors.Is(err, statefile.ErrCorrupt) {
		t.Errorf("corrupt: %v", err)
	}
	if code := failTakeover(err); code != exitNoResume {
		t.Errorf("exit code %d, want %d", code, exitNoResume)
	}
	if _, err := prepareTakeover(&takeoverFlags{name: "../x", runDir: dir}, statefile.KindUblk, testTarget, "off", dev, zap.NewNop()); exitCode(err) != exitUsage {
		t.Errorf("bad name: %v", err)
	}
}

func TestDirtyWriteBackIsFenced(t *testing.T) {
	dir := t.TempDir()
	dev := memDevice(t, 1<<20)
	tf := &takeoverFlags{name: "wb", runDir: dir}
	tk, err := prepareTakeover(tf, statefile.KindUblk, testTarget, "writeback", dev, zap.NewNop())
	if err != nil {
		t.Fatal(err)
	}
	if err := tk.record(statefile.KindUblk, 2); err != nil {
		t.Fatal(err)
	}
	// The gateway dies here without a planned shutdown; its successor runs with the cache off.
	next, err := prepareTakeover(tf, statefile.KindUblk, testTarget, "off", dev, zap.NewNop())
	if err != nil || !next.prev.Dirty {
		t.Fatalf("successor: %+v, %v", next, err)
	}
	fenced := next.serveDevice(dev)
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
	if fenced.Size() != dev.Size() {
		t.Fatal("fenced device lost its geometry")
	}
	if err := next.record(statefile.KindUblk, 2); err != nil {
		t.Fatal(err)
	}
	if st, _ := statefile.Read(next.path); !st.Dirty {
		t.Fatal("a fenced device's state became clean: the next successor would resume it")
	}
	// The cache-off successor dies too; the one after it (write-through) must still fence: the
	// state now names cache off, and the writes the first gateway may have lost are still lost.
	third, err := prepareTakeover(tf, statefile.KindUblk, testTarget, "writethrough", dev, zap.NewNop())
	if err != nil {
		t.Fatal(err)
	}
	if third.fenceReason() == "" {
		t.Fatalf("the third gateway resumes a device fenced since the first died (state %+v)", *third.prev)
	}
	if err := third.serveDevice(dev).WriteAt(ctx, buf, 0, 0); block.Errno(err) != syscall.EIO {
		t.Fatalf("write on the third gateway's device: %v", err)
	}
}

// A write-back gateway whose device outlives it (a start that failed after the state was
// recorded dirty) and whose final flush succeeded records the state clean: the next gateway
// resumes. Not a fenced device, not a state file already removed, not one never written.
func TestRecordFlushed(t *testing.T) {
	dev := memDevice(t, 1<<20)
	start := func(t *testing.T, dir string) *takeover {
		t.Helper()
		tk, err := prepareTakeover(&takeoverFlags{name: "wb", runDir: dir}, statefile.KindUblk, testTarget, "writeback", dev, zap.NewNop())
		if err != nil {
			t.Fatal(err)
		}
		return tk
	}
	t.Run("kept device", func(t *testing.T) {
		tk := start(t, t.TempDir())
		if err := tk.record(statefile.KindUblk, 4); err != nil {
			t.Fatal(err)
		}
		tk.recordFlushed()
		if st, err := statefile.Read(tk.path); err != nil || st.Dirty || st.DevID != 4 {
			t.Fatalf("state after a flushed shutdown: %+v, %v", st, err)
		}
	})
	t.Run("fenced device", func(t *testing.T) {
		dir := t.TempDir()
		if err := start(t, dir).record(statefile.KindUblk, 4); err != nil {
			t.Fatal(err)
		}
		next := start(t, dir) // the first died dirty: the device is fenced
		if err := next.record(statefile.KindUblk, 4); err != nil {
			t.Fatal(err)
		}
		next.recordFlushed()
		if st, err := statefile.Read(next.path); err != nil || !st.Dirty {
			t.Fatalf("a fenced device's state after a flushed shutdown: %+v, %v", st, err)
		}
	})
	t.Run("forgotten", func(t *testing.T) {
		tk := start(t, t.TempDir())
		if err := tk.record(statefile.KindUblk, 4); err != nil {
			t.Fatal(err)
		}
		tk.forget()
		tk.recordFlushed()
		if _, err := os.Stat(tk.path); !os.IsNotExist(err) {
			t.Fatalf("a removed state file came back: %v", err)
		}
	})
	t.Run("never recorded", func(t *testing.T) {
		tk := start(t, t.TempDir())
		tk.recordFlushed()
		if _, err := os.Stat(tk.path); !os.IsNotExist(err) {
			t.Fatalf("a state file appeared: %v", err)
		}
	})
}

// A gateway taking over the device a previous one left is recovering until the device is
// announced; one that takes nothing over stays starting.
func TestTakingOverIsRecovering(t *testing.T) {
	dir := t.TempDir()
	dev := memDevice(t, 1<<20)
	tf := &takeoverFlags{name: "gw", runDir: dir}
	first, err := prepareTakeover(tf, statefile.KindUblk, testTarget, "off", dev, zap.NewNop())
	if err != nil {
		t.Fatal(err)
	}
	g, err := startGateway(&serviceFlags{name: "gw", runDir: t.TempDir()}, identity("gw", "ublk", "", &exportFlags{}), new(status.IOCounters), func() {}, zap.NewNop())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = g.svc.Close() })
	at := &attachment{g: g, tk: first}
	at.takingOver()
	if s, _ := g.svc.Lifecycle.State(); s != lifecycle.Starting {
		t.Fatalf("a fresh attach is %s, want starting", s)
	}
	if err := first.record(statefile.KindUblk, 2); err != nil {
		t.Fatal(err)
	}
	next, err := prepareTakeover(tf, statefile.KindUblk, testTarget, "off", dev, zap.NewNop())
	if err != nil {
		t.Fatal(err)
	}
	at.tk = next
	at.takingOver()
	if s, r := g.svc.Lifecycle.State(); s != lifecycle.Recovering || !strings.Contains(r, "ublk device a previous gateway") {
		t.Fatalf("taking over: %s (%q), want recovering", s, r)
	}
	g.ready()
	if s, _ := g.svc.Lifecycle.State(); s != lifecycle.Ready {
		t.Fatalf("after the announce: %s, want ready", s)
	}
}
