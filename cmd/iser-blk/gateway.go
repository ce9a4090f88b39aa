package main

// The operations side of serve and attach (issue 16): the gateway's name, its control socket,
// lifecycle, status registry and metrics (internal/service), and the detach that the control
// socket asks for. A detach ends the serving context exactly as SIGTERM does, so both run the one
// shutdown path (stop the frontend, drain, closeDevice's final flush, log out); the detach only
// adds what an operator asking for it needs first: the holder check and a write-back while I/O
// still flows, so that a target that cannot take the data refuses the detach with the gateway
// still serving and every dirty byte still in the cache.

import (
	"context"
	"flag"
	"fmt"
	"os"
	"strings"
	"sync"
	"time"

	"go.uber.org/zap"

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

// detachWait bounds how long the gateway waits, after its final flush, for the control server
// to hand the detach's reply to the client before it exits anyway.
const detachWait = 10 * time.Second

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
	outcome   chan int
	detaching chan struct{} // closed once a detach has stopped the frontend
	// counters is the frontend's per-operation I/O counters, read by status and metrics.
	counters *status.IOCounters
	// restartable is attach --name's takeover, what a planned restart hands over (nil: none).
	restartable *takeover
}

// startGateway claims the name and starts the service. stop ends the context the command serves
// under: a detach calls it. The command then builds its stack and frontend, calls serving, and
// ready once the device or socket accepts I/O.
func startGateway(sf *serviceFlags, id status.Identity, stop context.CancelFunc, log *zap.Logger) (*gateway, error) {
	if sf.name != "" {
		id.Name, id.Device = sf.name, sf.name
	}
	id.BuildVersion = buildVersion()
	g := &gateway{log: log, stop: stop, outcome: make(chan int, 1), detaching: make(chan struct{}),
		counters: new(status.IOCounters)}
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
	g.svc.Status.SetFrontend(frontendInfo(fe))
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
// outcome to a waiting detach, and closes the service. code is the exit code so far.
func (g *gateway) shutdown(code int) int {
	g.to(lifecycle.Draining, "shutting down")
	g.to(lifecycle.Flushing, "")
	c := closeDeviceReporting(g.device(), g.log, g.svc.Lifecycle)
	if c != exitOK {
		code = c
		g.to(lifecycle.Failed, "final flush failed")
	}
	g.to(lifecycle.Stopped, "")
	select {
	case <-g.detaching:
		g.outcome <- c
		select { // let the control server answer the client before the socket closes
		case <-g.svc.Detached():
		case <-time.After(detachWait):
		}
	default:
	}
	if err := g.svc.Close(); err != nil {
		g.log.Warn("closing the service", zap.Error(err))
	}
	return code
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
	g.to(lifecycle.Draining, "detach requested")
	g.to(lifecycle.Flushing, "write-back before detach")
	if err := flushWithProgress(ctx, dev, g.log, g.svc.Lifecycle); err != nil {
		g.to(lifecycle.Ready, "write-back before detach failed: "+err.Error())
		return control.DetachResult{}, &control.Error{Code: control.CodeFailed,
			Message: fmt.Sprintf("write-back failed, the gateway keeps serving with its data: %v", err)}
	}
	close(g.detaching)
	g.stop()
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
	targets := []string{status.RedactTarget(ef.target)}
	for _, t := range ef.alternates {
		targets = append(targets, status.RedactTarget(t))
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
