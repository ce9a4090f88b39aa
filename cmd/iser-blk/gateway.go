package main

// The operations side of serve and attach (issue 16): the gateway's name, its control socket,
// lifecycle, status registry and metrics (internal/service), and the detach that the control
// socket asks for. A detach ends the serving context exactly as SIGTERM does, so both run the one
// shutdown path (stop the frontend, drain, closeDevice's final flush, log out); the detach only
// adds what an operator asking for it needs first: the holder check and a write-back while I/O
// still flows, so that a target that cannot take the data refuses the detach with the gateway
// still serving and every dirty byte still in the cache.
//
// A detach and a shutdown never flush at once: a detach that arrives once the shutdown began is
// refused ("already stopping"); a SIGTERM during a detach's write-back cancels that write-back
// and the shutdown's final flush takes over, answering the detach with its outcome.

import (
	"context"
	"flag"
	"fmt"
	"os"
	"strings"
	"sync"

	"go.uber.org/zap"

	"github.com/iser-blk/iser-blk/backend/iser"
	"github.com/iser-blk/iser-blk/block"
	"github.com/iser-blk/iser-blk/cache"
	"github.com/iser-blk/iser-blk/internal/control"
	"github.com/iser-blk/iser-blk/internal/holders"
	"github.com/iser-blk/iser-blk/internal/lifecycle"
	"github.com/iser-blk/iser-blk/internal/service"
	"github.com/iser-blk/iser-blk/internal/status"
)

// serviceFlags are --name, --run-dir and --metrics-listen, shared by serve and attach.
type serviceFlags struct {
	name, runDir, metricsListen string
}

func (sf *serviceFlags) register(fs *flag.FlagSet, nameDefault string) {
	fs.StringVar(&sf.name, "name", "", "the gateway's name, unique on the host (default: "+nameDefault+")")
	fs.StringVar(&sf.runDir, "run-dir", "", "directory of the control sockets (default: $"+control.RunDirEnv+" or "+control.DefaultRunDir+")")
	fs.StringVar(&sf.metricsListen, "metrics-listen", "", "serve Prometheus /metrics on this HOST:PORT (default: off)")
}

// gateway is a serving command's service plus its detach.
type gateway struct {
	svc *service.Service
	log *zap.Logger
	mu  sync.Mutex // guards dev and kernelPath: set by the command, read by a detach
	dev block.Device
	// kernelPath is the block device a detach checks for holders ("" for serve: no kernel device).
	kernelPath string
	// stop ends the serving context: the frontend stops as on SIGTERM.
	stop context.CancelFunc
	// outcome carries closeDevice's exit code from the command to the waiting detach.
	outcome chan int
	// counters is the frontend's per-operation I/O counters, read by status and metrics.
	counters *status.IOCounters
	// flushMu is held by a detach's write-back and the shutdown's final flush: never both.
	flushMu sync.Mutex

	stopMu    sync.Mutex         // guards the four below
	stopping  bool               // the shutdown began: a new detach is refused
	committed bool               // a planned restart is committed: the re-exec owns the process
	detachOn  bool               // a detach is running; the shutdown hands it the outcome
	abortWB   context.CancelFunc // cancels the running detach's write-back or restart's hand-over (nil: none)
	// pathFailure is why the backend cannot serve ("" while it can), as it reported it; the
	// gateway is failed with this reason while ready otherwise, and only that failure is undone
	// when a path returns.
	pathFailure string
	// restartable is attach --name's takeover, what a planned restart hands over (nil: none).
	restartable *takeover
	// flushed runs once the shutdown's final flush succeeded, before the name is released (nil:
	// nothing): attach --name records that a device left behind holds nothing unwritten.
	flushed func()
}

// startGateway claims the name and starts the service. counters are the frontend's I/O
// counters, which status and metrics read: the command creates them once and hands the same
// ones to its frontend. stop ends the context the command serves under: a detach calls it. The
// command then builds its stack and frontend, calls serving, and ready once the device or
// socket accepts I/O.
func startGateway(sf *serviceFlags, id status.Identity, counters *status.IOCounters, stop context.CancelFunc, log *zap.Logger) (*gateway, error) {
	if sf.name != "" {
		id.Name, id.Device = sf.name, sf.name
	}
	id.BuildVersion = buildVersion()
	g := &gateway{log: log, stop: stop, outcome: make(chan int, 1), counters: counters}
	svc, err := service.Start(service.Options{RunDir: sf.runDir, Identity: id, MetricsListen: sf.metricsListen, Detach: g.detach, Restart: g.restart, Log: log})
	if err != nil {
		return nil, err
	}
	g.svc = svc
	svc.Status.SetIO(g.counters)
	log.Info("gateway", zap.String("name", id.Name), zap.String("control", control.SocketPath(control.RunDir(sf.runDir), id.Name)))
	return g, nil
}

// serving registers the device stack and the frontend once they exist. kernelPath is the block
// device a detach checks for holders ("" for serve).
func (g *gateway) serving(dev block.Device, kernelPath string, fe status.Frontend) {
	g.mu.Lock()
	g.dev, g.kernelPath = dev, kernelPath
	g.mu.Unlock()
	backend := dev
	if c, ok := dev.(*cache.Cache); ok {
		g.svc.Status.SetCache(c)
		backend = c.Backend()
	}
	if p, ok := backend.(status.PathsProvider); ok {
		g.svc.Status.SetPaths(p)
	}
	if l, ok := backend.(status.LUNProvider); ok {
		g.svc.Status.SetLUN(l)
	}
	if w, ok := backend.(availabilityWatcher); ok {
		w.WatchAvailability(g.availabilityChanged)
	}
	g.svc.Status.SetFrontend(frontendInfo(fe))
}

// availabilityWatcher is a backend that reports when it can no longer serve (every path down
// past the replacement timeout: I/O fails) and when it serves again (backend/iser).
type availabilityWatcher interface {
	WatchAvailability(func(serving bool, reason string))
}

// availabilityChanged moves a ready gateway to failed while its backend cannot serve, and back
// to ready when it can; a gateway stopping, or failed for another reason, is left alone.
func (g *gateway) availabilityChanged(serving bool, reason string) {
	g.stopMu.Lock()
	defer g.stopMu.Unlock()
	lm := g.svc.Lifecycle
	if !serving {
		g.pathFailure = reason // kept even if not moved now: a failed detach's write-back returns here
		moved, _ := lm.ToIf(func(s lifecycle.State, _ string) bool { return s == lifecycle.Ready }, lifecycle.Failed, reason)
		if moved {
			g.log.Error("the device cannot serve: I/O fails until a path to the target is back", zap.String("reason", reason))
		}
		return
	}
	failure := g.pathFailure
	g.pathFailure = ""
	if failure == "" {
		return
	}
	moved, _ := lm.ToIf(func(s lifecycle.State, r string) bool { return s == lifecycle.Failed && r == failure },
		lifecycle.Ready, "a path to the target is back")
	if moved {
		g.log.Info("the device serves again: a path to the target is back")
	}
}

// frontendInfo is a frontend's fixed shape (kind, queues, depth) as a status provider.
type frontendInfo status.Frontend

func (f frontendInfo) FrontendStatus() status.Frontend { return status.Frontend(f) }

// abandon gives the name up when the command fails before it serves.
func (g *gateway) abandon() {
	g.to(lifecycle.Stopped, "failed to start")
	if err := g.svc.Close(); err != nil {
		g.log.Warn("closing the service", zap.Error(err))
	}
}

// ready moves the lifecycle to ready: the device or socket accepts I/O (sd_notify READY=1).
func (g *gateway) ready() { g.to(lifecycle.Ready, "") }

func (g *gateway) to(s lifecycle.State, reason string) {
	if err := g.svc.Lifecycle.To(s, reason); err != nil {
		g.log.Debug("lifecycle", zap.Error(err))
	}
}

// shutdown runs the final flush and close of dev (closeDevice) under the lifecycle, hands the
// outcome to a running detach, and closes the service (which lets that detach's client read its
// answer first). code is the exit code so far.
func (g *gateway) shutdown(code int) int {
	g.beginShutdown()
	g.to(lifecycle.Draining, "shutting down")
	g.to(lifecycle.Flushing, "")
	g.flushMu.Lock()
	c := closeDeviceReporting(g.device(), g.log, g.svc.Lifecycle)
	g.flushMu.Unlock()
	if c != exitOK {
		code = c
		g.to(lifecycle.Failed, "final flush failed")
	} else if g.flushed != nil {
		g.flushed()
	}
	g.to(lifecycle.Stopped, "")
	g.stopMu.Lock()
	if g.detachOn {
		g.outcome <- c
	}
	g.stopMu.Unlock()
	if err := g.svc.Close(); err != nil {
		g.log.Warn("closing the service", zap.Error(err))
	}
	return code
}

// beginShutdown marks the gateway stopping (a new detach or restart is refused) and cancels a
// running detach's write-back or restart's hand-over: the final flush takes over. It does
// nothing and reports true when a planned restart is committed: the re-exec owns the process.
func (g *gateway) beginShutdown() (restartCommitted bool) {
	g.stopMu.Lock()
	defer g.stopMu.Unlock()
	if g.committed {
		return true
	}
	g.stopping = true
	if g.abortWB != nil {
		g.abortWB()
	}
	return false
}

// stopForSignal is what SIGINT or SIGTERM does to a restartable gateway: the shutdown begins
// (a restart's hand-over or a detach's write-back is cancelled, a new one refused), the flush
// that was running gives up, and only then the frontend stops. Stopping the frontend first
// would tear the kernel device down (NBD disconnect, parked ublk requests failed) while a
// restart could still commit and re-execute. A restart already committed owns the process: the
// signal changes nothing (the restart ignores the two signals from its commit on).
func (g *gateway) stopForSignal() {
	if g.beginShutdown() {
		g.log.Info("stop signal during a committed restart: ignored, the new image takes over")
		return
	}
	// flushMu is held by a restart's hand-over or a detach's write-back until it gives up.
	g.flushMu.Lock()
	g.stop()
	g.flushMu.Unlock()
}

// detach is the control socket's detach (service.DetachFunc).
func (g *gateway) detach(ctx context.Context, req control.Request) (control.DetachResult, error) {
	if err := g.checkHolders(req.Force); err != nil {
		return control.DetachResult{}, err
	}
	dev := g.device()
	if dev == nil {
		return control.DetachResult{}, &control.Error{Code: control.CodeFailed,
			Message: "the gateway is still starting: it serves no device yet"}
	}
	before := writtenBack(dev)
	wbCtx, err := g.beginDetach(ctx)
	if err != nil {
		return control.DetachResult{}, err
	}
	g.to(lifecycle.Draining, "detach requested")
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
		if code != exitOK {
			return control.DetachResult{}, &control.Error{Code: control.CodeFailed, Message: "the final flush failed: see the gateway's log"}
		}
	case <-ctx.Done():
		return control.DetachResult{}, ctx.Err()
	}
	return control.DetachResult{PID: os.Getpid(), WrittenBackBytes: writtenBack(dev) - before}, nil
}

// busyWritingBack refuses a detach or restart while another one writes back: each registers
// its cancel (abortWB) for the shutdown to call, and a second would take the first one's place.
var busyWritingBack = &control.Error{Code: control.CodeBusy, Message: "a detach or restart is already writing back; try again once it has ended"}

// beginDetach registers a detach, refusing it once the shutdown began or while another detach or
// a restart writes back, and returns the context its write-back runs under: ctx, also cancelled
// if a shutdown begins meanwhile.
func (g *gateway) beginDetach(ctx context.Context) (context.Context, error) {
	g.stopMu.Lock()
	defer g.stopMu.Unlock()
	if g.stopping {
		return nil, &control.Error{Code: control.CodeBusy, Message: "the gateway is already stopping (a signal began its shutdown); it exits once its final flush is done"}
	}
	if g.abortWB != nil { // its cancel is what a signal uses to stop that one: it must stay its own
		return nil, busyWritingBack
	}
	g.detachOn = true
	ctx, g.abortWB = context.WithCancel(ctx)
	return ctx, nil
}

// commitDetach ends the detach's write-back, whose error is err. On success, or when a shutdown
// began meanwhile (its final flush then writes back and answers the detach), it stops the
// serving context and returns true: the detach waits for the outcome. A failed write-back
// otherwise returns the gateway to ready, its data kept, and false.
func (g *gateway) commitDetach(err error) bool {
	g.stopMu.Lock()
	defer g.stopMu.Unlock()
	g.abortWB()
	g.abortWB = nil
	if g.stopping {
		return true
	}
	if err != nil {
		g.detachOn = false
		g.resumeLocked("write-back before detach failed: " + err.Error())
		return false
	}
	g.stop()
	return true
}

// resumeLocked returns a gateway whose detach or restart failed (why) to serving: failed while
// its backend has no path (it failed for want of one) or its device is fenced, ready otherwise.
// The caller holds stopMu.
func (g *gateway) resumeLocked(why string) {
	g.mu.Lock()
	fenced := g.restartable.fenceReason()
	g.mu.Unlock()
	switch {
	case g.pathFailure != "":
		g.to(lifecycle.Failed, g.pathFailure)
	case fenced != "":
		g.to(lifecycle.Failed, "device fenced: "+fenced)
	default:
		g.to(lifecycle.Ready, why)
	}
}

// checkHolders refuses to detach a kernel device that is mounted or held open, unless forced.
func (g *gateway) checkHolders(force bool) error {
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

// writtenBack is the cache's write-back byte counter (0 without a cache).
func writtenBack(dev block.Device) uint64 {
	if c, ok := dev.(*cache.Cache); ok {
		return c.Stats().WriteBackBytes
	}
	return 0
}

// identity is what a gateway serving target through frontend kind at path reports.
func identity(name, kind, path string, ef *exportFlags) status.Identity {
	targets := []string{iser.RedactURL(ef.target)}
	for _, t := range ef.alternates {
		targets = append(targets, iser.RedactURL(t))
	}
	mode := ef.cache.mode
	return status.Identity{Name: name, Device: name, FrontendKind: kind, FrontendPath: path, Targets: targets, CacheMode: mode}
}

// device is the device the gateway serves, nil until it is announced (or adopted). The control
// goroutine (detach) reads it while the main one sets it.
func (g *gateway) device() block.Device {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.dev
}

// adopt makes dev the gateway's device if no device was announced yet, so that shutdown closes
// what openStack opened even when attach failed before the kernel device existed.
func (g *gateway) adopt(dev block.Device) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.dev == nil {
		g.dev = dev
	}
}
