package main

import (
	"context"
	"errors"
	"fmt"

	"github.com/dustin/go-humanize"
	"go.uber.org/zap"

	"github.com/iser-blk/iser-blk/frontend/ublk"
	"github.com/iser-blk/iser-blk/internal/gateway"
	"github.com/iser-blk/iser-blk/pool"
)

// ublkPoolShare is the part of the stack's pool the per-tag buffers may hold for the device's
// lifetime; the rest stays for the cache's staging buffers and iSER's bounce buffers.
const ublkPoolShare = 2 // one half

// attachUblk serves the attachment's device as /dev/ublkbN (gateway.Attachment.RunUblk; uopts:
// --queues, --depth, --max-io, the logger and counters; tag buffers from p, which was registered
// for RDMA before the target was opened, so iSER moves them without a bounce; nil: anonymous
// memory) and returns the process exit code. It neither flushes nor closes the device: the
// gateway's shutdown does, with progress reports and the second-signal abort.
func attachUblk(ctx context.Context, at *gateway.Attachment, uopts ublk.Options, p *pool.Pool) int {
	log := uopts.Logger
	if p != nil {
		uopts.Pool = p // not a nil *pool.Pool in a non-nil interface
	}
	maxIO, err := ublkMaxIO(uopts, p)
	if err != nil {
		return fail("attach", err) // ublk.ErrBadOptions: exit 2
	}
	if maxIO != uopts.MaxIO {
		log.Info("ublk requests capped so that the per-tag buffers fit in half the buffer pool",
			zap.String("max_io", humanize.IBytes(uint64(maxIO))))
	}
	uopts.MaxIO = maxIO
	return ublkExit(at.RunUblk(ctx, uopts))
}

// ublkExit is the exit code of a ublk attach that ended with err, which it prints (exitCode
// maps the ublk sentinels), naming the flag behind a device number in use.
func ublkExit(err error) int {
	switch {
	case err == nil:
		return exitOK
	case errors.Is(err, ublk.ErrIDTaken):
		err = fmt.Errorf("--ublk-id: %w", err)
	}
	return fail("attach", err)
}

// ublkMaxIO is the request size to ask ublk for (ublk.FitMaxIO): the per-tag buffers may hold
// half of p (ublkPoolShare).
func ublkMaxIO(uopts ublk.Options, p *pool.Pool) (int, error) {
	if p == nil {
		return ublk.FitMaxIO(uopts, 0)
	}
	maxIO, err := ublk.FitMaxIO(uopts, p.Stats().MaxBytes/ublkPoolShare)
	if be := (*ublk.BudgetError)(nil); errors.As(err, &be) {
		return 0, fmt.Errorf("ublk: --buffer-memory %s cannot hold %d queues × depth %d request buffers of even 4 KiB in half of it: raise --buffer-memory or lower --queues/--depth: %w",
			humanize.IBytes(uint64(p.Stats().MaxBytes)), be.Queues, be.Depth, ublk.ErrBadOptions)
	}
	return maxIO, err
}
