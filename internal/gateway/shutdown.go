package gateway

import (
	"go.uber.org/zap"

	"github.com/iser-blk/iser-blk/internal/lifecycle"
)

// Shutdown runs the final flush and close of the device under the lifecycle, records a kept
// device's state clean when the flush succeeded, hands the outcome to a committed detach, and
// closes the service (which lets that detach's client read its answer first). code is the exit
// code so far; the result is the process's. After a committed hand-over it never flushes
// (the stack is closed already) and does not return while the process ends through the
// hand-over: the re-exec or exit owns the process, and the name stays claimed until then.
func (g *Gateway) Shutdown(code int, flushed func()) int {
	if !g.beginShutdown() {
		<-g.handOverEnded
		return code
	}
	g.commitTo(lifecycle.Draining, "shutting down")
	g.to(lifecycle.Flushing, "final flush")
	g.flushMu.Lock()
	c := CloseDevice(g.device(), g.log, g.svc.Lifecycle)
	g.flushMu.Unlock()
	if c != ExitOK {
		code = c
		g.to(lifecycle.Failed, "final flush failed")
	} else if flushed != nil {
		flushed()
	}
	g.to(lifecycle.Stopped, "")
	g.stopMu.Lock()
	if g.detachWaits {
		g.outcome <- c
	}
	g.stopMu.Unlock()
	g.closeService()
	return code
}

func (g *Gateway) closeService() {
	if err := g.svc.Close(); err != nil {
		g.log.Warn("closing the service", zap.Error(err))
	}
}

// beginShutdown marks the gateway shutting down (a new control operation is refused) and
// cancels a running detach's write-back or hand-over: the final flush takes over. It reports
// false, changing nothing, when a hand-over committed: the process ends through it.
func (g *Gateway) beginShutdown() bool {
	g.stopMu.Lock()
	defer g.stopMu.Unlock()
	if g.phase == handedOver {
		return false
	}
	g.phase = shuttingDown
	if g.cancelOp != nil {
		g.cancelOp()
	}
	return true
}

// StopForSignal is what SIGINT or SIGTERM does: the shutdown begins (a hand-over or a detach's
// write-back is cancelled, a new one refused), the write-back that was running gives up, and
// only then the frontend stops. Stopping the frontend first would tear the kernel device down
// (NBD disconnect, parked ublk requests failed) while a restart could still commit and
// re-execute. After a hand-over committed the signal changes nothing.
func (g *Gateway) StopForSignal() {
	if !g.beginShutdown() {
		g.log.Info("stop signal after a hand-over committed: ignored, the device is handed over")
		return
	}
	// flushMu is held by a hand-over or a detach's write-back until it gives up.
	g.flushMu.Lock()
	g.opts.StopFrontend()
	g.flushMu.Unlock()
}
