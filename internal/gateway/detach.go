package gateway

import (
	"context"
	"fmt"
	"os"
	"strings"

	"github.com/iser-blk/iser-blk/block"
	"github.com/iser-blk/iser-blk/internal/control"
	"github.com/iser-blk/iser-blk/internal/holders"
	"github.com/iser-blk/iser-blk/internal/lifecycle"
	"github.com/iser-blk/iser-blk/internal/status"
)

// Detach is the control socket's detach (service.DetachFunc). It adds to the shutdown what an
// operator asking for it needs first: the holder check, and a write-back while I/O still flows,
// so that a target that cannot take the data refuses the detach with the gateway still serving
// and every dirty byte still in the cache. On success it commits the shutdown, stops the
// frontend and answers with the final flush's outcome.
func (g *Gateway) Detach(ctx context.Context, req control.Request) (control.DetachResult, error) {
	if err := g.checkHolders(req.Force); err != nil {
		return control.DetachResult{}, err
	}
	dev := g.device()
	if dev == nil {
		return control.DetachResult{}, &control.Error{Code: control.CodeFailed,
			Message: "the gateway is still starting: it serves no device yet"}
	}
	before := writtenBack(dev)
	wbCtx, err := g.beginOp(ctx, true)
	if err != nil {
		return control.DetachResult{}, err
	}
	g.to(lifecycle.Flushing, "write-back before detach")
	g.flushMu.Lock()
	if err = wbCtx.Err(); err == nil { // else a shutdown began: its final flush writes back
		err = flushWithProgress(wbCtx, dev, g.log, g.svc.Lifecycle)
	}
	g.flushMu.Unlock()
	if !g.commitDetach(err) {
		return control.DetachResult{}, &control.Error{Code: control.CodeFailed,
			Message: fmt.Sprintf("write-back failed, the gateway keeps serving with its data: %v", err)}
	}
	select {
	case code := <-g.outcome:
		if code != ExitOK {
			return control.DetachResult{}, &control.Error{Code: control.CodeFailed, Message: "the final flush failed: see the gateway's log"}
		}
	case <-ctx.Done():
		return control.DetachResult{}, ctx.Err()
	}
	return control.DetachResult{PID: os.Getpid(), WrittenBackBytes: writtenBack(dev) - before}, nil
}

// beginOp registers a control operation's write-back, refusing it once the shutdown began or a
// hand-over committed, and returns the context it runs under: ctx, also cancelled if a shutdown
// begins meanwhile. A detach is marked as waiting for the shutdown's outcome from here on, so a
// shutdown that overtakes it answers it however the two interleave; commitDetach unmarks a
// detach that failed. Control operations come one at a time (internal/control's exclusive lock).
func (g *Gateway) beginOp(ctx context.Context, detach bool) (context.Context, error) {
	g.stopMu.Lock()
	defer g.stopMu.Unlock()
	if err := g.endingLocked(); err != nil {
		return nil, err
	}
	ctx, g.cancelOp = context.WithCancel(ctx)
	g.detachWaits = detach
	return ctx, nil
}

// endingLocked is the refusal of a control operation once the gateway is on its way out (nil
// while it serves). The caller holds stopMu.
func (g *Gateway) endingLocked() error {
	switch g.phase {
	case shuttingDown:
		return &control.Error{Code: control.CodeBusy, Message: "the gateway is already stopping; it exits once its final flush is done"}
	case handedOver:
		return &control.Error{Code: control.CodeBusy, Message: "the gateway has handed its device over and is ending"}
	}
	return nil
}

// endOp releases the operation's context.
func (g *Gateway) endOpLocked() {
	if g.cancelOp != nil {
		g.cancelOp()
		g.cancelOp = nil
	}
}

// commitDetach ends the detach's write-back, whose error is err. On success, or when a shutdown
// began meanwhile (its final flush then writes back and answers the detach), the detach waits
// for the outcome: true. On success the shutdown is committed and the frontend stopped. A failed
// write-back otherwise returns the gateway to serving, its data kept, and false.
func (g *Gateway) commitDetach(err error) bool {
	g.stopMu.Lock()
	defer g.stopMu.Unlock()
	g.endOpLocked()
	if g.phase == shuttingDown {
		return true
	}
	if err != nil {
		g.detachWaits = false
		g.resumeLocked("write-back before detach failed: " + err.Error())
		return false
	}
	g.phase = shuttingDown
	g.commitTo(lifecycle.Draining, "detach: removing the device")
	g.opts.StopFrontend()
	return true
}

// resumeLocked returns a gateway whose detach or hand-over failed (why) to serving: failed while
// its backend has no path (it failed for want of one) or its device is fenced, ready otherwise.
// The caller holds stopMu.
func (g *Gateway) resumeLocked(why string) {
	g.mu.Lock()
	fenced := g.handOver.FenceReason()
	g.mu.Unlock()
	switch {
	case g.pathFailure != "":
		g.to(lifecycle.Failed, g.pathFailure)
	case fenced != "":
		g.to(lifecycle.Failed, status.FencedReason+fenced)
	default:
		g.to(lifecycle.Ready, why)
	}
}

// checkHolders refuses to detach a kernel device that is mounted or held open, unless forced.
func (g *Gateway) checkHolders(force bool) error {
	g.mu.Lock()
	path := g.kernelPath
	g.mu.Unlock()
	if path == "" || force {
		return nil
	}
	hs, err := holders.Find(path)
	if err != nil {
		return control.Refused("cannot tell who holds %s (%v); use --force to detach anyway", path, err)
	}
	if len(hs) == 0 {
		return nil
	}
	what := make([]string, len(hs))
	for i, h := range hs {
		what[i] = h.String()
	}
	return control.Refused("%s is in use: %s; unmount or close it, or use --force", path, strings.Join(what, "; "))
}

// writtenBack counts the bytes the cache wrote back to the target (0 without a cache): with a
// cache device (--cache-dev) the log's write-back, since the RAM cache then writes through into
// the log, not to the target.
func writtenBack(dev block.Device) uint64 {
	c, ok := dev.(status.CacheProvider)
	if !ok {
		return 0
	}
	s := c.CacheStatus()
	if s.Device != nil {
		return s.Device.WrittenBackBytes
	}
	return s.WrittenBackBytes
}
