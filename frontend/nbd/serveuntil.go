package nbd

import (
	"context"
	"net"
	"time"

	"go.uber.org/zap"
)

// ServeUntil serves l (with the TLS policy t, ServeTLS; nil: plaintext, Serve) until ctx ends
// or the listener fails, then shuts the server down, giving in-flight requests drain to finish
// before the remaining connections are cut. It logs each step and returns the listener's
// error, nil when ctx ended. It closes l however it returns: Shutdown closes only the listeners
// Serve has taken, and neither a ctx that ended before Serve took l nor a failed Accept leaves
// it there (a unix socket's file would outlive the process). It neither flushes nor closes the
// server's device.
func (s *Server) ServeUntil(ctx context.Context, l net.Listener, t *TLS, drain time.Duration) error {
	defer l.Close() //nolint:errcheck // closed twice when Shutdown closed it
	served := make(chan error, 1)
	go func() {
		if t == nil {
			served <- s.Serve(l)
		} else {
			served <- s.ServeTLS(l, t)
		}
	}()
	var failed error
	select {
	case <-ctx.Done():
		s.log.Info("shutting down: draining in-flight requests")
	case failed = <-served:
		s.log.Error("NBD listener failed", zap.Error(failed))
	}
	sctx, cancel := context.WithTimeout(context.Background(), drain)
	if err := s.Shutdown(sctx); err != nil {
		s.log.Warn("connections cut before their requests finished", zap.Error(err))
	}
	cancel()
	return failed
}
