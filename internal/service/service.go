// Package service is the operations side of one running gateway, assembled: the claimed name,
// the lifecycle, the status registry, the control socket, sd_notify and the optional metrics
// server. `serve` and `attach` call Start once their flags are parsed, register each layer's
// status provider as the layer comes up, drive the lifecycle, and Close on exit. Like the
// packages it assembles it knows nothing of NBD, ublk or iSCSI.
//
// Invariants: Start either returns a Service holding every part or nothing (no name left
// claimed, no socket left bound); Close releases in reverse order and removes the run files.
package service

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"go.uber.org/zap"

	"github.com/iser-blk/iser-blk/internal/control"
	"github.com/iser-blk/iser-blk/internal/lifecycle"
	"github.com/iser-blk/iser-blk/internal/metrics"
	"github.com/iser-blk/iser-blk/internal/sdnotify"
	"github.com/iser-blk/iser-blk/internal/status"
)

// RestartFunc is the gateway's planned restart (see control.Restarter).
type RestartFunc func(ctx context.Context, req control.Request) (reexec func() error, err error)

// StopFunc is the gateway's stop that keeps its device (see control.Stopper).
type StopFunc func(ctx context.Context, req control.Request) (exit func() error, err error)

// DetachFunc is the gateway's detach (see control.Handler.Detach).
type DetachFunc func(ctx context.Context, req control.Request) (control.DetachResult, error)

// Options configure Start.
type Options struct {
	// RunDir is the --run-dir flag's value ("" for $ISERBLK_RUN_DIR or /run/iser-blk).
	RunDir string
	// Identity names the gateway (Identity.Name is the claimed name) and what it serves;
	// Targets must already be redacted (the caller's: iser.RedactURL).
	Identity status.Identity
	// MetricsListen is --metrics-listen; "" serves no metrics.
	MetricsListen string
	// Detach is called for a control-socket detach; nil answers "unsupported".
	Detach DetachFunc
	// Restart is called for a control-socket restart (control.Restarter); nil answers
	// "unsupported".
	Restart RestartFunc
	// Stop is called for a control-socket stop --keep (control.Stopper); nil answers
	// "unsupported".
	Stop StopFunc
	Log  *zap.Logger
}

// Service is a running gateway's operations side.
type Service struct {
	Lifecycle *lifecycle.Machine
	Status    *status.Registry

	log      *zap.Logger
	claim    *control.Claim
	control  *control.Server
	metrics  *metrics.Server
	serveErr chan error
	stopDog  context.CancelFunc

	closeOnce sync.Once
	closeErr  error
}

// Start claims the name (a *control.NameInUseError if another gateway holds it: exit 2),
// opens the control socket, subscribes sd_notify to the lifecycle, starts the watchdog if the
// unit asks for one, and the metrics server if asked. The lifecycle is left in starting: the
// gateway moves it to ready once its device or socket accepts I/O (that sends READY=1).
func Start(opts Options) (_ *Service, err error) {
	if opts.Log == nil {
		opts.Log = zap.NewNop()
	}
	s := &Service{log: opts.Log, Lifecycle: lifecycle.New(), serveErr: make(chan error, 1)}
	s.Status = status.NewRegistry(opts.Identity, s.Lifecycle)
	defer func() {
		if err != nil {
			s.Close()
		}
	}()
	if s.claim, err = control.ClaimName(control.RunDir(opts.RunDir), opts.Identity.Name); err != nil {
		return nil, err
	}
	h := handler{status: s.Status, detach: opts.Detach, restart: opts.Restart, stop: opts.Stop}
	if s.control, err = control.Listen(s.claim, h, control.Options{Log: opts.Log, Lifecycle: s.Lifecycle}); err != nil {
		return nil, err
	}
	go func() { s.serveErr <- s.control.Serve() }()
	notifier := sdnotify.New(opts.Log, 0)
	s.Lifecycle.Subscribe(notifier)
	var dogCtx context.Context
	dogCtx, s.stopDog = context.WithCancel(context.Background())
	go func() {
		if err := notifier.RunWatchdog(dogCtx, nil); err != nil {
			opts.Log.Warn("sd_notify watchdog", zap.Error(err))
		}
	}()
	if opts.MetricsListen != "" {
		if err = s.startMetrics(opts); err != nil {
			return nil, err
		}
	}
	return s, nil
}

func (s *Service) startMetrics(opts Options) error {
	reg, err := metrics.NewRegistry(s.Status.Snapshot)
	if err != nil {
		return err
	}
	if s.metrics, err = metrics.Listen(opts.MetricsListen, reg, opts.Log); err != nil {
		return err
	}
	s.log.Info("metrics", zap.String("listen", s.metrics.Addr()))
	return nil
}

// Claim is the name this service holds and the run directory it holds it in.
func (s *Service) Claim() (dir, name string) { return s.claim.Dir, s.claim.Name }

// Detached is closed once a control-socket detach has succeeded and been answered (see
// control.Server.Detached; Close lets a running detach answer, so a gateway need not wait).
func (s *Service) Detached() <-chan struct{} { return s.control.Detached() }

// MetricsAddr is the metrics server's address, "" without one.
func (s *Service) MetricsAddr() string {
	if s.metrics == nil {
		return ""
	}
	return s.metrics.Addr()
}

// Close stops the metrics server, the watchdog and the control socket, and gives the name up.
// A second Close returns the first one's result.
func (s *Service) Close() error {
	s.closeOnce.Do(func() { s.closeErr = s.close() })
	return s.closeErr
}

func (s *Service) close() error {
	var errs []error
	if s.metrics != nil {
		errs = append(errs, s.metrics.Shutdown(context.Background()))
	}
	if s.stopDog != nil {
		s.stopDog()
	}
	if s.control != nil {
		errs = append(errs, s.control.Close(), <-s.serveErr)
	}
	if s.claim != nil {
		errs = append(errs, s.claim.Release())
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("service close: %w", err)
	}
	return nil
}

// handler adapts the registry and the gateway's detach to control.Handler.
type handler struct {
	status  *status.Registry
	detach  DetachFunc
	restart RestartFunc
	stop    StopFunc
}

func (h handler) StopKeep(ctx context.Context, req control.Request) (func() error, error) {
	if h.stop == nil {
		return nil, &control.Error{Code: control.CodeUnsupported, Message: "this gateway cannot stop and keep its device"}
	}
	return h.stop(ctx, req)
}

func (h handler) Restart(ctx context.Context, req control.Request) (func() error, error) {
	if h.restart == nil {
		return nil, &control.Error{Code: control.CodeUnsupported, Message: "this gateway cannot be restarted through the control socket"}
	}
	return h.restart(ctx, req)
}

func (h handler) Status() status.Status { return h.status.Snapshot() }

func (h handler) Detach(ctx context.Context, req control.Request) (control.DetachResult, error) {
	if h.detach == nil {
		return control.DetachResult{}, &control.Error{Code: control.CodeUnsupported, Message: "this gateway cannot be detached through the control socket"}
	}
	return h.detach(ctx, req)
}
