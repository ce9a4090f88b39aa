package main

import (
	"context"
	"errors"
	"path/filepath"
	"testing"

	"go.uber.org/zap/zaptest"

	"github.com/iser-blk/iser-blk/internal/control"
	"github.com/iser-blk/iser-blk/internal/lifecycle"
	"github.com/iser-blk/iser-blk/internal/status"
)

// testGateway starts a ready gateway's service in a temporary run directory.
func testGateway(t *testing.T) *gateway {
	t.Helper()
	sf := &serviceFlags{name: "gw", runDir: filepath.Join(t.TempDir(), "run")}
	g, err := startGateway(sf, status.Identity{Name: "gw"}, new(status.IOCounters), func() {}, zaptest.NewLogger(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = g.svc.Close() })
	g.ready()
	return g
}

func wantState(t *testing.T, g *gateway, state lifecycle.State, reason string) {
	t.Helper()
	if s, r := g.svc.Lifecycle.State(); s != state || r != reason {
		t.Fatalf("state %s (%q), want %s (%q)", s, r, state, reason)
	}
}

// TestAvailabilityDrivesFailed: the backend's "cannot serve" fails a ready gateway with its
// reason and "serves again" makes it ready; a failure with another reason is not undone.
func TestAvailabilityDrivesFailed(t *testing.T) {
	g := testGateway(t)
	g.availabilityChanged(false, "no path")
	wantState(t, g, lifecycle.Failed, "no path")
	g.availabilityChanged(true, "")
	wantState(t, g, lifecycle.Ready, "a path to the target is back")

	g.to(lifecycle.Failed, "fenced")
	g.availabilityChanged(false, "no path")
	g.availabilityChanged(true, "")
	wantState(t, g, lifecycle.Failed, "fenced")
}

// TestFailedDetachWriteBackWithoutPath: a path outage reported while a detach writes back leaves
// the state alone; when that write-back fails the gateway is failed (not ready, since no path
// serves), and ready once a path is back.
func TestFailedDetachWriteBackWithoutPath(t *testing.T) {
	g := testGateway(t)
	if _, err := g.beginDetach(context.Background()); err != nil {
		t.Fatal(err)
	}
	g.to(lifecycle.Draining, "detach requested")
	g.to(lifecycle.Flushing, "write-back before detach")
	g.availabilityChanged(false, "no path")
	wantState(t, g, lifecycle.Flushing, "write-back before detach")
	if g.commitDetach(errors.New("WRITE(16): no path")) {
		t.Fatal("a failed write-back committed the detach")
	}
	wantState(t, g, lifecycle.Failed, "no path")
	g.availabilityChanged(true, "")
	wantState(t, g, lifecycle.Ready, "a path to the target is back")
}

// TestDetachRefusedOnceStopping: once the shutdown began, a detach is refused as busy; a detach
// already writing back has its write-back cancelled and joins the shutdown.
func TestDetachRefusedOnceStopping(t *testing.T) {
	g := testGateway(t)
	wbCtx, err := g.beginDetach(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	g.stopMu.Lock()
	g.stopping = true // as shutdown does first
	g.abortWB()
	g.stopMu.Unlock()
	if wbCtx.Err() == nil {
		t.Fatal("the running detach's write-back was not cancelled by the shutdown")
	}
	if !g.commitDetach(wbCtx.Err()) {
		t.Fatal("a detach whose write-back the shutdown cancelled did not join it")
	}
	_, err = g.beginDetach(context.Background())
	var ce *control.Error
	if !errors.As(err, &ce) || ce.Code != control.CodeBusy {
		t.Fatalf("detach once stopping: %v, want busy", err)
	}
}
