package nbd

import (
	"context"
	"errors"
	"time"

	"go.uber.org/zap"
)

// ErrKernelDropped reports that the kernel dropped every connection of an Attachment while it
// was meant to serve (the device was disconnected behind the server's back, or every socket
// died and DeadConnTimeout passed).
var ErrKernelDropped = errors.New("nbd: the kernel dropped every connection")

// Bounds of ServeUntil's shutdown: the kernel's detach, then the server's drain.
const (
	detachTimeout = 2 * time.Minute
	drainTimeout  = time.Minute
)

// ServeUntil serves until ctx ends or the kernel drops every connection, then detaches the device
// (bounded by two minutes) and lets the server's requests drain (bounded by a minute; then the
// remaining connections are cut). It logs each step and returns ErrKernelDropped and/or the
// detach error, nil when it stopped because ctx ended and detached cleanly. It neither flushes
// nor closes the server's device.
func (a *Attachment) ServeUntil(ctx context.Context) error {
	return serveUntil(ctx, a, a.srv, a.log)
}

// detachable is what serveUntil needs of an Attachment; drainer of a Server.
type detachable interface {
	Path() string
	Done() <-chan struct{}
	Detach(context.Context) error
}

type drainer interface{ Shutdown(context.Context) error }

func serveUntil(ctx context.Context, a detachable, srv drainer, log *zap.Logger) error {
	var dropped error
	select {
	case <-ctx.Done():
		log.Info("detaching", zap.String("device", a.Path()))
	case <-a.Done():
		log.Error("the kernel dropped every connection", zap.String("device", a.Path()))
		dropped = ErrKernelDropped
	}
	dctx, cancel := context.WithTimeout(context.Background(), detachTimeout)
	err := a.Detach(dctx)
	cancel()
	if err != nil {
		log.Error("detach failed", zap.Error(err))
	}
	sctx, cancel := context.WithTimeout(context.Background(), drainTimeout)
	if err := srv.Shutdown(sctx); err != nil {
		log.Warn("connections cut before their requests finished", zap.Error(err))
	}
	cancel()
	return errors.Join(dropped, err)
}
