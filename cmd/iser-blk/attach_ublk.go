package main

import (
	"context"
	"errors"
	"fmt"
	"os"

	"go.uber.org/zap"

	"github.com/iser-blk/iser-blk/block"
	"github.com/iser-blk/iser-blk/frontend/ublk"
)

// ublkOptions are the attach flags that concern ublk (--queues, --depth, --max-io).
type ublkOptions struct {
	Queues int             // --queues: hardware queues (0: CPUs, at most 4)
	Depth  int             // --depth: requests in flight per queue (0: 64)
	MaxIO  int             // largest request in bytes (0: 512 KiB, capped by the device)
	Pool   ublk.BufferPool // per-tag buffers (nil: anonymous memory)
}

// attachUblk serves dev as /dev/ublkbN until ctx is cancelled (SIGINT/SIGTERM), printing the
// device path on stdout once it exists; then it stops and deletes the device after draining and
// flushing. It does not close dev. It returns the process exit code.
func attachUblk(ctx context.Context, dev block.Device, opts ublkOptions, log *zap.Logger) int {
	err := ublk.Run(ctx, dev, ublk.Options{
		Queues: opts.Queues,
		Depth:  opts.Depth,
		MaxIO:  opts.MaxIO,
		Pool:   opts.Pool,
		Logger: log,
	}, func(path string) { fmt.Println(path) })
	switch {
	case err == nil:
		return exitOK
	case errors.Is(err, ublk.ErrNoKernel):
		log.Error("ublk is not available", zap.Error(err))
		fmt.Fprintf(os.Stderr, "iser-blk: %v\n", err)
		return exitNoKernel
	case errors.Is(err, block.ErrInvalid):
		log.Error("ublk attach failed", zap.Error(err))
		return exitUsage
	default:
		log.Error("ublk attach failed", zap.Error(err))
		return exitFailure
	}
}
