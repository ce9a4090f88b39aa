package gateway

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/iser-blk/iser-blk/block"
	"github.com/iser-blk/iser-blk/internal/control"
	"github.com/iser-blk/iser-blk/internal/gate"
	"github.com/iser-blk/iser-blk/internal/lifecycle"
	"github.com/iser-blk/iser-blk/internal/modes"
	"github.com/iser-blk/iser-blk/internal/statefile"
)

func TestHandOverRefusals(t *testing.T) {
	for _, stop := range []bool{false, true} {
		handOver := func(f *fixture) error {
			var err error
			if stop {
				_, err = f.g.Stop(context.Background(), control.Request{Keep: true})
			} else {
				_, err = f.g.Restart(context.Background(), control.Request{})
			}
			return err
		}
		t.Run("serve", func(t *testing.T) {
			f := newFixture(t, memDevice(t, 1<<20), fixtureOptions{kind: modes.NBDSocket})
			wantControlError(t, handOver(f), control.CodeUnsupported, "applies to attach")
		})
		t.Run("no --name", func(t *testing.T) {
			f := newFixture(t, memDevice(t, 1<<20), fixtureOptions{})
			wantControlError(t, handOver(f), control.CodeRefused, "--name")
		})
		t.Run("kernel device cannot wait", func(t *testing.T) {
			f := newFixture(t, memDevice(t, 1<<20), fixtureOptions{handOver: true})
			f.tk.SetCanWait(func() error { return errors.New("created without UBLK_F_USER_RECOVERY_REISSUE") })
			wantControlError(t, handOver(f), control.CodeRefused, "REISSUE")
		})
		t.Run("fenced", func(t *testing.T) {
			f := newFixture(t, memDevice(t, 1<<20), fixtureOptions{handOver: true,
				prev: &statefile.State{DevID: 3, CacheMode: modes.WriteBack, Dirty: true, PID: 1}})
			wantControlError(t, handOver(f), control.CodeRefused, "fenced")
		})
	}
}

func TestFailedHandOverKeepsServing(t *testing.T) {
	f := newFixture(t, flushHook{Device: memDevice(t, 1<<20), hook: func(context.Context) error { return block.ErrIO }}, fixtureOptions{handOver: true})
	_, err := f.g.Restart(context.Background(), control.Request{})
	wantControlError(t, err, control.CodeFailed, "keeps serving")
	wantState(t, f.g, lifecycle.Ready, "")
	if f.tk.Gate().IsShut() {
		t.Fatal("the gate stayed shut after a failed restart")
	}
	if err := f.tk.Gate().WriteAt(context.Background(), make([]byte, 512), 0, 0); err != nil {
		t.Fatalf("write after a failed restart: %v", err)
	}
	if !f.state(t).Dirty {
		t.Fatal("a write after the failed restart left the state clean")
	}
	_, err = f.g.Stop(context.Background(), control.Request{Keep: true})
	wantControlError(t, err, control.CodeFailed, "keeps serving")
	wantState(t, f.g, lifecycle.Ready, "stop --keep failed")
}

// A stop signal that arrives after the write-back, before the commit, wins: the hand-over
// yields and reopens the gate (the shutdown's final flush would hang on parked requests).
func TestHandOverYieldsToAShutdownThatBeganMeanwhile(t *testing.T) {
	dev := &signalAfterFlush{Device: memDevice(t, 1<<20)}
	f := newFixture(t, dev, fixtureOptions{handOver: true})
	dev.g = f.g
	gateOpenAtStop := make(chan bool, 1)
	f.onStop = func() { gateOpenAtStop <- !f.tk.Gate().IsShut() }
	_, err := f.g.Restart(context.Background(), control.Request{})
	wantControlError(t, err, control.CodeFailed, "a shutdown began")
	if !<-gateOpenAtStop {
		t.Fatal("the frontend was stopped before the hand-over gave up")
	}
	if len(f.proc.execs) != 0 || f.proc.ignored.Load() {
		t.Fatal("the yielded restart re-executed or ignored the stop signals")
	}
}

// A hand-over whose write-back failed because every path is down leaves the gateway failed with
// that reason, not ready.
func TestFailedHandOverWithoutPathStaysFailed(t *testing.T) {
	var f *fixture
	f = newFixture(t, flushHook{Device: memDevice(t, 1<<20), hook: func(context.Context) error {
		f.paths(false, "every path down for 2m0s")
		return block.ErrIO
	}}, fixtureOptions{handOver: true})
	_, err := f.g.Restart(context.Background(), control.Request{})
	wantControlError(t, err, control.CodeFailed, "keeps serving")
	wantState(t, f.g, lifecycle.Failed, "every path down")
}

func TestRestartHandsOverCleanStateAndReexecutes(t *testing.T) {
	f := newFixture(t, memDevice(t, 1<<20), fixtureOptions{handOver: true})
	if err := f.tk.Gate().WriteAt(context.Background(), make([]byte, 4096), 0, 0); err != nil {
		t.Fatal(err)
	}
	step, err := f.g.Restart(context.Background(), control.Request{})
	if err != nil || step == nil {
		t.Fatalf("restart: %v", err)
	}
	st := f.state(t)
	if st.Dirty || st.DevID != 3 {
		t.Fatalf("state before the re-exec: %+v; want device 3, clean", st)
	}
	if !f.tk.Gate().IsShut() {
		t.Fatal("the gate is open before the re-exec")
	}
	if err := f.dev.ReadAt(context.Background(), make([]byte, 512), 0); !errors.Is(err, block.ErrClosed) {
		t.Fatalf("the device is still open before the re-exec (read: %v): the session was not closed", err)
	}
	if !f.proc.ignored.Load() {
		t.Fatal("stop signals are not ignored from the commit on")
	}
	wantState(t, f.g, lifecycle.Restarting, "")
	f.proc.execErr = errors.New("exec format error")
	if err := step(); err == nil {
		t.Fatal("a failed exec was not reported")
	}
	if len(f.proc.execs) != 1 || f.proc.execs[0] != f.proc.executable || len(f.proc.exits) != 1 || f.proc.exits[0] != ExitFailure {
		t.Fatalf("exec %v, exit %v; want the executable once, then exit 1", f.proc.execs, f.proc.exits)
	}
}

func TestStopKeepHandsOverCleanStateAndExits0(t *testing.T) {
	f := newFixture(t, memDevice(t, 1<<20), fixtureOptions{handOver: true})
	if err := f.tk.Gate().WriteAt(context.Background(), make([]byte, 4096), 0, 0); err != nil {
		t.Fatal(err)
	}
	step, err := f.g.Stop(context.Background(), control.Request{Keep: true})
	if err != nil {
		t.Fatalf("stop --keep: %v", err)
	}
	if st := f.state(t); st.Dirty {
		t.Fatalf("state at the exit: %+v, want clean", st)
	}
	wantState(t, f.g, lifecycle.Stopped, "kept for a successor")
	if !f.g.Service().Lifecycle.Committed() {
		t.Fatal("stop --keep did not commit the shutdown (no STOPPING=1)")
	}
	if err := step(); err != nil || len(f.proc.exits) != 1 || f.proc.exits[0] != ExitOK || len(f.proc.execs) != 0 {
		t.Fatalf("step: %v, exits %v, execs %v; want one exit 0", err, f.proc.exits, f.proc.execs)
	}
	if f.stops.Load() != 0 {
		t.Fatal("stop --keep stopped the frontend: the kernel device would be removed")
	}
}

// Once a hand-over committed, the frontend ending (the main goroutine's Shutdown) must not
// flush the closed stack, log a false FINAL FLUSH FAILED, go to failed or release the name: it
// waits for the hand-over's last step.
func TestShutdownAfterAHandOverCommitWaitsForIt(t *testing.T) {
	f := newFixture(t, memDevice(t, 1<<20), fixtureOptions{handOver: true})
	step, err := f.g.Restart(context.Background(), control.Request{})
	if err != nil {
		t.Fatal(err)
	}
	code := make(chan int, 1)
	go func() { code <- f.g.Shutdown(ExitOK, nil) }()
	select {
	case c := <-code:
		t.Fatalf("Shutdown returned %d before the hand-over ended", c)
	case <-time.After(100 * time.Millisecond): // a negative check can only wait
	}
	f.proc.execErr = errors.New("exec refused in tests")
	_ = step()
	select {
	case c := <-code:
		if c != ExitOK {
			t.Fatalf("Shutdown after the hand-over: %d", c)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Shutdown did not return once the hand-over ended")
	}
	if s, _ := f.g.State(); s == lifecycle.Failed || s == lifecycle.Flushing {
		t.Fatalf("the shutdown flushed a handed-over device: %s", s)
	}
}

// A stop signal during a hand-over's write-back cancels it, waits until it gave up (gate open),
// and only then stops the frontend: stopping it first would tear the kernel device down while
// the restart could still commit.
func TestStopSignalDuringHandOverWaitsForItToGiveUp(t *testing.T) {
	dev := newBlockedFlush(t)
	f := newFixture(t, dev, fixtureOptions{handOver: true})
	restarted := make(chan error, 1)
	go func() {
		_, err := f.g.Restart(context.Background(), control.Request{})
		restarted <- err
	}()
	<-dev.began
	gaveUp := false
	f.onStop = func() { gaveUp = !f.tk.Gate().IsShut() }
	f.g.StopForSignal()
	if !gaveUp || f.stops.Load() != 1 {
		t.Fatalf("frontend stopped %d times, gate open at the stop %v", f.stops.Load(), gaveUp)
	}
	wantControlError(t, <-restarted, control.CodeFailed, "keeps serving")
	_, err := f.g.Restart(context.Background(), control.Request{})
	wantControlError(t, err, control.CodeBusy, "already stopping")
}

// Once a hand-over committed the signal changes nothing: the next image owns the device.
func TestStopSignalAfterAHandOverCommitIsIgnored(t *testing.T) {
	f := newFixture(t, memDevice(t, 1<<20), fixtureOptions{handOver: true})
	if _, err := f.g.Restart(context.Background(), control.Request{}); err != nil {
		t.Fatal(err)
	}
	f.g.StopForSignal()
	if f.stops.Load() != 0 {
		t.Fatal("a signal after the commit stopped the frontend under the re-exec")
	}
}

func TestCanHandOverRefusedOnceStopping(t *testing.T) {
	f := newFixture(t, memDevice(t, 1<<20), fixtureOptions{})
	f.g.StopForSignal()
	if f.g.CanHandOver(nil) {
		t.Fatal("a stopping gateway became restartable")
	}
}

func TestExecutableIsThePathItWasStartedBy(t *testing.T) {
	if got := trimDeleted("/usr/local/bin/iser-blk (deleted)"); got != "/usr/local/bin/iser-blk" {
		t.Fatalf("an upgraded binary's path: %q", got)
	}
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	link := linkTo(t, dir, "iser-blk", self)
	if got, err := Executable(link); err != nil || got != link {
		t.Fatalf("started by the link %s: re-executes %q (%v)", link, got, err)
	}
	t.Setenv("PATH", dir)
	if got, err := Executable("iser-blk"); err != nil || got != link {
		t.Fatalf("started by name from PATH: re-executes %q (%v), want %s", got, err, link)
	}
	other := filepath.Join(dir, "other")
	if err := os.WriteFile(other, []byte("#!/bin/sh\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	for _, arg0 := range []string{other, filepath.Join(dir, "missing"), "not-on-path"} {
		if got, err := Executable(arg0); err != nil || got != trimDeleted(self) || strings.HasSuffix(got, "(deleted)") {
			t.Errorf("argv[0] %q, not this binary: re-executes %q (%v), want %s", arg0, got, err, self)
		}
	}
	if err := reexecutable(other); err != nil {
		t.Fatalf("an executable file: %v", err)
	}
	if err := os.Chmod(other, 0o644); err != nil {
		t.Fatal(err)
	}
	if os.Geteuid() != 0 { // root may execute any file with an x bit somewhere; 0644 has none
		if err := reexecutable(other); err == nil {
			t.Fatal("a file without x bits counts as executable")
		}
	} else if err := reexecutable(other); err == nil {
		t.Fatal("a file without any x bit counts as executable for root")
	}
}

// signalAfterFlush is a device whose write-back succeeds just as a stop signal arrives.
type signalAfterFlush struct {
	block.Device
	g *Gateway
}

func (d *signalAfterFlush) Flush(ctx context.Context) error {
	err := d.Device.Flush(ctx)
	go d.g.StopForSignal()
	<-ctx.Done() // the shutdown cancels the hand-over's context before it stops the frontend
	return err
}

// fakeIntake records what a hand-over does with a frontend that keeps its connections, in
// events (shared with a flushHook's), with whether the gate was shut at each call.
type fakeIntake struct {
	tk       interface{ Gate() *gate.Gate }
	events   *[]string
	pauseErr error
	execErr  error
}

func (in *fakeIntake) note(what string) {
	if in.tk.Gate().IsShut() {
		what += " (gate shut)"
	}
	*in.events = append(*in.events, what)
}

func (in *fakeIntake) PauseIntake(context.Context) error {
	in.note("pause")
	return in.pauseErr
}
func (in *fakeIntake) ResumeIntake() { in.note("resume") }
func (in *fakeIntake) ExecSockets() (string, error) {
	in.note("exec sockets")
	return "ISERBLK_NBD_SOCKETS=3:7,8", in.execErr
}
func (in *fakeIntake) StoreSockets(store func(name string, fds []int) error) error {
	in.note("store sockets")
	return store("nbd3-pid1", []int{7, 8})
}

// intakeFixture is a hand-over fixture whose frontend keeps its connections (fakeIntake) and
// whose device's flushes are events too: flush number failAt fails (0: none).
func intakeFixture(t *testing.T, failAt int) (*fixture, *fakeIntake) {
	in := &fakeIntake{events: &[]string{}}
	flushes := 0
	dev := flushHook{Device: memDevice(t, 1<<20), hook: func(context.Context) error {
		flushes++
		in.note("flush")
		if flushes == failAt {
			return block.ErrIO
		}
		return nil
	}}
	f := newFixture(t, dev, fixtureOptions{handOver: true})
	in.tk = f.tk
	f.tk.SetIntake(in)
	return f, in
}

func wantEvents(t *testing.T, in *fakeIntake, want ...string) {
	t.Helper()
	if strings.Join(*in.events, ", ") != strings.Join(want, ", ") {
		t.Fatalf("events %q, want %q", *in.events, want)
	}
}

// A restart writes back while the device serves, pauses the intake before the gate shuts
// (nothing may wait at the gate for an image that will not answer it), writes back the rest, and
// hands the sockets to the new image's environment.
func TestRestartPausesIntakeAndHandsItsSocketsDown(t *testing.T) {
	f, in := intakeFixture(t, 0)
	env := restartEnv(t, f)
	wantEvents(t, in, "flush", "pause", "flush (gate shut)", "exec sockets (gate shut)")
	if got := envEntries(env, "ISERBLK_NBD_SOCKETS"); len(got) != 1 || got[0] != "ISERBLK_NBD_SOCKETS=3:7,8" {
		t.Fatalf("the new image's environment has %q; want the intake's entry alone", got)
	}
	if len(env) < len(os.Environ()) {
		t.Fatalf("the new image's environment lost entries: %d of %d", len(env), len(os.Environ()))
	}
}

// restartEnv restarts f's gateway, with ISERBLK_NBD_SOCKETS=stale in this process's
// environment, and returns the environment its exec was given (the fake exec fails).
func restartEnv(t *testing.T, f *fixture) []string {
	t.Helper()
	t.Setenv("ISERBLK_NBD_SOCKETS", "stale")
	step, err := f.g.Restart(context.Background(), control.Request{})
	if err != nil {
		t.Fatalf("restart: %v", err)
	}
	f.proc.execErr = errors.New("exec format error")
	_ = step()
	return f.proc.envs[0]
}

func envEntries(env []string, name string) []string {
	var got []string
	for _, e := range env {
		if strings.HasPrefix(e, name+"=") {
			got = append(got, e)
		}
	}
	return got
}

// Sockets that cannot be handed down leave the new image's environment without an entry: it
// then gives the device new sockets, as after a crash.
func TestRestartWithoutSocketsToHandDown(t *testing.T) {
	f, in := intakeFixture(t, 0)
	in.execErr = errors.New("dup: too many open files")
	if got := envEntries(restartEnv(t, f), "ISERBLK_NBD_SOCKETS"); len(got) != 1 || got[0] != "ISERBLK_NBD_SOCKETS=stale" {
		t.Fatalf("the new image's environment has %q; want what this process had, untouched", got)
	}
}

// A restart that fails resumes the intake after the gate reopens, whatever step failed.
func TestFailedRestartResumesIntake(t *testing.T) {
	t.Run("the write-back while serving fails", func(t *testing.T) {
		f, in := intakeFixture(t, 1)
		_, err := f.g.Restart(context.Background(), control.Request{})
		wantControlError(t, err, control.CodeFailed, "keeps serving")
		wantEvents(t, in, "flush", "resume")
	})
	t.Run("the pause fails", func(t *testing.T) {
		f, in := intakeFixture(t, 0)
		in.pauseErr = context.DeadlineExceeded
		_, err := f.g.Restart(context.Background(), control.Request{})
		wantControlError(t, err, control.CodeTimeout, "keeps serving")
		wantEvents(t, in, "flush", "pause", "resume")
	})
	t.Run("the write-back after the pause fails", func(t *testing.T) {
		f, in := intakeFixture(t, 2)
		_, err := f.g.Restart(context.Background(), control.Request{})
		wantControlError(t, err, control.CodeFailed, "keeps serving")
		wantEvents(t, in, "flush", "pause", "flush (gate shut)", "resume")
		if f.tk.Gate().IsShut() {
			t.Fatal("the gate stayed shut")
		}
	})
	t.Run("stop --keep without a descriptor store does not pause", func(t *testing.T) {
		t.Setenv("NOTIFY_SOCKET", "") // not under systemd: no store
		f, in := intakeFixture(t, 0)
		step, err := f.g.Stop(context.Background(), control.Request{Keep: true})
		if err != nil {
			t.Fatal(err)
		}
		_ = step()
		wantEvents(t, in, "flush (gate shut)")
	})
}

// Under a supervisor with a descriptor store (systemd's FDSTORE), stop --keep does what a
// restart does up to the exec (write back while serving, pause, shut, write back the rest) and
// leaves the sockets in the store before it exits; a store that fails does not keep the
// process from exiting with the device handed over.
func TestStopKeepLeavesSocketsInTheDescriptorStore(t *testing.T) {
	for _, storeErr := range []error{nil, errors.New("sd_notify: connection refused")} {
		t.Run(fmt.Sprint("store error ", storeErr), func(t *testing.T) {
			f, in := intakeFixture(t, 0)
			var stored []string
			f.g.opts.Process.StoreFDs = func(name string, fds []int) error {
				in.note("store")
				stored = append(stored, fmt.Sprint(name, " ", fds))
				return storeErr
			}
			step, err := f.g.Stop(context.Background(), control.Request{Keep: true})
			if err != nil {
				t.Fatal(err)
			}
			if err := step(); err != nil {
				t.Fatal(err)
			}
			wantEvents(t, in, "flush", "pause", "flush (gate shut)", "store sockets (gate shut)", "store (gate shut)")
			if len(stored) != 1 || stored[0] != "nbd3-pid1 [7 8]" {
				t.Fatalf("stored %q; want the intake's sockets once", stored)
			}
			if len(f.proc.exits) != 1 || f.proc.exits[0] != ExitOK || len(f.proc.execs) != 0 {
				t.Fatalf("exits %v, execs %v; want one exit 0 and no exec", f.proc.exits, f.proc.execs)
			}
			if st := f.state(t); st.Dirty {
				t.Fatalf("state at the exit: %+v, want clean", st)
			}
		})
	}
	t.Run("a failed pause keeps serving", func(t *testing.T) {
		f, in := intakeFixture(t, 0)
		f.g.opts.Process.StoreFDs = func(string, []int) error { t.Fatal("stored after a failed pause"); return nil }
		in.pauseErr = context.DeadlineExceeded
		_, err := f.g.Stop(context.Background(), control.Request{Keep: true})
		wantControlError(t, err, control.CodeTimeout, "keeps serving")
		wantEvents(t, in, "flush", "pause", "resume")
		if len(f.proc.exits) != 0 {
			t.Fatalf("exits %v after a failed stop --keep", f.proc.exits)
		}
	})
}
