package main

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/zap"

	"github.com/iser-blk/iser-blk/block"
	"github.com/iser-blk/iser-blk/internal/control"
	"github.com/iser-blk/iser-blk/internal/lifecycle"
	"github.com/iser-blk/iser-blk/internal/statefile"
	"github.com/iser-blk/iser-blk/internal/status"
)

// restartFixture is an attach gateway named gw serving dev through a takeover, as attach --name
// sets it up, with the lifecycle at ready.
type restartFixture struct {
	g    *gateway
	tk   *takeover
	dev  block.Device
	path string // the state file
}

func newRestartFixture(t *testing.T, kind string, dev block.Device, withTakeover bool) *restartFixture {
	t.Helper()
	dir := t.TempDir()
	g, err := startGateway(&serviceFlags{name: "gw", runDir: dir}, identity("gw", kind, "", &exportFlags{}), new(status.IOCounters), func() {}, zap.NewNop())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { g.svc.Close() })
	f := &restartFixture{g: g, dev: dev, path: statefile.Path(dir, "gw")}
	if withTakeover {
		tk, err := prepareTakeover(&takeoverFlags{name: "gw", runDir: dir}, statefile.KindUblk, testTarget, "writeback", dev, zap.NewNop())
		if err != nil {
			t.Fatal(err)
		}
		if err := tk.record(statefile.KindUblk, 3); err != nil {
			t.Fatal(err)
		}
		tk.serving(dev)
		tk.setCanWait(func() error { return nil })
		f.tk = tk
		g.canRestart(tk)
	}
	g.serving(dev, "", status.Frontend{Kind: kind})
	g.ready()
	return f
}

func wantControlError(t *testing.T, err error, code, contains string) {
	t.Helper()
	var ce *control.Error
	if !errors.As(err, &ce) || ce.Code != code || !strings.Contains(ce.Message, contains) {
		t.Fatalf("restart: %v; want a %q error saying %q", err, code, contains)
	}
}

func TestMain(m *testing.M) {
	ignoreStopSignals = func() {} // the test binary keeps SIGINT and SIGTERM
	os.Exit(m.Run())
}

func TestRestartRefusals(t *testing.T) {
	t.Run("serve", func(t *testing.T) {
		f := newRestartFixture(t, "nbd-socket", memDevice(t, 1<<20), false)
		_, err := f.g.restart(context.Background(), control.Request{})
		wantControlError(t, err, control.CodeUnsupported, "restart applies to attach")
	})
	t.Run("no --name", func(t *testing.T) {
		f := newRestartFixture(t, "ublk", memDevice(t, 1<<20), false)
		_, err := f.g.restart(context.Background(), control.Request{})
		wantControlError(t, err, control.CodeRefused, "--name")
	})
	t.Run("kernel device cannot wait", func(t *testing.T) {
		f := newRestartFixture(t, "ublk", memDevice(t, 1<<20), true)
		f.tk.setCanWait(func() error { return errors.New("created without UBLK_F_USER_RECOVERY_REISSUE") })
		_, err := f.g.restart(context.Background(), control.Request{})
		wantControlError(t, err, control.CodeRefused, "REISSUE")
	})
	t.Run("fenced", func(t *testing.T) {
		f := newRestartFixture(t, "ublk", memDevice(t, 1<<20), true)
		f.tk.prev = &statefile.State{CacheMode: statefile.CacheWriteBack, Dirty: true, PID: 1}
		_, err := f.g.restart(context.Background(), control.Request{})
		wantControlError(t, err, control.CodeRefused, "fenced")
	})
}

// failingFlush is a device whose write-back fails.
type failingFlush struct{ block.Device }

func (failingFlush) Flush(context.Context) error { return block.ErrIO }

func TestRestartFailedWriteBackKeepsServing(t *testing.T) {
	f := newRestartFixture(t, "ublk", failingFlush{memDevice(t, 1<<20)}, true)
	_, err := f.g.restart(context.Background(), control.Request{})
	wantControlError(t, err, control.CodeFailed, "keeps serving")
	if st, _ := f.g.svc.Lifecycle.State(); st != lifecycle.Ready {
		t.Fatalf("lifecycle %s after a failed restart, want ready", st)
	}
	if f.tk.gate.closed.Load() {
		t.Fatal("the gate stayed closed after a failed restart")
	}
	if err := f.tk.gate.WriteAt(context.Background(), make([]byte, 512), 0, 0); err != nil {
		t.Fatalf("write after a failed restart: %v", err)
	}
	st, err := statefile.Read(f.path)
	if err != nil || !st.Dirty {
		t.Fatalf("state after a failed restart: %+v, %v; want it still dirty", st, err)
	}
}

// flushHook is a device whose write-back runs hook first and fails when hook returns an error.
type flushHook struct {
	block.Device
	hook func() error
}

func (d flushHook) Flush(ctx context.Context) error {
	if err := d.hook(); err != nil {
		return err
	}
	return d.Device.Flush(ctx)
}

// shutdownAfterFlush is a device whose write-back completes just as a SIGTERM begins the
// shutdown.
type shutdownAfterFlush struct {
	block.Device
	g *gateway
}

func (d *shutdownAfterFlush) Flush(ctx context.Context) error {
	err := d.Device.Flush(ctx)
	d.g.beginShutdown()
	return err
}

// A SIGTERM that arrives while the restart writes back (after its write-back, before its
// commit) wins: the restart yields, reopens the gate, and records the state dirty again, since
// the requests it had parked are now served into the write-back cache.
func TestRestartYieldsToShutdownAndStaysDirty(t *testing.T) {
	dev := &shutdownAfterFlush{Device: memDevice(t, 1<<20)}
	f := newRestartFixture(t, "ublk", dev, true)
	dev.g = f.g
	_, err := f.g.restart(context.Background(), control.Request{})
	wantControlError(t, err, control.CodeFailed, "a shutdown began")
	if f.tk.gate.closed.Load() {
		t.Fatal("the gate stayed closed: the shutdown's final flush would hang on parked requests")
	}
	st, err := statefile.Read(f.path)
	if err != nil || !st.Dirty {
		t.Fatalf("state after the restart yielded: %+v, %v; want dirty (a crash now must fence)", st, err)
	}
}

// A restart whose write-back failed because every path is down leaves the gateway failed with
// that reason, not ready.
func TestRestartFailedWithoutPathStaysFailed(t *testing.T) {
	var f *restartFixture
	f = newRestartFixture(t, "ublk", flushHook{Device: memDevice(t, 1<<20), hook: func() error {
		f.g.availabilityChanged(false, "every path down for 2m0s")
		return block.ErrIO
	}}, true)
	_, err := f.g.restart(context.Background(), control.Request{})
	wantControlError(t, err, control.CodeFailed, "keeps serving")
	if st, why := f.g.svc.Lifecycle.State(); st != lifecycle.Failed || !strings.Contains(why, "every path down") {
		t.Fatalf("lifecycle %s (%s) after a restart failed for want of a path, want failed", st, why)
	}
}

func TestRestartHandsOverCleanState(t *testing.T) {
	f := newRestartFixture(t, "ublk", memDevice(t, 1<<20), true)
	reexec, err := f.g.restart(context.Background(), control.Request{})
	if err != nil || reexec == nil {
		t.Fatalf("restart: %v", err)
	}
	// reexec is not run: it would replace the test binary.
	st, err := statefile.Read(f.path)
	if err != nil || st.Dirty || st.DevID != 3 {
		t.Fatalf("state before the re-exec: %+v, %v; want device 3, clean", st, err)
	}
	if ok, why := st.Resumable(); !ok {
		t.Fatalf("the successor would not resume a planned restart's write-back device: %s", why)
	}
	if !f.tk.gate.closed.Load() {
		t.Fatal("the gate is open before the re-exec")
	}
	if err := f.dev.ReadAt(context.Background(), make([]byte, 512), 0); !errors.Is(err, block.ErrClosed) {
		t.Fatalf("the device is still open before the re-exec (read: %v): the session was not closed", err)
	}
}

func TestRestartReexecutesThePathOnDisk(t *testing.T) {
	if got := trimDeleted("/usr/local/bin/iser-blk (deleted)"); got != "/usr/local/bin/iser-blk" {
		t.Fatalf("an upgraded binary's path: %q", got)
	}
	if startExecutableErr != nil || startExecutable == "" || strings.HasSuffix(startExecutable, "(deleted)") {
		t.Fatalf("executable resolved at start: %q, %v", startExecutable, startExecutableErr)
	}
}

// Started through a symbolic link, the restart re-executes the link, not the file it points to
// at start: repointing the link is how some installs upgrade. A path that does not name the
// running binary is not believed.
func TestRestartReexecutesTheLinkItWasStartedBy(t *testing.T) {
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	link := filepath.Join(dir, "iser-blk")
	if err := os.Symlink(self, link); err != nil {
		t.Fatal(err)
	}
	if got, err := executablePath(link); err != nil || got != link {
		t.Fatalf("started by the link %s: re-executes %q (%v)", link, got, err)
	}
	t.Setenv("PATH", dir)
	if got, err := executablePath("iser-blk"); err != nil || got != link {
		t.Fatalf("started by name from PATH: re-executes %q (%v), want %s", got, err, link)
	}
	other := filepath.Join(dir, "other")
	if err := os.WriteFile(other, []byte("#!/bin/sh\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	for _, arg0 := range []string{other, filepath.Join(dir, "missing"), "not-on-path"} {
		if got, err := executablePath(arg0); err != nil || got != trimDeleted(self) {
			t.Errorf("argv[0] %q, not this binary: re-executes %q (%v), want %s", arg0, got, err, self)
		}
	}
}

// blockedFlush is a device whose write-back says it began and then waits for its context.
type blockedFlush struct {
	block.Device
	once  *sync.Once
	began chan struct{}
}

func (d blockedFlush) Flush(ctx context.Context) error {
	d.once.Do(func() { close(d.began) })
	<-ctx.Done()
	return ctx.Err()
}

// restartInWriteBack starts a restart on a gateway whose write-back blocks until cancelled, and
// returns once that write-back began; the restart's answer arrives on the channel.
func restartInWriteBack(t *testing.T) (*restartFixture, <-chan error) {
	t.Helper()
	dev := blockedFlush{Device: memDevice(t, 1<<20), once: new(sync.Once), began: make(chan struct{})}
	f := newRestartFixture(t, "ublk", dev, true)
	restarted := make(chan error, 1)
	go func() {
		_, err := f.g.restart(context.Background(), control.Request{})
		restarted <- err
	}()
	<-dev.began
	return f, restarted
}

// A stop signal during a restart's write-back cancels the hand-over, waits until the restart
// gave up (gate open, state dirty again), and only then stops the frontend: stopping it first
// would tear the kernel device down while the restart could still commit.
func TestStopSignalDuringRestartWaitsForItToGiveUp(t *testing.T) {
	f, restarted := restartInWriteBack(t)
	// What the restart does before it lets go of flushMu (undoHandOver: gate reopened, state
	// dirty again) must be done when the frontend is stopped: the channel send comes later.
	gaveUp := false
	f.g.stop = func() {
		st, err := statefile.Read(f.path)
		gaveUp = !f.tk.gate.closed.Load() && err == nil && st.Dirty
	}
	f.g.stopForSignal()
	if !gaveUp {
		t.Fatal("the frontend was stopped while the restart still held its hand-over")
	}
	wantControlError(t, <-restarted, control.CodeFailed, "keeps serving")
	if _, err := f.g.restart(context.Background(), control.Request{}); err == nil {
		t.Fatal("a new restart was accepted by a stopping gateway")
	}
}

// A detach while a restart writes back is refused: it would take the restart's cancel, and a
// signal would then cancel the detach and wait for the restart's whole --timeout.
func TestDetachDuringRestartIsRefused(t *testing.T) {
	f, restarted := restartInWriteBack(t)
	detached := make(chan error, 1)
	go func() {
		_, err := f.g.detach(context.Background(), control.Request{Force: true})
		detached <- err
	}()
	select {
	case err := <-detached:
		wantControlError(t, err, control.CodeBusy, "already writing back")
	case <-time.After(10 * time.Second):
		t.Fatal("the detach did not answer: it took the restart's cancel and waits for its write-back")
	}
	f.g.stop = func() {}
	f.g.stopForSignal() // returns once the restart gave up: its cancel was still its own
	wantControlError(t, <-restarted, control.CodeFailed, "keeps serving")
}

// Once a restart is committed the signal changes nothing: the re-exec owns the process.
func TestStopSignalAfterRestartCommitIsIgnored(t *testing.T) {
	f := newRestartFixture(t, "ublk", memDevice(t, 1<<20), true)
	if _, err := f.g.beginRestart(context.Background()); err != nil {
		t.Fatal(err)
	}
	if !f.g.commitRestart() {
		t.Fatal("commit refused")
	}
	stopped := false
	f.g.stop = func() { stopped = true }
	f.g.stopForSignal()
	if stopped {
		t.Fatal("a signal after the commit stopped the frontend under the re-exec")
	}
}

// attach's signal watcher: at once without a restartable gateway, through stopForSignal with
// one (which refuses a restart afterwards), and nothing once the attach ended.
func TestAttachStopOnSignal(t *testing.T) {
	run := func(at *attachment, signal, end bool) {
		signals, send := context.WithCancel(context.Background())
		defer send()
		done := make(chan struct{})
		if signal {
			send()
		}
		if end {
			close(done)
		}
		at.stopOnSignal(signals, done)
	}
	stopped := 0
	at := &attachment{stop: func() { stopped++ }}
	run(at, true, false)
	if stopped != 1 {
		t.Fatalf("without a restartable gateway: stopped %d times, want 1", stopped)
	}
	run(at, false, true)
	if stopped != 1 {
		t.Fatal("stopped after the attach ended")
	}
	f := newRestartFixture(t, "ublk", memDevice(t, 1<<20), true)
	gwStopped := 0
	f.g.stop = func() { gwStopped++ }
	at.restartable = f.g
	run(at, true, false)
	if gwStopped != 1 || stopped != 1 {
		t.Fatalf("with a restartable gateway: gateway stop %d, attach stop %d; want 1, 1", gwStopped, stopped)
	}
	_, err := f.g.restart(context.Background(), control.Request{})
	wantControlError(t, err, control.CodeBusy, "already stopping")
}

// A stop signal before the device is announced keeps the gateway from ever becoming
// restartable: a restart could otherwise commit while the stopped frontend tears the device
// down. Without the signal the announce makes it restartable.
func TestSignalBeforeAnnounceKeepsRestartOff(t *testing.T) {
	for _, signal := range []bool{true, false} {
		dev := memDevice(t, 1<<20)
		f := newRestartFixture(t, "ublk", dev, false)
		tk, err := prepareTakeover(&takeoverFlags{name: "gw", runDir: t.TempDir()}, statefile.KindUblk, testTarget, "off", dev, zap.NewNop())
		if err != nil {
			t.Fatal(err)
		}
		at := &attachment{g: f.g, tk: tk, dev: tk.serving(dev), stop: func() {}, log: zap.NewNop()}
		if signal {
			signals, send := context.WithCancel(context.Background())
			send()
			at.stopOnSignal(signals, nil)
		}
		at.announced("/dev/ublkb3", status.Frontend{Kind: "ublk"})
		f.g.mu.Lock()
		restartable := f.g.restartable != nil
		f.g.mu.Unlock()
		if restartable == signal {
			t.Errorf("signal before the announce %v: restartable %v", signal, restartable)
		}
	}
}
