package main

import (
	"context"
	"os"
	"os/signal"
	"syscall"
)

// signalContext returns a context cancelled by the first SIGINT or SIGTERM. The second one is
// caught by closeDevice (shutdown.go), which listens for it itself while it flushes, to abort
// the shutdown flush.
func signalContext() (context.Context, func()) {
	return signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
}
