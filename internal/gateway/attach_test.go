package gateway

import (
	"context"
	"errors"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"go.uber.org/zap/zaptest"

	"github.com/iser-blk/iser-blk/block"
	"github.com/iser-blk/iser-blk/internal/control"
	"github.com/iser-blk/iser-blk/internal/lifecycle"
	"github.com/iser-blk/iser-blk/internal/modes"
	"github.com/iser-blk/iser-blk/internal/service"
	"github.com/iser-blk/iser-blk/internal/statefile"
	"github.com/iser-blk/iser-blk/internal/status"
	"github.com/iser-blk/iser-blk/internal/takeover"
)

// attachFixture is an attach --name gw of a 1 MiB memory LUN whose stack is open and whose
// kernel device is not announced yet; the kernel side is the test calling Announced.
type attachFixture struct {
	at       *Attachment
	dir      string
	dev      block.Device
	stops    atomic.Int32 // StopFrontend calls, the attachment's and the gateway's
	startErr error        // what the next Start fails with (nil: it starts)

	mu        sync.Mutex
	starts    [][2]string // Start's name and path, in order
	announced []string    // the paths announced to the user
}

func newAttachFixture(t *testing.T, dev block.Device) *attachFixture {
	t.Helper()
	f := &attachFixture{dir: t.TempDir(), dev: dev}
	log := zaptest.NewLogger(t)
	stop := func() { f.stops.Add(1) }
	f.at = NewAttachment(AttachOptions{
		Start: func(name, path string) (*Gateway, error) {
			f.mu.Lock()
			f.starts = append(f.starts, [2]string{name, path})
			f.mu.Unlock()
			if f.startErr != nil {
				return nil, f.startErr
			}
			g, err := Start(Options{
				Service:      service.Options{RunDir: f.dir, Identity: status.Identity{Name: name, Device: name, FrontendKind: modes.Ublk, FrontendPath: path}},
				Counters:     new(status.IOCounters),
				StopFrontend: stop,
				Log:          log,
				Process:      (&fakeProcess{}).process(t),
			})
			if err == nil {
				t.Cleanup(func() { _ = g.Service().Close() })
			}
			return g, err
		},
		StopFrontend: stop,
		Log:          log,
		Announce: func(path string) {
			f.mu.Lock()
			f.announced = append(f.announced, path)
			f.mu.Unlock()
		},
	})
	f.at.Opened(dev)
	return f
}

// takeover prepares gw's takeover in the fixture's run directory, as attach --name does.
func (f *attachFixture) takeover(t *testing.T) *takeover.Takeover {
	t.Helper()
	tk, err := takeover.Prepare(takeover.Options{Dir: f.dir, Name: "gw", Kind: modes.Ublk, CacheMode: modes.WriteBack,
		LUN: statefile.Identity{Target: "iscsi://192.0.2.1/iqn.2026-01.test:t1/1", Size: f.dev.Size(), BlockSize: f.dev.BlockSize()}})
	if err != nil {
		t.Fatal(err)
	}
	return tk
}

// kernelCreated is what the ublk frontend does with attach --name's takeover once the kernel
// made /dev/ublkbN: it serves through the takeover's gate and records the state.
func kernelCreated(t *testing.T, tk *takeover.Takeover, dev block.Device, id int) {
	t.Helper()
	tk.SetCanWait(func() error { return nil })
	tk.Serving(dev)
	if err := tk.Record(modes.Ublk, id); err != nil {
		t.Fatal(err)
	}
}

func sendSignal(at *Attachment) {
	signals, send := context.WithCancel(context.Background())
	send()
	at.StopOnSignal(signals, nil)
}

func wantClosed(t *testing.T, dev block.Device) {
	t.Helper()
	if err := dev.ReadAt(context.Background(), make([]byte, 512), 0); !errors.Is(err, block.ErrClosed) {
		t.Fatalf("the device is still open after the shutdown (read: %v): the session was not closed", err)
	}
}

// The signal watcher stops at once without a gateway, through the gateway with one (which then
// refuses a hand-over), and does nothing once the attach ended.
func TestAttachmentStopOnSignal(t *testing.T) {
	f := newAttachFixture(t, memDevice(t, 1<<20))
	ended := make(chan struct{})
	close(ended)
	f.at.StopOnSignal(context.Background(), ended)
	if f.stops.Load() != 0 {
		t.Fatal("stopped after the attach ended")
	}
	sendSignal(f.at)
	if f.stops.Load() != 1 {
		t.Fatalf("without a gateway: stopped %d times, want 1", f.stops.Load())
	}
	f = newAttachFixture(t, memDevice(t, 1<<20))
	if err := f.at.Name("gw"); err != nil {
		t.Fatal(err)
	}
	sendSignal(f.at)
	if f.stops.Load() != 1 {
		t.Fatalf("with a gateway: stopped %d times, want 1", f.stops.Load())
	}
	_, err := f.at.Gateway().Restart(context.Background(), control.Request{})
	wantControlError(t, err, control.CodeBusy, "already stopping")
}

// A stop signal before the gateway is named keeps it from ever handing the device over: a
// restart could otherwise commit while the stopped frontend tears the device down.
func TestAttachmentSignalBeforeTheNameKeepsHandOverOff(t *testing.T) {
	for _, sig := range []bool{true, false} {
		f := newAttachFixture(t, memDevice(t, 1<<20))
		tk := f.takeover(t)
		f.at.TakeOver(tk)
		if sig {
			sendSignal(f.at) // no gateway yet: the attach is stopped directly
		}
		if err := f.at.Name("gw"); err != nil {
			t.Fatal(err)
		}
		kernelCreated(t, tk, f.dev, 3)
		f.at.Announced("/dev/ublkb3", status.Frontend{Kind: "ublk"})
		_, err := f.at.Gateway().Restart(context.Background(), control.Request{})
		if sig {
			wantControlError(t, err, control.CodeBusy, "already stopping")
		} else if err != nil {
			t.Fatalf("restart of a gateway no signal reached: %v", err)
		}
	}
}

// However a signal and the naming interleave, the gateway ends up stopping: never serving,
// restartable, with a signal that went nowhere.
func TestAttachmentSignalRacesTheName(t *testing.T) {
	for range 50 {
		f := newAttachFixture(t, memDevice(t, 1<<20))
		tk := f.takeover(t)
		f.at.TakeOver(tk)
		var wg sync.WaitGroup
		wg.Add(2)
		go func() { defer wg.Done(); sendSignal(f.at) }()
		go func() {
			defer wg.Done()
			if err := f.at.Name("gw"); err != nil {
				t.Error(err)
			}
		}()
		wg.Wait()
		if f.stops.Load() == 0 {
			t.Fatal("the signal stopped nothing")
		}
		if f.at.Gateway().CanHandOver(tk) {
			t.Fatal("a gateway named around a stop signal became restartable")
		}
	}
}

// A gateway taking over the device a previous one left is recovering until the device is
// announced; one that takes nothing over stays starting.
func TestAttachmentTakingOverIsRecovering(t *testing.T) {
	f := newAttachFixture(t, memDevice(t, 1<<20))
	tk := f.takeover(t)
	if err := f.at.Name("gw"); err != nil {
		t.Fatal(err)
	}
	f.at.TakeOver(tk)
	wantState(t, f.at.Gateway(), lifecycle.Starting, "")
	if err := tk.Record(modes.Ublk, 2); err != nil { // the predecessor's record
		t.Fatal(err)
	}
	tk = f.takeover(t)
	f.at.TakeOver(tk)
	wantState(t, f.at.Gateway(), lifecycle.Recovering, "ublk device a previous gateway")
	f.at.Announced("/dev/ublkb2", status.Frontend{Kind: "ublk"})
	wantState(t, f.at.Gateway(), lifecycle.Ready, "")
}

// Without a name known before the device exists, the gateway is named after the kernel's
// device when it is announced, and serves it.
func TestAttachmentNamedAfterTheDevice(t *testing.T) {
	f := newAttachFixture(t, memDevice(t, 1<<20))
	if f.at.Gateway() != nil {
		t.Fatal("a gateway before any name is known")
	}
	f.at.Announced("/dev/ublkb5", status.Frontend{Kind: "ublk"})
	if len(f.starts) != 1 || f.starts[0] != [2]string{"ublkb5", "/dev/ublkb5"} || len(f.announced) != 1 || f.announced[0] != "/dev/ublkb5" {
		t.Fatalf("started %v, announced %v; want ublkb5 for /dev/ublkb5 once", f.starts, f.announced)
	}
	g := f.at.Gateway()
	wantState(t, g, lifecycle.Ready, "")
	if got := g.Service().Status.Identity().FrontendPath; got != "/dev/ublkb5" {
		t.Fatalf("status shows the device at %q", got)
	}
	if code := f.at.Shutdown(ExitOK); code != ExitOK {
		t.Fatalf("shutdown: %d", code)
	}
	wantState(t, g, lifecycle.Stopped, "")
	wantClosed(t, f.dev)
}

// A gateway that cannot start once the device exists (its name taken) stops the frontend: a
// device nobody can manage is not served. The shutdown still flushes and closes the stack.
func TestAttachmentUnnamableDeviceIsNotServed(t *testing.T) {
	f := newAttachFixture(t, memDevice(t, 1<<20))
	f.startErr = errors.New("name in use")
	f.at.Announced("/dev/ublkb0", status.Frontend{Kind: "ublk"})
	if err := f.at.Err(); err == nil || !strings.Contains(err.Error(), "name in use") {
		t.Fatalf("Err: %v", err)
	}
	if f.stops.Load() != 1 || f.at.Gateway() != nil {
		t.Fatalf("frontend stopped %d times, gateway %v; want stopped once, none", f.stops.Load(), f.at.Gateway())
	}
	if code := f.at.Shutdown(ExitFailure); code != ExitFailure {
		t.Fatalf("shutdown: %d, want the failure kept", code)
	}
	wantClosed(t, f.dev)
}

// A gateway named before login that fails before its device is announced (takeover refused,
// the kernel device busy) still flushes and closes the stack, and gives the name up.
func TestAttachmentShutdownBeforeTheDeviceClosesTheStack(t *testing.T) {
	f := newAttachFixture(t, memDevice(t, 1<<20))
	if err := f.at.Name("gw"); err != nil {
		t.Fatal(err)
	}
	if code := f.at.Shutdown(ExitFailure); code != ExitFailure {
		t.Fatalf("shutdown: %d", code)
	}
	wantState(t, f.at.Gateway(), lifecycle.Stopped, "")
	wantClosed(t, f.dev)
	again := newAttachFixture(t, memDevice(t, 1<<20))
	again.dir = f.dir
	if err := again.at.Name("gw"); err != nil {
		t.Fatalf("the name is still held after the shutdown: %v", err)
	}
}

// Abandon gives the name up when the stack cannot be opened.
func TestAttachmentAbandonReleasesTheName(t *testing.T) {
	f := newAttachFixture(t, memDevice(t, 1<<20))
	if err := f.at.Name("gw"); err != nil {
		t.Fatal(err)
	}
	second := newAttachFixture(t, memDevice(t, 1<<20))
	second.dir = f.dir
	var inUse *control.NameInUseError
	if err := second.at.Name("gw"); !errors.As(err, &inUse) {
		t.Fatalf("a second gateway by the name: %v, want it refused as in use", err)
	}
	f.at.Abandon()
	wantState(t, f.at.Gateway(), lifecycle.Stopped, "failed to start")
	if err := second.at.Name("gw"); err != nil {
		t.Fatalf("the name is still held after Abandon: %v", err)
	}
}

// A device kept for a successor (the shutdown's device outlives the process) is recorded clean
// after a final flush that succeeded, and stays dirty after one that failed, so that the
// successor fences it.
func TestAttachmentShutdownRecordsTheFlush(t *testing.T) {
	for _, flushFails := range []bool{false, true} {
		var dev block.Device = memDevice(t, 1<<20)
		if flushFails {
			dev = flushHook{Device: dev, hook: func(context.Context) error { return block.ErrIO }}
		}
		f := newAttachFixture(t, dev)
		if err := f.at.Name("gw"); err != nil {
			t.Fatal(err)
		}
		tk := f.takeover(t)
		f.at.TakeOver(tk)
		kernelCreated(t, tk, f.dev, 3)
		f.at.Announced("/dev/ublkb3", status.Frontend{Kind: "ublk"})
		if err := tk.Gate().WriteAt(context.Background(), make([]byte, 4096), 0, 0); err != nil {
			t.Fatal(err)
		}
		code := f.at.Shutdown(ExitOK)
		st, err := statefile.Read(tk.Path())
		if err != nil {
			t.Fatal(err)
		}
		if flushFails != (code != ExitOK) || st.Dirty != flushFails {
			t.Fatalf("final flush failing %v: exit %d, state dirty %v", flushFails, code, st.Dirty)
		}
	}
}

// A device whose predecessor may have lost acknowledged writes is announced fenced: failed,
// with the reason, and no hand-over.
func TestAttachmentFencedOnAnnounce(t *testing.T) {
	f := newAttachFixture(t, memDevice(t, 1<<20))
	if err := f.at.Name("gw"); err != nil {
		t.Fatal(err)
	}
	st := statefile.State{Version: statefile.Version, Name: "gw", Kind: modes.Ublk, DevID: 4, CacheMode: modes.WriteBack, Dirty: true, PID: 1,
		LUN: statefile.Identity{Target: "iscsi://192.0.2.1/iqn.2026-01.test:t1/1", Size: f.dev.Size(), BlockSize: f.dev.BlockSize()}}
	if err := statefile.Write(statefile.Path(f.dir, "gw"), st); err != nil {
		t.Fatal(err)
	}
	tk := f.takeover(t)
	f.at.TakeOver(tk)
	wantState(t, f.at.Gateway(), lifecycle.Recovering, "pid 1")
	kernelCreated(t, tk, f.dev, 4)
	f.at.Announced("/dev/ublkb4", status.Frontend{Kind: "ublk"})
	wantState(t, f.at.Gateway(), lifecycle.Failed, status.FencedReason)
	_, err := f.at.Gateway().Restart(context.Background(), control.Request{})
	wantControlError(t, err, control.CodeRefused, "fenced")
}

// PrepareTakeover reads the state file under the gateway's claim (its run directory and name)
// for a LUN of the opened device's size: a predecessor's record of that LUN is taken over
// (recovering), one of another kind of device refuses the attach (takeover.ErrNoResume), and
// without a gateway named before login there is nothing to take over.
func TestAttachmentPrepareTakeover(t *testing.T) {
	lun := takeover.Options{Kind: modes.Ublk, CacheMode: modes.WriteBack,
		LUN: statefile.Identity{Target: "iscsi://192.0.2.1/iqn.2026-01.test:t1/1"}}
	f := newAttachFixture(t, memDevice(t, 1<<20))
	if err := f.at.PrepareTakeover(lun); err == nil {
		t.Fatal("a takeover before the gateway is named")
	}
	if err := f.takeover(t).Record(modes.Ublk, 4); err != nil { // the predecessor's record
		t.Fatal(err)
	}
	if err := f.at.Name("gw"); err != nil {
		t.Fatal(err)
	}
	if err := f.at.PrepareTakeover(lun); err != nil {
		t.Fatalf("taking over the predecessor's device: %v", err)
	}
	wantState(t, f.at.Gateway(), lifecycle.Recovering, "ublk device a previous gateway")

	nbdKind := lun
	nbdKind.Kind = modes.NBD
	if err := f.at.PrepareTakeover(nbdKind); !errors.Is(err, takeover.ErrNoResume) {
		t.Fatalf("a ublk state file for an nbd attach: %v, want ErrNoResume", err)
	}

	// The LUN's size is the opened device's: a record of a 2 MiB LUN is not this 1 MiB one.
	g := newAttachFixture(t, memDevice(t, 1<<20))
	other := lun
	other.Dir, other.Name, other.LUN.Size, other.LUN.BlockSize = g.dir, "gw", 2<<20, g.dev.BlockSize()
	prev, err := takeover.Prepare(other)
	if err != nil {
		t.Fatal(err)
	}
	if err := prev.Record(modes.Ublk, 5); err != nil {
		t.Fatal(err)
	}
	if err := g.at.Name("gw"); err != nil {
		t.Fatal(err)
	}
	if err := g.at.PrepareTakeover(lun); !errors.Is(err, takeover.ErrNoResume) {
		t.Fatalf("a 2 MiB LUN's state file for a 1 MiB device: %v, want ErrNoResume", err)
	}
}
