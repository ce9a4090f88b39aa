package main

import (
	"context"
	"errors"
	"os"
	"strings"
	"testing"

	"go.uber.org/zap"

	"github.com/iser-blk/iser-blk/block"
	"github.com/iser-blk/iser-blk/frontend/nbd"
	"github.com/iser-blk/iser-blk/internal/statefile"
)

// nbdKernel stands in for the kernel calls of attachOrReattach: reattach answers with
// reattachErr (an attachment when nil), attach with an attachment of /dev/nbd0; each call is
// counted, and reattach calls onReattach first.
type nbdKernel struct {
	reattachErr       error
	onReattach        func()
	reattach, attach  int
	reattachedDevices []string
}

func (k *nbdKernel) install(t *testing.T) {
	t.Helper()
	oldAttach, oldReattach := nbdAttach, nbdReattach
	t.Cleanup(func() { nbdAttach, nbdReattach = oldAttach, oldReattach })
	nbdReattach = func(_ *nbd.Server, opts nbd.AttachOptions) (*nbd.Attachment, error) {
		k.reattach++
		k.reattachedDevices = append(k.reattachedDevices, opts.Device)
		if k.onReattach != nil {
			k.onReattach()
		}
		if k.reattachErr != nil {
			return nil, k.reattachErr
		}
		return &nbd.Attachment{}, nil
	}
	nbdAttach = func(*nbd.Server, nbd.AttachOptions) (*nbd.Attachment, error) {
		k.attach++
		return &nbd.Attachment{}, nil // index 0: /dev/nbd0
	}
}

// nbdSuccessor is a gateway by the name "gw" whose predecessor left prev in dir's state file,
// prepared as attach prepares it, with its NBD server on what it serves.
func nbdSuccessor(t *testing.T, dir string, prev statefile.State, cacheMode string) (*takeover, *nbd.Server, block.Device) {
	t.Helper()
	dev := memDevice(t, 1<<20)
	prev.Version, prev.Name, prev.Kind = statefile.Version, "gw", statefile.KindNBD
	prev.LUN = statefile.Identity{Target: "iscsi://192.0.2.1/iqn.2026-01.test:t1/1", Size: dev.Size(), BlockSize: dev.BlockSize()}
	if err := statefile.Write(statefile.Path(dir, "gw"), prev); err != nil {
		t.Fatal(err)
	}
	tk, err := prepareTakeover(&takeoverFlags{name: "gw", runDir: dir}, statefile.KindNBD, testTarget, cacheMode, dev, zap.NewNop())
	if err != nil || tk.prev == nil {
		t.Fatalf("prepareTakeover: %+v, %v", tk, err)
	}
	srv, err := nbd.NewServer(tk.serving(dev), nbd.Options{Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { srv.Close() })
	return tk, srv, dev
}

// After a planned restart the state says clean; the successor's write-back cache acknowledges
// the requests the kernel resends the moment Reattach hands it the sockets, so by then the state
// must say dirty already: a successor that died right after must not resume without them.
func TestReattachRecordsDirtyBeforeTheKernelResends(t *testing.T) {
	dir := t.TempDir()
	tk, srv, _ := nbdSuccessor(t, dir, statefile.State{DevID: 3, CacheMode: statefile.CacheWriteBack, PID: 1}, "writeback")
	var atReattach statefile.State
	k := &nbdKernel{onReattach: func() {
		var err error
		if atReattach, err = statefile.Read(tk.path); err != nil {
			t.Error(err)
		}
	}}
	k.install(t)
	if _, err := attachOrReattach(srv, nbd.AttachOptions{}, tk); err != nil {
		t.Fatal(err)
	}
	if k.reattach != 1 || k.attach != 0 || k.reattachedDevices[0] != "/dev/nbd3" {
		t.Fatalf("kernel calls: %+v", k)
	}
	if !atReattach.Dirty || atReattach.PID != os.Getpid() || atReattach.DevID != 3 {
		t.Fatalf("state when the kernel got the sockets: %+v, want dirty, this pid, device 3", atReattach)
	}
	// the restart check is installed: a zero Attachment is not configured through netlink
	if err := tk.checkCanWait(); err == nil || !strings.Contains(err.Error(), "ioctls") {
		t.Fatalf("restart check of the reattached device: %v", err)
	}
}

// A reattach that fails leaves the device waiting as the predecessor left it, and its state file
// saying what the predecessor's did (not this gateway's pid, not a dirty flag it never earned).
func TestReattachFailurePutsThePredecessorsStateBack(t *testing.T) {
	for name, c := range map[string]struct {
		err      error
		noResume bool
	}{
		"busy":  {nbd.ErrNotWaiting, true},
		"other": {errors.New("netlink: operation not permitted"), false},
	} {
		t.Run(name, func(t *testing.T) {
			dir := t.TempDir()
			prev := statefile.State{DevID: 3, CacheMode: statefile.CacheWriteBack, PID: 1}
			tk, srv, _ := nbdSuccessor(t, dir, prev, "writeback")
			k := &nbdKernel{reattachErr: c.err}
			k.install(t)
			_, err := attachOrReattach(srv, nbd.AttachOptions{}, tk)
			if !errors.Is(err, c.err) || errors.Is(err, errNoResume) != c.noResume {
				t.Fatalf("error %v", err)
			}
			st, err := statefile.Read(tk.path)
			if err != nil || st.PID != 1 || st.Dirty || st.DevID != 3 || k.attach != 0 {
				t.Fatalf("state after the failed reattach: %+v, %v (attach calls %d)", st, err, k.attach)
			}
			tk.recordFlushed() // the shutdown's final flush succeeds: the file is still not ours
			if st, err := statefile.Read(tk.path); err != nil || st.PID != 1 || st.CacheMode != statefile.CacheWriteBack {
				t.Fatalf("state after the shutdown: %+v, %v; want the predecessor's", st, err)
			}
		})
	}
}

// The device a fenced state named is gone (disconnected while no gateway ran): the new device
// is served unfenced, by a server built again on what serving returns now.
func TestReattachGoneFencedDeviceServesTheNewOneUnfenced(t *testing.T) {
	dir := t.TempDir()
	tk, srv, dev := nbdSuccessor(t, dir, statefile.State{DevID: 3, CacheMode: statefile.CacheWriteBack, Dirty: true, PID: 1}, "writeback")
	if tk.fenceReason() == "" {
		t.Fatal("the dirty write-back state is not fenced")
	}
	k := &nbdKernel{reattachErr: nbd.ErrNoDevice}
	k.install(t)
	if _, err := attachOrReattach(srv, nbd.AttachOptions{}, tk); !errors.Is(err, errUnfenced) {
		t.Fatalf("got %v, want errUnfenced", err)
	}
	if k.attach != 0 {
		t.Fatal("a new device was made on the fenced server")
	}
	if why := tk.fenceReason(); why != "" {
		t.Fatalf("still fenced: %s", why)
	}
	served := tk.serving(dev)
	if err := served.WriteAt(context.Background(), make([]byte, 4096), 0, 0); err != nil {
		t.Fatalf("write on the new device's stack: %v", err)
	}
	srv2, err := nbd.NewServer(served, nbd.Options{Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	defer srv2.Close()
	if _, err := attachOrReattach(srv2, nbd.AttachOptions{}, tk); err != nil || k.attach != 1 || k.reattach != 1 {
		t.Fatalf("second call: %v (kernel calls %+v)", err, k)
	}
	if st, err := statefile.Read(tk.path); err != nil || st.DevID != 0 || !st.Dirty || st.PID != os.Getpid() {
		t.Fatalf("state of the new device: %+v, %v", st, err)
	}
}

// The device a resumable state named is gone: a new one is made in the same call.
func TestReattachGoneResumableDeviceAttachesAfresh(t *testing.T) {
	dir := t.TempDir()
	tk, srv, _ := nbdSuccessor(t, dir, statefile.State{DevID: 3, CacheMode: statefile.CacheOff, PID: 1}, "off")
	k := &nbdKernel{reattachErr: nbd.ErrNoDevice}
	k.install(t)
	if _, err := attachOrReattach(srv, nbd.AttachOptions{}, tk); err != nil || k.attach != 1 {
		t.Fatalf("%v (kernel calls %+v)", err, k)
	}
	if st, err := statefile.Read(tk.path); err != nil || st.DevID != 0 || st.Dirty || st.PID != os.Getpid() {
		t.Fatalf("state of the new device: %+v, %v", st, err)
	}
}
