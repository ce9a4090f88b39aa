package main

// The device stack every serving command builds: backend (iSCSI/iSER or mem://) → cache → the
// frontend. This file owns the cache flags and the shutdown path that flushes the stack, because
// "what happens to acknowledged data when the process stops" must be answered in one place.

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/dustin/go-humanize"
	"go.uber.org/zap"

	"github.com/iser-blk/iser-blk/block"
	"github.com/iser-blk/iser-blk/cache"
	"github.com/iser-blk/iser-blk/pool"
)

// cacheFlags are --cache, --cache-size and --cache-dirty.
type cacheFlags struct {
	mode, size, dirty string
}

func (cf *cacheFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&cf.mode, "cache", "writeback", "cache mode: writeback (a volatile write cache; clients' FLUSH/FUA make data durable), writethrough or off")
	fs.StringVar(&cf.size, "cache-size", "1GiB", "memory for cached pages")
	fs.StringVar(&cf.dirty, "cache-dirty", "50%", "most dirty data held before writers are throttled: a percentage of --cache-size or a size")
}

// wrap puts the cache in front of dev. Staging buffers for write-back and read misses come from
// p (registered memory, so that iSER moves them without a copy). With --cache off dev is
// returned unchanged.
func (cf *cacheFlags) wrap(dev block.Device, p *pool.Pool, log *zap.Logger) (block.Device, error) {
	cfg, err := cache.ParseConfig(cf.mode, cf.size, cf.dirty)
	if err != nil {
		return nil, usagef("%v", err)
	}
	if cfg.Mode == cache.Off {
		return dev, nil
	}
	cfg.IOPool = p
	c, err := cache.New(dev, cfg, log)
	if err != nil {
		return nil, fmt.Errorf("cache: %w", err)
	}
	log.Info("cache", zap.String("mode", cf.mode), zap.String("size", humanize.IBytes(uint64(cfg.Size))))
	return c, nil
}

// dirtyReporter is what the shutdown path needs from a cache: how much is still to write.
type dirtyReporter interface {
	DirtyBytes() int64
}

// closeDevice flushes and closes dev at shutdown and returns the exit code. While dirty data is
// written back it logs a progress line (bytes left, rate) every second. A second SIGINT/SIGTERM
// aborts the flush: the process then says loudly how much acknowledged data was NOT written and
// exits non-zero. It never exits 0 with acknowledged-but-unflushed data.
func closeDevice(dev block.Device, log *zap.Logger) int {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, os.Interrupt, syscall.SIGTERM)
	defer signal.Stop(sigs)
	aborted := make(chan struct{})
	go func() {
		select {
		case s := <-sigs:
			log.Error("second signal: aborting the shutdown flush", zap.String("signal", s.String()))
			close(aborted)
			cancel()
		case <-ctx.Done():
		}
	}()

	done := make(chan error, 1)
	t0 := time.Now()
	go func() { done <- dev.Flush(ctx) }()
	var err error
	if dr, ok := dev.(dirtyReporter); ok {
		start := dr.DirtyBytes()
		if start > 0 {
			log.Info("flushing dirty data to the target", zap.String("dirty", humanize.IBytes(uint64(start))))
		}
		tick := time.NewTicker(time.Second)
		last, lastT := start, t0
	wait:
		for {
			select {
			case err = <-done:
				break wait
			case now := <-tick.C:
				left := dr.DirtyBytes()
				rate := float64(last-left) / now.Sub(lastT).Seconds()
				if rate < 0 {
					rate = 0
				}
				log.Info("flush progress", zap.String("left", humanize.IBytes(uint64(left))),
					zap.String("rate", humanize.IBytes(uint64(rate))+"/s"))
				last, lastT = left, now
			}
		}
		tick.Stop()
	} else {
		err = <-done
	}

	code := exitOK
	switch {
	case err == nil:
		log.Info("device flushed", zap.Duration("took", time.Since(t0).Round(time.Millisecond)))
	case errors.Is(err, block.ErrReadOnly):
	default:
		select {
		case <-aborted:
		default:
		}
		left := int64(-1)
		if dr, ok := dev.(dirtyReporter); ok {
			left = dr.DirtyBytes()
		}
		log.Error("FINAL FLUSH FAILED: data acknowledged to clients is NOT on the target",
			zap.Int64("dirty_bytes_lost", left), zap.String("dirty", humanize.IBytes(uint64(max(left, 0)))), zap.Error(err))
		code = exitFailure
	}
	if code == exitOK {
		if err := dev.Close(); err != nil {
			log.Error("closing the device failed", zap.Error(err))
			code = exitFailure
		}
	} else if c, ok := dev.(*cache.Cache); ok {
		// Do not let Close try (and wait for) another flush after the user aborted it: close
		// with an already-cancelled context so the backend is logged out promptly.
		cctx, ccancel := context.WithCancel(context.Background())
		ccancel()
		_ = c.CloseContext(cctx)
	} else {
		_ = dev.Close()
	}
	return code
}
