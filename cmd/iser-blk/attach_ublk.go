package main

import (
	"context"
	"errors"
	"fmt"
	"os"

	"go.uber.org/zap"

	"github.com/iser-blk/iser-blk/block"
	"github.com/iser-blk/iser-blk/frontend/ublk"
	"github.com/iser-blk/iser-blk/pool"
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
	if opts.Pool == nil {
		// Every tag holds one buffer of the largest request for the device's lifetime; the
		// pool is their registered home (with iSER the kernel's copy lands in RDMA memory).
		p, err := newUblkPool(opts)
		if err != nil {
			log.Error("ublk buffer pool", zap.Error(err))
			return exitFailure
		}
		defer p.Close()
		opts.Pool = p
	}
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

// newUblkPool sizes a pool for queues × depth buffers of the largest request.
func newUblkPool(opts ublkOptions) (*pool.Pool, error) {
	q, d, maxIO := opts.Queues, opts.Depth, opts.MaxIO
	if q <= 0 {
		q = ublk.DefaultQueues()
	}
	if d <= 0 {
		d = ublk.DefaultDepth
	}
	if maxIO <= 0 {
		maxIO = ublk.DefaultMaxIO
	}
	if q > 4096 || d > 4096 || maxIO > 32<<20 {
		return nil, fmt.Errorf("ublk: %d queues × depth %d × %d bytes is beyond the driver's limits: %w", q, d, maxIO, block.ErrInvalid)
	}
	return pool.New(pool.Config{MaxBytes: int64(q) * int64(d) * int64(maxIO), MaxClass: maxIO, HugePages: true})
}
