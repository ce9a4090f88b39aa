package gateway

// The flushes of a way out: the final flush and close of the stack (CloseDevice) and a
// write-back with progress (flushWithProgress), which a detach and a hand-over run while the
// device still serves.

import (
	"context"
	"errors"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/dustin/go-humanize"
	"go.uber.org/zap"

	"github.com/iser-blk/iser-blk/block"
	"github.com/iser-blk/iser-blk/internal/lifecycle"
)

// CloseDevice flushes and closes dev at shutdown and returns the exit code. While dirty data is
// written back it logs a progress line (bytes left, rate) every second and reports it to lm
// (nil: nobody), which streams it to a detach's caller and extends systemd's stop timeout while
// it moves. A second SIGINT/SIGTERM aborts the flush: the process then says loudly how much
// acknowledged data was NOT written and exits non-zero. It never returns ExitOK with
// acknowledged-but-unflushed data.
func CloseDevice(dev block.Device, log *zap.Logger, lm *lifecycle.Machine) int {
	ctx, stop := abortOnSignal(log)
	defer stop()
	t0 := time.Now()
	err := flushWithProgress(ctx, dev, log, lm)
	if p := persister(dev); p != nil && err == nil {
		if err = drainWithProgress(ctx, p, log, lm); err != nil {
			// Nothing is lost: the log keeps it (Abandon leaves it on the cache device).
			log.Error("WRITE-BACK OF THE CACHE DEVICE FAILED: the target lacks data that the cache device keeps; "+
				"attach again with the same --cache-dev to write it back, and do not use the LUN without it meanwhile",
				zap.String("left", humanize.IBytes(uint64(max(p.DirtyBytes(), 0)))), zap.Error(err))
			closeAbandoned(dev)
			return ExitFailure
		}
	}
	switch {
	case err == nil:
		log.Info("device flushed", zap.Duration("took", time.Since(t0).Round(time.Millisecond)))
	case errors.Is(err, block.ErrReadOnly):
		// nothing can have been written: nothing to flush
	default:
		reportUnflushed(dev, err, log)
		closeAbandoned(dev)
		return ExitFailure
	}
	if err := dev.Close(); err != nil {
		log.Error("closing the device failed", zap.Error(err))
		return ExitFailure
	}
	return ExitOK
}

// abortOnSignal returns a context that a second SIGINT/SIGTERM (the first cancelled the
// command's own context) cancels, to abort the shutdown flush; stop releases the signals.
func abortOnSignal(log *zap.Logger) (ctx context.Context, stop func()) {
	ctx, cancel := context.WithCancel(context.Background())
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, os.Interrupt, syscall.SIGTERM)
	go func() {
		select {
		case s := <-sigs:
			log.Error("second signal: aborting the shutdown flush", zap.String("signal", s.String()))
			cancel()
		case <-ctx.Done():
		}
	}()
	return ctx, func() {
		signal.Stop(sigs)
		cancel()
	}
}

// flushWithProgress runs dev.Flush(ctx), logging every second how much dirty data is left and
// the rate it drains at when dev is a cache that can say, and reporting the same to lm (nil: no
// one).
func flushWithProgress(ctx context.Context, dev block.Device, log *zap.Logger, lm *lifecycle.Machine) error {
	dr, _ := dev.(block.DirtyReporter)
	return withProgress(ctx, dev.Flush, dr, "flushing dirty data to the target", log, lm)
}

// drainWithProgress writes everything a persistent write-back log holds back to the target
// (block.Persister), with the same progress as a flush.
func drainWithProgress(ctx context.Context, p block.Persister, log *zap.Logger, lm *lifecycle.Machine) error {
	return withProgress(ctx, p.Drain, p, "writing the cache device's log back to the target", log, lm)
}

// withProgress runs op(ctx), reporting dr's progress (nil: none) as flushWithProgress does.
func withProgress(ctx context.Context, op func(context.Context) error, dr block.DirtyReporter, what string, log *zap.Logger, lm *lifecycle.Machine) error {
	done := make(chan error, 1)
	go func() { done <- op(ctx) }()
	if dr == nil {
		return <-done
	}
	start := dr.DirtyBytes()
	if start > 0 {
		log.Info(what, zap.String("dirty", humanize.IBytes(uint64(start))))
		if lm != nil {
			lm.ReportFlush(lifecycle.FlushProgress{DirtyBytes: uint64(start)})
		}
	}
	// The lifecycle hears about progress four times a second (systemd's stop timeout is extended
	// while bytes move; a detach's caller sees them); the log once a second.
	tick := time.NewTicker(time.Second / 4)
	defer tick.Stop()
	last, lastT, ticks := start, time.Now(), 0
	for {
		select {
		case err := <-done:
			if lm != nil && err == nil && start > 0 { // the last stretch moved bytes too
				lm.ReportFlush(lifecycle.FlushProgress{WrittenBackBytes: uint64(start)})
			}
			return err
		case now := <-tick.C:
			left := dr.DirtyBytes()
			if lm != nil {
				lm.ReportFlush(lifecycle.FlushProgress{DirtyBytes: uint64(max(left, 0)), WrittenBackBytes: uint64(max(start-left, 0))})
			}
			if ticks++; ticks%4 != 0 {
				continue
			}
			rate := max(float64(last-left)/now.Sub(lastT).Seconds(), 0)
			log.Info("flush progress", zap.String("left", humanize.IBytes(uint64(left))),
				zap.String("rate", humanize.IBytes(uint64(rate))+"/s"))
			last, lastT = left, now
		}
	}
}

// persister is the layer of dev's stack that keeps data on a cache device of its own
// (block.Persister), or nil.
func persister(dev block.Device) block.Persister {
	for dev != nil {
		if p, ok := dev.(block.Persister); ok {
			return p
		}
		l, ok := dev.(block.Layered)
		if !ok {
			return nil
		}
		dev = l.Below()
	}
	return nil
}

// reportUnflushed says loudly that the final flush failed and how much acknowledged data is
// therefore not on the target (-1: unknown, dev is no cache).
func reportUnflushed(dev block.Device, err error, log *zap.Logger) {
	left := int64(-1)
	if dr, ok := dev.(block.DirtyReporter); ok {
		left = dr.DirtyBytes()
	}
	log.Error("FINAL FLUSH FAILED: data acknowledged to clients is NOT on the target",
		zap.Int64("dirty_bytes_lost", left), zap.String("dirty", humanize.IBytes(uint64(max(left, 0)))), zap.Error(err))
}

// closeAbandoned closes dev after a failed or aborted flush. A layer holding dirty data must not
// try (and wait for) another flush after the user aborted one: it is abandoned (block.Abandoner),
// so the backend is logged out promptly.
func closeAbandoned(dev block.Device) {
	if a, ok := dev.(block.Abandoner); ok {
		_ = a.Abandon()
		return
	}
	_ = dev.Close()
}
