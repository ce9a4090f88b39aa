package main

// The planned restart of an attach gateway (issue 17, `iser-blk restart NAME`): stop intake at
// the gate, let the requests in flight end, write back every dirty byte, record a clean state,
// log out of the target, and re-execute the binary from its path on disk with the same
// arguments and PID. The kernel device is never removed: it waits for a server, as after a
// crash, and the new image takes it over through the state file — resuming even with a
// write-back cache, because the state says nothing acknowledged was lost. Anything that fails
// before the re-exec reopens the gate and leaves the gateway serving with its data and its
// dirty state.

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/dustin/go-humanize"
	"go.uber.org/zap"

	"github.com/iser-blk/iser-blk/block"
	"github.com/iser-blk/iser-blk/internal/control"
	"github.com/iser-blk/iser-blk/internal/lifecycle"
)

// canRestart makes the gateway restartable: t is attach --name's takeover, whose gate stands
// in front of the served device and whose state file the successor reads.
func (g *gateway) canRestart(t *takeover) {
	g.mu.Lock()
	g.restartable = t
	g.mu.Unlock()
}

// restart is the control socket's restart (service.RestartFunc). On success the returned step
// re-executes the binary; it returns only if that failed, and then the process exits: the
// device is already handed over (clean state, no session), waiting for `attach` to be run again.
func (g *gateway) restart(ctx context.Context, _ control.Request) (func() error, error) {
	t, dev, err := g.restartReady()
	if err != nil {
		return nil, err
	}
	// The shutdown's final flush and a detach's write-back hold flushMu too. A SIGTERM during
	// the restart cancels its hand-over (beginRestart registers the cancel as the shutdown's
	// abortWB), waits here for the restart to give up, then flushes and stops as usual.
	g.flushMu.Lock()
	defer g.flushMu.Unlock()
	ctx, err = g.beginRestart(ctx)
	if err != nil {
		return nil, err
	}
	g.to(lifecycle.Draining, "restart requested")
	written, err := g.handOver(ctx, t, dev)
	if err == nil && !g.commitRestart() {
		err = errors.New("a shutdown began during the restart: the shutdown proceeds instead")
	}
	if err != nil {
		g.undoHandOver(t, err)
		if errors.Is(err, context.DeadlineExceeded) {
			return nil, &control.Error{Code: control.CodeTimeout, Message: "restart timed out, the gateway keeps serving: " + err.Error()}
		}
		return nil, &control.Error{Code: control.CodeFailed, Message: "restart failed, the gateway keeps serving with its data: " + err.Error()}
	}
	// Committed: from here the old image only logs out and re-executes. A SIGINT or SIGTERM now
	// would cancel the serving context and tear the kernel device down (NBD disconnect, parked
	// ublk requests failed) under the re-exec, so they are ignored until the new image installs
	// its handlers (os/signal's Notify does, even for a signal inherited as ignored).
	ignoreStopSignals()
	// The dirty bytes the hand-over began with are what it wrote back (nothing is dirty now), the
	// figure `restart` prints from the progress; the write-back counter's delta is what went to
	// the target meanwhile, which can differ (a page written back twice, one already in flight).
	g.log.Info("re-executing for a planned restart", zap.String("binary", startExecutable),
		zap.String("dirty_written_back", humanize.IBytes(uint64(written.dirtyBefore))),
		zap.Int64("dirty_written_back_bytes", written.dirtyBefore),
		zap.Uint64("write_back_sent_bytes", written.bytes))
	closeForRestart(dev, g.log)
	return func() error {
		err := reexec(startExecutable)
		g.log.Error("RE-EXEC FAILED: the device is flushed and waits for a server; run the same attach command again",
			zap.String("binary", startExecutable), zap.Error(err))
		os.Exit(exitFailure)
		return err
	}, nil
}

// restartReady refuses a restart that could not hand the device over intact, before anything
// stops: a gateway that is not an attach --name, a fenced device, a kernel device that would not
// wait for the next image, a binary that cannot be executed, a gateway not serving.
func (g *gateway) restartReady() (*takeover, block.Device, error) {
	g.mu.Lock()
	t, dev := g.restartable, g.dev
	g.mu.Unlock()
	if g.svc.Status.Identity().FrontendKind == "nbd-socket" {
		return nil, nil, &control.Error{Code: control.CodeUnsupported,
			Message: "restart applies to attach: a serve gateway's clients would lose their connections; stop and start it instead"}
	}
	switch {
	case t == nil:
		return nil, nil, control.Refused("restart needs a gateway started with attach --name: without it there is no state file for the new image to take the device over with")
	case t.fenceReason() != "":
		return nil, nil, control.Refused("the device is fenced (%s); a restart would not make it safe: detach and attach afresh", t.fenceReason())
	case dev == nil || t.gate == nil:
		return nil, nil, &control.Error{Code: control.CodeFailed, Message: "the gateway is still starting: it serves no device yet"}
	}
	if st, _ := g.svc.Lifecycle.State(); st != lifecycle.Ready {
		return nil, nil, &control.Error{Code: control.CodeFailed, Message: fmt.Sprintf("the gateway is %s, not ready", st)}
	}
	if err := t.checkCanWait(); err != nil {
		return nil, nil, control.Refused("the kernel device cannot wait for a restarted gateway: %v", err)
	}
	if startExecutableErr != nil {
		return nil, nil, control.Refused("cannot tell which binary to re-execute: %v", startExecutableErr)
	}
	if err := reexecutable(startExecutable); err != nil {
		return nil, nil, control.Refused("cannot re-execute %s: %v", startExecutable, err)
	}
	return t, dev, nil
}

// writeBack is what a restart's write-back did: the cache's dirty bytes when it began, and the
// bytes its write-back counter moved (the cache's own accounting, which may differ: pages
// written back while the drain ran, rewrites of one page).
type writeBack struct {
	dirtyBefore int64
	bytes       uint64
}

// handOver closes the gate, waits for the requests in flight, writes back every dirty byte and
// records the clean state.
func (g *gateway) handOver(ctx context.Context, t *takeover, dev block.Device) (writeBack, error) {
	var wb writeBack
	if n := t.gate.Inflight(); n > 0 {
		g.log.Info("restart: waiting for the requests in flight", zap.Int64("in_flight", n))
	}
	if err := t.gate.close(ctx); err != nil {
		return wb, fmt.Errorf("requests in flight did not end: %w", err)
	}
	g.to(lifecycle.Flushing, "write-back before restart")
	before := writtenBack(dev)
	dr, isCache := dev.(dirtyReporter)
	if isCache {
		wb.dirtyBefore = dr.DirtyBytes()
	}
	if err := flushWithProgress(ctx, dev, g.log, g.svc.Lifecycle); err != nil {
		return wb, fmt.Errorf("write-back: %w", err)
	}
	wb.bytes = writtenBack(dev) - before
	if isCache && dr.DirtyBytes() > 0 { // nothing passes the closed gate
		return wb, fmt.Errorf("%s still dirty after the write-back", humanize.IBytes(uint64(dr.DirtyBytes())))
	}
	if err := t.recordClean(); err != nil {
		return wb, fmt.Errorf("recording the clean state: %w", err)
	}
	return wb, nil
}

// ignoreStopSignals is signal.Ignore of SIGINT and SIGTERM; tests replace it, so that a test
// binary keeps its own.
var ignoreStopSignals = func() { signal.Ignore(os.Interrupt, syscall.SIGTERM) }

// beginRestart refuses a restart once the shutdown began or while a detach writes back, and
// returns the context its hand-over runs under: ctx, also cancelled if a shutdown begins
// meanwhile (shutdown calls abortWB).
func (g *gateway) beginRestart(ctx context.Context) (context.Context, error) {
	g.stopMu.Lock()
	defer g.stopMu.Unlock()
	if g.stopping {
		return nil, &control.Error{Code: control.CodeBusy, Message: "the gateway is already stopping (a signal began its shutdown)"}
	}
	if g.abortWB != nil {
		return nil, busyWritingBack
	}
	ctx, g.abortWB = context.WithCancel(ctx)
	return ctx, nil
}

// commitRestart marks the gateway stopping for the re-exec, unless a shutdown began first
// (false: the restart yields to it). From here a detach is refused.
func (g *gateway) commitRestart() bool {
	g.stopMu.Lock()
	defer g.stopMu.Unlock()
	g.abortWB()
	g.abortWB = nil
	if g.stopping {
		return false
	}
	g.stopping, g.committed = true, true
	return true
}

// undoHandOver puts a gateway whose restart failed (err) back to serving: the state file dirty
// again if the hand-over had recorded it clean (requests parked at the gate are about to be
// served into the cache, and a successor must not resume after losing them), the gate open, and
// the lifecycle where it belongs unless a shutdown drives it now.
func (g *gateway) undoHandOver(t *takeover, err error) {
	if rerr := t.recordAgain(false); rerr != nil {
		g.log.Error("could not record the state dirty again after a failed restart", zap.Error(rerr))
	}
	t.gate.reopen()
	g.stopMu.Lock()
	if g.abortWB != nil {
		g.abortWB()
		g.abortWB = nil
	}
	if !g.stopping {
		g.resumeLocked("restart failed: " + err.Error())
	}
	g.stopMu.Unlock()
	g.log.Error("planned restart failed: the gateway keeps serving", zap.Error(err))
}

// closeForRestart logs out of the target without touching the kernel device (the frontend is
// never stopped: the device waits for the new image). Everything is on the target already; a
// failed close is only logged, as the state file says so and the successor logs in afresh.
func closeForRestart(dev block.Device, log *zap.Logger) {
	if err := dev.Close(); err != nil {
		log.Warn("closing the device before the re-exec", zap.Error(err))
	}
}
