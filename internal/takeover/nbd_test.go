package takeover

import (
	"context"
	"errors"
	"os"
	"strings"
	"testing"

	"go.uber.org/zap"

	"github.com/iser-blk/iser-blk/block"
	"github.com/iser-blk/iser-blk/frontend/nbd"
	"github.com/iser-blk/iser-blk/internal/modes"
	"github.com/iser-blk/iser-blk/internal/statefile"
)

// fakeNBD stands in for the kernel calls of AttachNBD: reattach answers with reattachErr (an
// attachment when nil), attach with an attachment of /dev/nbd0; each call is counted, and
// reattach calls onReattach first.
type fakeNBD struct {
	reattachErr       error
	onReattach        func()
	reattach, attach  int
	reattachedDevices []string
}

func (k *fakeNBD) kernel() NBDKernel {
	return NBDKernel{
		Reattach: func(_ *nbd.Server, opts nbd.AttachOptions) (*nbd.Attachment, error) {
			k.reattach++
			k.reattachedDevices = append(k.reattachedDevices, opts.Device)
			if k.onReattach != nil {
				k.onReattach()
			}
			if k.reattachErr != nil {
				return nil, k.reattachErr
			}
			return &nbd.Attachment{}, nil
		},
		Attach: func(*nbd.Server, nbd.AttachOptions) (*nbd.Attachment, error) {
			k.attach++
			return &nbd.Attachment{}, nil // index 0: /dev/nbd0
		},
	}
}

// nbdSuccessor is a gateway by the name "gw" whose predecessor left prev in dir's state file,
// prepared as attach prepares it, with its NBD server on what it serves.
func nbdSuccessor(t *testing.T, dir string, prev statefile.State, cacheMode modes.Cache) (*Takeover, *nbd.Server, block.Device) {
	t.Helper()
	dev := memDevice(t, 1<<20)
	prev.Version, prev.Name, prev.Kind = statefile.Version, "gw", modes.NBD
	prev.LUN = statefile.Identity{Target: testTarget, Size: dev.Size(), BlockSize: dev.BlockSize()}
	if err := statefile.Write(statefile.Path(dir, "gw"), prev); err != nil {
		t.Fatal(err)
	}
	tk := mustPrepare(t, dir, "gw", modes.NBD, cacheMode, dev)
	if tk.Previous() == nil {
		t.Fatal("Prepare did not read the predecessor's state")
	}
	srv, err := nbd.NewServer(tk.Serving(dev), nbd.Options{Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { srv.Close() })
	return tk, srv, dev
}

// After a planned restart the state says clean, and the kernel resends its requests the moment
// Reattach hands it the sockets: by then the file must be this gateway's, and a write the
// successor's write-back cache acknowledges must be recorded dirty before it is let through.
func TestReattachRecordsBeforeTheKernelResends(t *testing.T) {
	dir := t.TempDir()
	tk, srv, _ := nbdSuccessor(t, dir, statefile.State{DevID: 3, CacheMode: modes.WriteBack, PID: 1}, modes.WriteBack)
	var atReattach statefile.State
	k := &fakeNBD{onReattach: func() { atReattach = readState(t, tk) }}
	if _, err := tk.AttachNBD(k.kernel(), srv, nbd.AttachOptions{}); err != nil {
		t.Fatal(err)
	}
	if k.reattach != 1 || k.attach != 0 || k.reattachedDevices[0] != "/dev/nbd3" {
		t.Fatalf("kernel calls: %+v", k)
	}
	if atReattach.PID != os.Getpid() || atReattach.DevID != 3 || atReattach.CacheMode != modes.WriteBack {
		t.Fatalf("state when the kernel got the sockets: %+v, want this pid, device 3", atReattach)
	}
	if err := tk.Gate().WriteAt(context.Background(), make([]byte, 4096), 0, 0); err != nil {
		t.Fatal(err)
	}
	if !readState(t, tk).Dirty {
		t.Fatal("a resent write was acknowledged with the state clean")
	}
	// the hand-over check is installed: a zero Attachment is not configured through netlink
	if err := tk.CheckCanWait(); err == nil || !strings.Contains(err.Error(), "ioctls") {
		t.Fatalf("hand-over check of the reattached device: %v", err)
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
			tk, srv, _ := nbdSuccessor(t, t.TempDir(), statefile.State{DevID: 3, CacheMode: modes.WriteBack, PID: 1}, modes.WriteBack)
			k := &fakeNBD{reattachErr: c.err}
			_, err := tk.AttachNBD(k.kernel(), srv, nbd.AttachOptions{})
			if !errors.Is(err, c.err) || errors.Is(err, ErrNoResume) != c.noResume {
				t.Fatalf("error %v", err)
			}
			if st := readState(t, tk); st.PID != 1 || st.Dirty || st.DevID != 3 || k.attach != 0 {
				t.Fatalf("state after the failed reattach: %+v (attach calls %d)", st, k.attach)
			}
			tk.RecordFlushed() // the shutdown's final flush succeeds: the file is still not ours
			if st := readState(t, tk); st.PID != 1 || st.CacheMode != modes.WriteBack {
				t.Fatalf("state after the shutdown: %+v; want the predecessor's", st)
			}
		})
	}
}

// The device a fenced state named is gone (disconnected while no gateway ran): the new device
// is served unfenced, by a server built again on what Serving returns now.
func TestReattachGoneFencedDeviceServesTheNewOneUnfenced(t *testing.T) {
	tk, srv, dev := nbdSuccessor(t, t.TempDir(), statefile.State{DevID: 3, CacheMode: modes.WriteBack, Dirty: true, PID: 1}, modes.WriteBack)
	if tk.FenceReason() == "" {
		t.Fatal("the dirty write-back state is not fenced")
	}
	k := &fakeNBD{reattachErr: nbd.ErrNoDevice}
	if _, err := tk.AttachNBD(k.kernel(), srv, nbd.AttachOptions{}); !errors.Is(err, ErrUnfenced) {
		t.Fatalf("got %v, want ErrUnfenced", err)
	}
	if k.attach != 0 {
		t.Fatal("a new device was made on the fenced server")
	}
	if why := tk.FenceReason(); why != "" {
		t.Fatalf("still fenced: %s", why)
	}
	served := tk.Serving(dev)
	srv2, err := nbd.NewServer(served, nbd.Options{Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	defer srv2.Close()
	if _, err := tk.AttachNBD(k.kernel(), srv2, nbd.AttachOptions{}); err != nil || k.attach != 1 || k.reattach != 1 {
		t.Fatalf("second call: %v (kernel calls %+v)", err, k)
	}
	if st := readState(t, tk); st.DevID != 0 || st.Dirty || st.PID != os.Getpid() {
		t.Fatalf("state of the new device: %+v (a new device holds no lost write: clean)", st)
	}
	if err := served.WriteAt(context.Background(), make([]byte, 4096), 0, 0); err != nil {
		t.Fatalf("write on the new device's stack: %v", err)
	}
	if !readState(t, tk).Dirty {
		t.Fatal("a write on the new device left the state clean")
	}
}

// The device a resumable state named is gone: a new one is made in the same call.
func TestReattachGoneResumableDeviceAttachesAfresh(t *testing.T) {
	tk, srv, _ := nbdSuccessor(t, t.TempDir(), statefile.State{DevID: 3, CacheMode: modes.Off, PID: 1}, modes.Off)
	k := &fakeNBD{reattachErr: nbd.ErrNoDevice}
	if _, err := tk.AttachNBD(k.kernel(), srv, nbd.AttachOptions{}); err != nil || k.attach != 1 {
		t.Fatalf("%v (kernel calls %+v)", err, k)
	}
	if st := readState(t, tk); st.DevID != 0 || st.Dirty || st.PID != os.Getpid() {
		t.Fatalf("state of the new device: %+v", st)
	}
}

// The control goroutine reads the fence reason (a restart's refusal, status) while the attach
// drops a gone device's predecessor state: -race flags the two if the drop is not locked.
func TestFenceReasonWhileThePredecessorIsDropped(t *testing.T) {
	tk, srv, _ := nbdSuccessor(t, t.TempDir(), statefile.State{DevID: 3, CacheMode: modes.Off, PID: 1}, modes.Off)
	k := &fakeNBD{reattachErr: nbd.ErrNoDevice}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for range 1000 {
			_ = tk.FenceReason()
		}
	}()
	if _, err := tk.AttachNBD(k.kernel(), srv, nbd.AttachOptions{}); err != nil {
		t.Fatal(err)
	}
	<-done
	if tk.Previous() != nil {
		t.Fatal("the gone device's state is still the predecessor")
	}
}
