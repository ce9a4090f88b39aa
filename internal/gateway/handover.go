package gateway

// The hand-over of an attach gateway's kernel device to the next process: a planned restart
// (re-execute the binary, same PID) or a stop that keeps the device (exit 0; a successor started
// with the same command takes it over). Shut the gate, let the requests in flight end, write
// back every dirty byte, record a clean state, log out of the target, and end this process
// image. The kernel device is never removed: it waits for a server, as after a crash, and the
// next image takes it over through the state file — resuming even with a write-back cache,
// because the state says nothing acknowledged was lost. Anything that fails before the commit
// reopens the gate and leaves the gateway serving with its data (the gate records the state
// dirty again before the next write is let through).

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"

	"github.com/dustin/go-humanize"
	"go.uber.org/zap"

	"github.com/iser-blk/iser-blk/block"
	"github.com/iser-blk/iser-blk/internal/control"
	"github.com/iser-blk/iser-blk/internal/lifecycle"
	"github.com/iser-blk/iser-blk/internal/modes"
	"github.com/iser-blk/iser-blk/internal/takeover"
)

// handOverKind is what ends the process image after a hand-over.
type handOverKind int

const (
	reexec   handOverKind = iota // a planned restart
	exitKept                     // stop --keep
)

func (k handOverKind) String() string {
	if k == reexec {
		return "restart"
	}
	return "stop --keep"
}

// Restart is the control socket's restart (service.RestartFunc). On success the returned step
// re-executes the binary; it returns only if that failed, and then the process exits: the
// device is already handed over (clean state, no session), waiting for `attach` to be run again.
func (g *Gateway) Restart(ctx context.Context, _ control.Request) (func() error, error) {
	return g.handOverDevice(ctx, reexec)
}

// Stop is the control socket's stop --keep (service.StopFunc). On success the returned step
// ends the process with exit 0, the device left for a successor.
func (g *Gateway) Stop(ctx context.Context, _ control.Request) (func() error, error) {
	return g.handOverDevice(ctx, exitKept)
}

func (g *Gateway) handOverDevice(ctx context.Context, kind handOverKind) (func() error, error) {
	t, dev, err := g.handOverReady(kind)
	if err != nil {
		return nil, err
	}
	// The shutdown's final flush and a detach's write-back hold flushMu too. A stop signal
	// during the hand-over cancels it (beginOp registers the cancel for the shutdown), waits
	// here for it to give up, then flushes and stops as usual.
	g.flushMu.Lock()
	defer g.flushMu.Unlock()
	if ctx, err = g.beginOp(ctx, false); err != nil {
		return nil, err
	}
	if kind == reexec {
		g.to(lifecycle.Restarting, "restart requested")
	} else {
		g.to(lifecycle.Draining, "stop --keep requested")
	}
	written, err := g.transfer(ctx, t, dev, kind)
	if err == nil && !g.commitHandOver() {
		err = errors.New("a shutdown began meanwhile: the shutdown proceeds instead")
	}
	if err != nil {
		return nil, g.undoHandOver(t, kind, err)
	}
	// Committed: from here the old image only logs out and ends. A SIGINT or SIGTERM now would
	// tear the kernel device down under the next image, so they are ignored until it installs
	// its handlers (os/signal's Notify does, even for a signal inherited as ignored).
	g.opts.Process.IgnoreStopSignals()
	// The dirty bytes the hand-over began with are what it wrote back (nothing is dirty now), the
	// figure the client prints; the write-back counter's delta is what went to the target
	// meanwhile, which can differ (a page written back twice, one already in flight).
	msg := "re-executing for a planned restart"
	if kind == exitKept {
		msg = "stopping: the device is kept for a successor started with the same command"
	}
	g.log.Info(msg, zap.String("binary", g.opts.Process.Executable),
		zap.String("dirty_written_back", humanize.IBytes(uint64(written.dirtyBefore))),
		zap.Int64("dirty_written_back_bytes", written.dirtyBefore),
		zap.Uint64("write_back_sent_bytes", written.bytes))
	// Everything is on the target, or durable in a cache device's log that the successor opens
	// again (Keep: no write-back); a failed close is only logged, as the state file says so and
	// the successor logs in afresh.
	if p := persister(dev); p != nil {
		p.Keep()
	}
	if err := dev.Close(); err != nil {
		g.log.Warn("closing the device before handing it over", zap.Error(err))
	}
	if kind == exitKept {
		g.commitTo(lifecycle.Stopped, "stopped; the device is kept for a successor")
		return func() error { return g.exitKept(g.keptIntake(t, kind)) }, nil
	}
	return func() error { return g.reexec(t.Intake()) }, nil
}

// reexec is a committed restart's last step. The frontend's connections, when it keeps them
// across the exec (in, paused by transfer), go to the new image in its environment.
func (g *Gateway) reexec(in takeover.Intake) error {
	defer close(g.handOverEnded)
	path := g.opts.Process.Executable
	env := os.Environ()
	if in != nil {
		entry, err := in.ExecSockets()
		if err != nil {
			g.log.Warn("the device's connections end with this image: the kernel requeues the requests it sent meanwhile when their timer fires", zap.Error(err))
		} else {
			env = withEnv(env, entry)
		}
	}
	_ = g.log.Sync()
	err := g.opts.Process.Exec(path, env)
	g.log.Error("RE-EXEC FAILED: the device is flushed and waits for a server; run the same attach command again",
		zap.String("binary", path), zap.Error(err))
	_ = g.log.Sync()
	g.opts.Process.Exit(ExitFailure)
	return err
}

// exitKept is a committed stop --keep's last step. The frontend's connections, when it keeps
// them (in, paused by transfer), go to the supervisor's descriptor store for the successor.
func (g *Gateway) exitKept(in takeover.Intake) error {
	defer close(g.handOverEnded)
	if in != nil {
		if err := in.StoreSockets(g.opts.Process.StoreFDs); err != nil {
			g.log.Warn("the device's connections end with this process: the kernel requeues the requests it sent meanwhile when their timer fires", zap.Error(err))
		} else {
			g.log.Info("sent the device's connections to the service manager's descriptor store for the successor (the unit's FileDescriptorStoreMax= must allow them)")
		}
	}
	_ = g.log.Sync()
	g.opts.Process.Exit(ExitOK)
	return nil
}

// handOverReady refuses a hand-over that could not pass the device on intact, before anything
// stops: a gateway that is not an attach --name, a fenced device, a kernel device that would not
// wait for the next image, a binary that cannot be executed, a gateway not serving.
func (g *Gateway) handOverReady(kind handOverKind) (*takeover.Takeover, block.Device, error) {
	g.stopMu.Lock()
	err := g.endingLocked()
	g.stopMu.Unlock()
	if err != nil {
		return nil, nil, err
	}
	g.mu.Lock()
	t, dev := g.handOver, g.dev
	g.mu.Unlock()
	if g.svc.Status.Identity().FrontendKind == modes.NBDSocket {
		return nil, nil, &control.Error{Code: control.CodeUnsupported,
			Message: kind.String() + " applies to attach: a serve gateway's clients would lose their connections; stop and start it instead"}
	}
	switch {
	case t == nil:
		return nil, nil, control.Refused("%s needs a gateway started with attach --name: without it there is no state file for the next image to take the device over with", kind)
	case t.FenceReason() != "":
		return nil, nil, control.Refused("the device is fenced (%s); a %s would not make it safe: detach and attach afresh", t.FenceReason(), kind)
	case dev == nil || t.Gate() == nil:
		return nil, nil, &control.Error{Code: control.CodeFailed, Message: "the gateway is still starting: it serves no device yet"}
	}
	if st, _ := g.svc.Lifecycle.State(); st != lifecycle.Ready {
		return nil, nil, &control.Error{Code: control.CodeFailed, Message: fmt.Sprintf("the gateway is %s, not ready", st)}
	}
	if err := t.CheckCanWait(); err != nil {
		return nil, nil, control.Refused("the kernel device cannot wait for the next gateway: %v", err)
	}
	if kind == reexec {
		p := g.opts.Process
		if p.ExecutableErr != nil {
			return nil, nil, control.Refused("cannot tell which binary to re-execute: %v", p.ExecutableErr)
		}
		if err := reexecutable(p.Executable); err != nil {
			return nil, nil, control.Refused("cannot re-execute %s: %v", p.Executable, err)
		}
	}
	return t, dev, nil
}

// writeBack is what a hand-over's write-back did: the dirty bytes when it began, and the bytes
// the cache's write-back counter moved (which may differ: pages written back while the drain
// ran, rewrites of one page).
type writeBack struct {
	dirtyBefore int64
	bytes       uint64
}

// transfer shuts the gate, waits for the requests in flight, writes back every dirty byte and
// records the clean state.
func (g *Gateway) transfer(ctx context.Context, t *takeover.Takeover, dev block.Device, kind handOverKind) (writeBack, error) {
	var wb writeBack
	gate := t.Gate()
	// A frontend that keeps its connections (across the exec, or in a descriptor store) stops
	// reading requests before the gate shuts: what the kernel sends from then on waits in the
	// sockets for the next image, instead of at the gate for the kernel's request timer
	// (frontend/nbd/handover_linux.go). The kernel's timer runs for those requests all the
	// same (30 s by default; it closes a connection whose request outlives it), so the dirty
	// data is written back first, while the device still serves: the pause then lasts the rest
	// of the write-back, the exec (or the exit and the successor's start) and the next image's
	// start.
	var early writeBack
	if in := g.keptIntake(t, kind); in != nil {
		before := writtenBack(dev)
		early.dirtyBefore = dirtyBytes(dev)
		if err := flushWithProgress(ctx, dev, g.log, g.svc.Lifecycle); err != nil {
			return wb, fmt.Errorf("write-back: %w", err)
		}
		early.bytes = writtenBack(dev) - before
		if err := in.PauseIntake(ctx); err != nil {
			return wb, fmt.Errorf("pausing the device's requests: %w", err)
		}
	}
	if n := gate.Inflight(); n > 0 {
		g.log.Info(kind.String()+": waiting for the requests in flight", zap.Int64("in_flight", n))
	}
	if err := gate.Shut(ctx); err != nil {
		return wb, fmt.Errorf("requests in flight did not end: %w", err)
	}
	if kind == exitKept {
		g.to(lifecycle.Flushing, "write-back before stop --keep")
	}
	before := writtenBack(dev)
	wb.dirtyBefore = dirtyBytes(dev)
	if err := flushWithProgress(ctx, dev, g.log, g.svc.Lifecycle); err != nil {
		return wb, fmt.Errorf("write-back: %w", err)
	}
	wb.bytes = writtenBack(dev) - before
	wb.dirtyBefore += early.dirtyBefore
	wb.bytes += early.bytes
	clean, err := gate.MarkClean() // nothing passes the shut gate: nothing can be dirty now
	switch {
	case err != nil:
		return wb, fmt.Errorf("recording the clean state: %w", err)
	case !clean:
		return wb, fmt.Errorf("%s still dirty after the write-back", humanize.IBytes(uint64(dirtyBytes(dev))))
	}
	return wb, nil
}

// keptIntake is the frontend's Intake when its connections outlive this process image in a
// hand-over of kind: across the exec of a restart, or in the supervisor's descriptor store
// after a stop --keep. Nil when they end with it.
func (g *Gateway) keptIntake(t *takeover.Takeover, kind handOverKind) takeover.Intake {
	in := t.Intake()
	if in == nil || (kind == exitKept && g.opts.Process.StoreFDs == nil) {
		return nil
	}
	return in
}

// commitHandOver marks the hand-over committed, unless a shutdown began first (false: the
// hand-over yields to it). From here every control operation and the stop signals are refused.
func (g *Gateway) commitHandOver() bool {
	g.stopMu.Lock()
	defer g.stopMu.Unlock()
	g.endOpLocked()
	if g.phase != serving {
		return false
	}
	g.phase = handedOver
	return true
}

// undoHandOver puts a gateway whose hand-over failed (err) back to serving: the gate open (its
// dirty mark is recorded again before the next write goes through), the lifecycle where it
// belongs unless a shutdown drives it now. It returns the control error to answer with.
func (g *Gateway) undoHandOver(t *takeover.Takeover, kind handOverKind, err error) error {
	t.Gate().Reopen()
	if in := t.Intake(); in != nil {
		in.ResumeIntake() // after the gate: what the readers take next must pass it
	}
	g.stopMu.Lock()
	g.endOpLocked()
	if g.phase == serving {
		g.resumeLocked(kind.String() + " failed: " + err.Error())
	}
	g.stopMu.Unlock()
	g.log.Error(kind.String()+" failed: the gateway keeps serving", zap.Error(err))
	if errors.Is(err, context.DeadlineExceeded) {
		return &control.Error{Code: control.CodeTimeout, Message: kind.String() + " timed out, the gateway keeps serving: " + err.Error()}
	}
	return &control.Error{Code: control.CodeFailed, Message: kind.String() + " failed, the gateway keeps serving with its data: " + err.Error()}
}

// dirtyBytes is what dev holds unwritten (0 when it cannot say: no cache).
func dirtyBytes(dev block.Device) int64 {
	if dr, ok := dev.(block.DirtyReporter); ok {
		return max(dr.DirtyBytes(), 0)
	}
	return 0
}

// withEnv is env with entry ("NAME=VALUE") in place of any entry of that name.
func withEnv(env []string, entry string) []string {
	name, _, _ := strings.Cut(entry, "=")
	out := make([]string, 0, len(env)+1)
	for _, e := range env {
		if !strings.HasPrefix(e, name+"=") {
			out = append(out, e)
		}
	}
	return append(out, entry)
}
