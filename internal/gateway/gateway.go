package gateway

import (
	"context"
	"os"
	"os/signal"
	"sync"
	"syscall"

	"go.uber.org/zap"

	"github.com/iser-blk/iser-blk/block"
	"github.com/iser-blk/iser-blk/internal/control"
	"github.com/iser-blk/iser-blk/internal/lifecycle"
	"github.com/iser-blk/iser-blk/internal/sdnotify"
	"github.com/iser-blk/iser-blk/internal/service"
	"github.com/iser-blk/iser-blk/internal/status"
	"github.com/iser-blk/iser-blk/internal/takeover"
)

// Exit codes a gateway returns (cmd/iser-blk's table).
const (
	ExitOK      = 0
	ExitFailure = 1
)

// Options configure Start. Service's Detach, Restart and Stop are the gateway's own.
type Options struct {
	Service service.Options
	// Counters are the frontend's I/O counters, read by status and metrics.
	Counters *status.IOCounters
	// StopFrontend ends the context the frontend serves under: a committed detach and a stop
	// signal call it.
	StopFrontend context.CancelFunc
	Log          *zap.Logger
	// Process is how a hand-over ends the process image (zero: the real process).
	Process Process
}

// Process is what a committed hand-over does to the process. Tests replace it.
type Process struct {
	// Executable is the binary a restart re-executes (Executable(os.Args[0]) when empty) and
	// ExecutableErr why it could not be found.
	Executable    string
	ExecutableErr error
	// Exec replaces the process image with path, os.Args and env (default: syscall.Exec); it
	// returns only on failure.
	Exec func(path string, env []string) error
	// Exit ends the process (default: os.Exit).
	Exit func(code int)
	// IgnoreStopSignals keeps SIGINT and SIGTERM from reaching the process from a hand-over's
	// commit on (default: signal.Ignore; the new image installs its own handlers).
	IgnoreStopSignals func()
	// StoreFDs gives descriptors to the supervisor's store under name, for the successor a
	// stop --keep leaves the device to (default: systemd's, sdnotify.FDStore, when the process
	// runs under a unit that may have one; nil: no store, the connections end with the process).
	StoreFDs func(name string, fds []int) error
}

func (p *Process) defaults() {
	if p.Executable == "" && p.ExecutableErr == nil {
		p.Executable, p.ExecutableErr = Executable(os.Args[0])
	}
	if p.Exec == nil {
		p.Exec = func(path string, env []string) error { return syscall.Exec(path, os.Args, env) }
	}
	if p.Exit == nil {
		p.Exit = os.Exit
	}
	if p.IgnoreStopSignals == nil {
		p.IgnoreStopSignals = func() { signal.Ignore(os.Interrupt, syscall.SIGTERM) }
	}
	if p.StoreFDs == nil && (sdnotify.FDStore{}).Available() {
		p.StoreFDs = sdnotify.FDStore{}.Store
	}
}

// Gateway is one serving process's lifecycle.
//
// Lock order: flushMu, then stopMu, then mu. flushMu is held for a whole write-back (a detach's,
// a hand-over's, the final flush); stopMu and mu only for bookkeeping.
type Gateway struct {
	svc     *service.Service
	log     *zap.Logger
	opts    Options
	outcome chan int // the final flush's exit code, for a committed detach
	// handOverEnded is closed when a committed hand-over's last step returned (only a failed
	// exec, or a replaced Exit in tests, returns).
	handOverEnded chan struct{}

	flushMu sync.Mutex // one write-back at a time

	stopMu sync.Mutex // guards the four below
	// phase is where the way out stands: serving, handedOver (a restart or stop --keep
	// committed: the process ends through it) or shuttingDown (control operations refused).
	phase phase
	// cancelOp cancels the running control operation's write-back (nil: none), for the shutdown.
	cancelOp context.CancelFunc
	// detachWaits is set when a committed detach waits for the final flush's outcome.
	detachWaits bool
	// pathFailure is why the backend cannot serve ("" while it can), as it reported it: only
	// that failure is undone when a path returns.
	pathFailure string

	mu         sync.Mutex // guards the three below: set by the command, read by control operations
	dev        block.Device
	kernelPath string             // the block device a detach checks for holders ("" for serve)
	handOver   *takeover.Takeover // nil: no restart or stop --keep (no attach --name)
}

type phase int

const (
	serving phase = iota
	handedOver
	shuttingDown
)

// Start claims the name and starts the service. The command then builds its stack and
// frontend, calls Serving, and Ready once the device or socket accepts I/O.
func Start(opts Options) (*Gateway, error) {
	if opts.Log == nil {
		opts.Log = zap.NewNop()
	}
	if opts.StopFrontend == nil {
		opts.StopFrontend = func() {}
	}
	opts.Process.defaults()
	g := &Gateway{log: opts.Log, opts: opts, outcome: make(chan int, 1), handOverEnded: make(chan struct{})}
	so := opts.Service
	so.Detach, so.Restart, so.Stop, so.Log = g.Detach, g.Restart, g.Stop, opts.Log
	svc, err := service.Start(so)
	if err != nil {
		return nil, err
	}
	g.svc = svc
	if opts.Counters != nil {
		svc.Status.SetIO(opts.Counters)
	}
	opts.Log.Info("gateway", zap.String("name", so.Identity.Name),
		zap.String("control", control.SocketPath(control.RunDir(so.RunDir), so.Identity.Name)))
	return g, nil
}

// Service is the gateway's service: its lifecycle and status registry.
func (g *Gateway) Service() *service.Service { return g.svc }

// State is the lifecycle's state and reason.
func (g *Gateway) State() (lifecycle.State, string) { return g.svc.Lifecycle.State() }

// Serving registers the device stack and the frontend once they exist. kernelPath is the block
// device a detach checks for holders ("" for serve).
func (g *Gateway) Serving(dev block.Device, kernelPath string, fe status.Frontend) {
	g.mu.Lock()
	g.dev, g.kernelPath = dev, kernelPath
	g.mu.Unlock()
	if kernelPath != "" {
		g.svc.Status.SetFrontendPath(kernelPath)
	}
	registerStatus(g.svc.Status, dev)
	if w, ok := below(dev).(availabilityWatcher); ok {
		w.WatchAvailability(g.availabilityChanged)
	}
	g.svc.Status.SetFrontend(frontendInfo(fe))
}

// registerStatus hands each layer of the stack that reports status to the registry: the cache
// and, below it, the backend's paths and LUN.
func registerStatus(reg *status.Registry, dev block.Device) {
	if c, ok := dev.(status.CacheProvider); ok {
		reg.SetCache(c)
	}
	backend := below(dev)
	if p, ok := backend.(status.PathsProvider); ok {
		reg.SetPaths(p)
	}
	if l, ok := backend.(status.LUNProvider); ok {
		reg.SetLUN(l)
	}
}

// below is the device under dev's layers (block.Layered), dev itself when it has none.
func below(dev block.Device) block.Device {
	for {
		l, ok := dev.(block.Layered)
		if !ok {
			return dev
		}
		dev = l.Below()
	}
}

// availabilityWatcher is a backend that reports when it can no longer serve (every path down
// past the replacement timeout: I/O fails) and when it serves again (backend/iser).
type availabilityWatcher interface {
	WatchAvailability(func(serving bool, reason string))
}

// availabilityChanged moves a ready gateway to failed while its backend cannot serve, and back
// to ready when it can; a gateway stopping, or failed for another reason, is left alone.
func (g *Gateway) availabilityChanged(serving bool, reason string) {
	g.stopMu.Lock()
	defer g.stopMu.Unlock()
	lm := g.svc.Lifecycle
	if !serving {
		g.pathFailure = reason // kept even if not moved now: a failed write-back returns here
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

// Ready moves the lifecycle to ready: the device or socket accepts I/O (sd_notify READY=1).
func (g *Gateway) Ready() { g.to(lifecycle.Ready, "") }

// Recovering says the device a previous gateway left is being taken over.
func (g *Gateway) Recovering(why string) { g.to(lifecycle.Recovering, why) }

// Fenced says every I/O fails, and why.
func (g *Gateway) Fenced(why string) { g.to(lifecycle.Failed, status.FencedReason+why) }

// to moves the lifecycle; a refused move is a defect in this package's sequencing (or a
// shutdown that overtook it) and is logged as an error.
func (g *Gateway) to(s lifecycle.State, reason string) {
	if err := g.svc.Lifecycle.To(s, reason); err != nil {
		g.log.Error("lifecycle transition refused", zap.Error(err), zap.String("reason", reason))
	}
}

// commitTo moves the lifecycle and commits the shutdown (STOPPING=1).
func (g *Gateway) commitTo(s lifecycle.State, reason string) {
	if err := g.svc.Lifecycle.CommitTo(s, reason); err != nil {
		g.log.Error("lifecycle transition refused", zap.Error(err), zap.String("reason", reason))
	}
}

// CanHandOver makes the gateway restartable and stoppable with --keep: t is attach --name's
// takeover, whose gate stands in front of the served device and whose state file the successor
// reads. It reports false, and changes nothing, once a shutdown began (a stop signal that came
// first keeps a hand-over from ever starting).
func (g *Gateway) CanHandOver(t *takeover.Takeover) bool {
	g.stopMu.Lock()
	defer g.stopMu.Unlock()
	if g.phase != serving {
		return false
	}
	g.mu.Lock()
	g.handOver = t
	g.mu.Unlock()
	return true
}

// Adopt makes dev the gateway's device if none was announced yet, so that Shutdown closes
// what the command opened even when it failed before the kernel device existed.
func (g *Gateway) Adopt(dev block.Device) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.dev == nil {
		g.dev = dev
	}
}

// device is the device the gateway serves, nil until it is announced (or adopted).
func (g *Gateway) device() block.Device {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.dev
}

// Abandon gives the name up when the command fails before it serves.
func (g *Gateway) Abandon() {
	g.to(lifecycle.Stopped, "failed to start")
	if err := g.svc.Close(); err != nil {
		g.log.Warn("closing the service", zap.Error(err))
	}
}
