package control

import (
	"context"
	"errors"
	"fmt"
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
	var res DetachResult
	req := Request{Op: OpRestart, TimeoutMS: opts.Timeout.Milliseconds()}
	err := c.roundTrip(ctx, req, func(r Reply) error {
		if r.Type != ReplyDone || r.Result == nil {
			return fmt.Errorf("control: unexpected %q reply to restart", r.Type)
		}
		res = *r.Result
		return nil
	}, progress)
	return res, err
}

// restart answers OpRestart: the handler prepares the restart (one detach or restart at a time,
// bounded by the request's timeout, progress streamed), the client gets its answer, and only
// then does the process image get replaced.
func (s *Server) restart(w *replyWriter, req Request) bool {
	r, ok := s.handler.(Restarter)
	if !ok {
		return w.error(&Error{Code: CodeUnsupported, Message: "restart is not implemented by this gateway"})
	}
	var reexec func() error
	err := s.exclusive(w, req, func(ctx context.Context) (err error) {
		reexec, err = r.Restart(ctx, req)
		return err
	})
	if err != nil {
		s.opts.Log.Warn("control: restart did not happen", zap.Error(err))
		if errors.Is(err, context.DeadlineExceeded) {
			return w.error(&Error{Code: CodeTimeout, Message: err.Error()})
		}
		return w.error(err)
	}
	ok = w.write(Reply{Type: ReplyDone, Result: &DetachResult{PID: os.Getpid()}})
	if err := reexec(); err != nil {
		s.opts.Log.Error("restart: re-executing the gateway failed", zap.Error(err))
	}
	return ok
}
