package gateway

import (
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"

	"context"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/iser-blk/iser-blk/block"
	"github.com/iser-blk/iser-blk/internal/control"
	"github.com/iser-blk/iser-blk/internal/lifecycle"
	"github.com/iser-blk/iser-blk/internal/sdnotify/sdnotifytest"
)

// The backend's "cannot serve" fails a ready gateway with its reason and "serves again" makes it
// ready; a failure with another reason is not undone.
func TestAvailabilityDrivesFailed(t *testing.T) {
	f := newFixture(t, memDevice(t, 1<<20), fixtureOptions{})
	f.paths(false, "no path")
	wantState(t, f.g, lifecycle.Failed, "no path")
	f.paths(true, "")
	wantState(t, f.g, lifecycle.Ready, "a path to the target is back")

	f.g.Fenced("dirty predecessor")
	f.paths(false, "no path")
	f.paths(true, "")
	wantState(t, f.g, lifecycle.Failed, "fenced")
}

// A detach runs its write-back while the device serves; the gateway stops only once it
// succeeded, and the detach is answered with the final flush's outcome.
func TestDetachCommitsAndIsAnsweredByTheFinalFlush(t *testing.T) {
	f := newFixture(t, memDevice(t, 1<<20), fixtureOptions{})
	frontendStopped := make(chan struct{})
	f.onStop = func() { close(frontendStopped) }
	answered := make(chan error, 1)
	go func() {
		_, err := f.g.Detach(context.Background(), control.Request{})
		answered <- err
	}()
	<-frontendStopped // the command's frontend ends, and it shuts down
	if !f.g.Service().Lifecycle.Committed() {
		t.Fatal("the frontend was stopped before the shutdown was committed")
	}
	if code := f.g.Shutdown(ExitOK, nil); code != ExitOK {
		t.Fatalf("shutdown: %d", code)
	}
	if err := <-answered; err != nil {
		t.Fatalf("detach: %v", err)
	}
	wantState(t, f.g, lifecycle.Stopped, "")
}

// A detach whose write-back fails keeps the gateway serving and never told systemd it stops
// (STOPPING=1 would make the unit stop and ignore the next READY=1); a planned restart is a
// reload.
func TestNoStoppingUntilTheShutdownCommits(t *testing.T) {
	sock := sdnotifytest.Listen(t)
	f := newFixture(t, flushHook{Device: memDevice(t, 1<<20), hook: func(context.Context) error { return block.ErrIO }}, fixtureOptions{handOver: true})
	// drain reads messages up to the READY=1 that a failed operation ends with.
	drain := func() []string {
		var got []string
		for {
			m := sock.Receive()
			got = append(got, m)
			if strings.Contains(m, "READY=1") {
				return got
			}
		}
	}
	sock.Receive() // the fixture's READY=1
	if _, err := f.g.Detach(context.Background(), control.Request{Force: true}); err == nil {
		t.Fatal("a detach whose write-back failed succeeded")
	}
	for _, m := range drain() {
		if strings.Contains(m, "STOPPING=1") {
			t.Fatalf("STOPPING=1 sent for a detach that failed: %q", m)
		}
	}
	if _, err := f.g.Restart(context.Background(), control.Request{}); err == nil {
		t.Fatal("a restart whose write-back failed succeeded")
	}
	msgs := strings.Join(drain(), "\n---\n")
	if !strings.Contains(msgs, "RELOADING=1") || strings.Contains(msgs, "STOPPING=1") {
		t.Fatalf("a failed restart sent %q; want RELOADING=1 then READY=1, never STOPPING=1", msgs)
	}
}

// A path outage reported while a detach writes back leaves the state alone; when that
// write-back fails the gateway is failed (no path serves), and ready once a path is back.
func TestFailedDetachWriteBackWithoutPath(t *testing.T) {
	var f *fixture
	f = newFixture(t, flushHook{Device: memDevice(t, 1<<20), hook: func(context.Context) error {
		f.paths(false, "no path")
		if s, _ := f.g.State(); s != lifecycle.Flushing {
			t.Errorf("a path outage during the write-back moved the gateway to %s", s)
		}
		return block.ErrIO
	}}, fixtureOptions{})
	_, err := f.g.Detach(context.Background(), control.Request{})
	wantControlError(t, err, control.CodeFailed, "keeps serving")
	wantState(t, f.g, lifecycle.Failed, "no path")
	f.paths(true, "")
	wantState(t, f.g, lifecycle.Ready, "a path to the target is back")
	if f.stops.Load() != 0 {
		t.Fatal("a failed detach stopped the frontend")
	}
}

// A detach of a gateway that failed for want of a path still tries its write-back (a path may be
// back by the time it runs): failed → flushing is in the table, so nothing is refused (which
// would log an error at systemctl stop for a sequence that is no defect), and the write-back
// that fails returns the gateway to failed, serving with its data.
func TestDetachOfAFailedGateway(t *testing.T) {
	core, logs := observer.New(zapcore.DebugLevel)
	f := newFixture(t, flushHook{Device: memDevice(t, 1<<20), hook: func(context.Context) error { return block.ErrIO }},
		fixtureOptions{log: zap.New(core)})
	var seen stateRecorder
	f.g.Service().Lifecycle.Subscribe(&seen)
	f.paths(false, "no path")
	_, err := f.g.Detach(context.Background(), control.Request{})
	wantControlError(t, err, control.CodeFailed, "keeps serving")
	wantState(t, f.g, lifecycle.Failed, "no path")
	if want := []lifecycle.State{lifecycle.Failed, lifecycle.Flushing, lifecycle.Failed}; !slices.Equal(seen.states(), want) {
		t.Fatalf("transitions %v, want %v", seen.states(), want)
	}
	if refused := logs.FilterMessage("lifecycle transition refused").All(); len(refused) != 0 {
		t.Fatalf("refused: %+v", refused)
	}
}

// stateRecorder is a lifecycle.Observer that keeps the states moved to.
type stateRecorder struct {
	mu sync.Mutex
	to []lifecycle.State
}

func (r *stateRecorder) StateChanged(tr lifecycle.Transition) {
	r.mu.Lock()
	r.to = append(r.to, tr.To)
	r.mu.Unlock()
}

func (r *stateRecorder) FlushProgressed(lifecycle.FlushProgress) {}

func (r *stateRecorder) states() []lifecycle.State {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.to)
}

// Once the shutdown began a detach is refused as busy; one already writing back has its
// write-back cancelled, joins the shutdown and is answered by the final flush.
func TestDetachAndTheShutdown(t *testing.T) {
	dev := newBlockedFlush(t)
	f := newFixture(t, dev, fixtureOptions{})
	answered := make(chan error, 1)
	go func() {
		_, err := f.g.Detach(context.Background(), control.Request{})
		answered <- err
	}()
	<-dev.began
	f.g.StopForSignal() // returns once the detach's write-back gave up
	_, err := f.g.Detach(context.Background(), control.Request{})
	wantControlError(t, err, control.CodeBusy, "already stopping")
	code := f.g.Shutdown(ExitOK, nil) // the blocked flush fails: memdev's own flush is never reached
	if code == ExitOK {
		t.Fatal("a final flush that failed exited 0")
	}
	wantControlError(t, <-answered, control.CodeFailed, "final flush failed")
}

// A transition the lifecycle refuses is a sequencing defect (or a shutdown that overtook an
// operation): it is logged at error level, not hidden at debug.
func TestRefusedTransitionIsAnError(t *testing.T) {
	core, logs := observer.New(zapcore.DebugLevel)
	f := newFixture(t, memDevice(t, 1<<20), fixtureOptions{log: zap.New(core)})
	f.g.Shutdown(ExitOK, nil)
	f.g.Ready() // stopped → ready is not in the table
	entries := logs.FilterMessage("lifecycle transition refused").All()
	if len(entries) != 1 || entries[0].Level != zapcore.ErrorLevel {
		t.Fatalf("refused transition logged as %+v, want one error", entries)
	}
}
