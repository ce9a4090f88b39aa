package control

import (
	"context"
	"errors"
	"os"
	"time"

	"go.uber.org/zap"
)

// RestartOptions are a restart's parameters.
type RestartOptions struct {
	// Timeout bounds the drain of the requests in flight and the write-back (0: no bound); when
	// it passes, the gateway keeps serving and the client gets a "timeout" error.
	Timeout time.Duration
}

// Restart asks the gateway for a planned restart (OpRestart): it stops taking requests, finishes
// those in flight, writes back every dirty byte, records a clean state and re-executes its binary
// from its path on disk, keeping its PID; the new image takes its device over. progress (nil: not
// wanted) sees the lifecycle and the write-back as they move. Restart returns once the old image
// has answered; a refusal or a failed write-back is an *Error, and the gateway then keeps serving.
func (c *Client) Restart(ctx context.Context, opts RestartOptions, progress func(Progress)) (DetachResult, error) {
	return c.done(ctx, Request{Op: OpRestart, TimeoutMS: opts.Timeout.Milliseconds()}, progress)
}

// Stopper is a Handler that also implements OpStop with Keep: like a restart it stops taking
// requests, finishes those in flight, writes back every dirty byte and records a clean state,
// and its step then ends the process (exit 0) without removing the kernel device, for a
// successor started with the same command to take over. An error leaves the gateway serving.
type Stopper interface {
	StopKeep(ctx context.Context, req Request) (exit func() error, err error)
}

// StopKeep asks the gateway to stop and keep its device for a successor (OpStop, keep). It
// returns once the gateway has answered and, like Detach, waited for its process to exit.
func (c *Client) StopKeep(ctx context.Context, opts RestartOptions, progress func(Progress)) (DetachResult, error) {
	return c.untilExit(ctx, Request{Op: OpStop, Keep: true, TimeoutMS: opts.Timeout.Milliseconds()}, progress)
}

// restart answers OpRestart.
func (s *Server) restart(w *replyWriter, req Request) bool {
	r, ok := s.handler.(Restarter)
	if !ok {
		return w.error(&Error{Code: CodeUnsupported, Message: "restart is not implemented by this gateway"})
	}
	return s.handOver(w, req, "restart", r.Restart)
}

// stop answers OpStop.
func (s *Server) stop(w *replyWriter, req Request) bool {
	st, ok := s.handler.(Stopper)
	if !ok {
		return w.error(&Error{Code: CodeUnsupported, Message: "stop --keep is not implemented by this gateway"})
	}
	return s.handOver(w, req, "stop", st.StopKeep)
}

// handOver runs a hand-over's preparation (one detach, restart or stop at a time, bounded by
// the request's timeout, progress streamed), answers the client, and only then runs the step
// that ends this process image (re-exec or exit).
func (s *Server) handOver(w *replyWriter, req Request, what string, prepare func(context.Context, Request) (func() error, error)) bool {
	var step func() error
	written, err := s.exclusive(w, req, func(ctx context.Context) (err error) {
		step, err = prepare(ctx, req)
		return err
	})
	if err != nil {
		s.opts.Log.Warn("control: "+what+" did not happen", zap.Error(err))
		if errors.Is(err, context.DeadlineExceeded) {
			return w.error(&Error{Code: CodeTimeout, Message: err.Error()})
		}
		return w.error(err)
	}
	ok := w.write(Reply{Type: ReplyDone, Result: &DetachResult{PID: os.Getpid(), WrittenBackBytes: written}})
	if err := step(); err != nil {
		s.opts.Log.Error(what+": ending the process image failed", zap.Error(err))
	}
	return ok
}
