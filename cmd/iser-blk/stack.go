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
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/dustin/go-humanize"
	"go.uber.org/zap"

	"github.com/iser-blk/iser-blk/block"
	"github.com/iser-blk/iser-blk/cache"
	"github.com/iser-blk/iser-blk/pool"
)

// cacheFlags are --cache, --cache-size, --cache-dirty and the cutoffs --cache-write-around and
// --cache-read-around.
type cacheFlags struct {
	mode, size, dirty       string
	writeAround, readAround string
}

func (cf *cacheFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&cf.mode, "cache", "writeback", "cache mode: writeback (a volatile write cache; clients' FLUSH/FUA make data durable), writethrough or off")
	fs.StringVar(&cf.size, "cache-size", humanize.IBytes(uint64(cache.SizeFor(hostMemory()))),
		"memory for cached pages; the default is a sixteenth of this host's memory, between 64 MiB and 1 GiB")
	fs.StringVar(&cf.dirty, "cache-dirty", "50%", "most dirty data held before writers are throttled: a percentage of --cache-size or a size")
	fs.StringVar(&cf.writeAround, "cache-write-around", "256KiB", "writes this large (a quarter of it when continuing a sequential stream) go\n"+
		"straight to the target instead of through the cache; 0 caches every write")
	fs.StringVar(&cf.readAround, "cache-read-around", "256KiB", "read misses this large (a quarter of it when continuing a sequential stream) are\n"+
		"read straight from the target and not cached; 0 caches every read")
}

// config parses the cache flags.
func (cf *cacheFlags) config() (cache.Config, error) {
	cfg, err := cache.ParseConfig(cf.mode, cf.size, cf.dirty)
	if err != nil {
		return cfg, err
	}
	if cfg.WriteAround, err = cutoff("--cache-write-around", cf.writeAround); err != nil {
		return cfg, err
	}
	cfg.ReadAround, err = cutoff("--cache-read-around", cf.readAround)
	return cfg, err
}

// cutoff parses a size flag where 0 disables (cache.Config's -1).
func cutoff(name, v string) (int64, error) {
	n, err := humanize.ParseBytes(v)
	if err != nil || n > 1<<40 {
		return 0, fmt.Errorf("%s %q: want a size", name, v)
	}
	if n == 0 {
		return -1, nil
	}
	return int64(n), nil
}

// hostMemory is MemTotal from /proc/meminfo in bytes, or 0 when it cannot be read.
func hostMemory() int64 {
	b, err := os.ReadFile("/proc/meminfo")
	if err != nil {
		return 0
	}
	for _, l := range strings.Split(string(b), "\n") {
		if f := strings.Fields(l); len(f) >= 2 && f[0] == "MemTotal:" {
			kb, _ := strconv.ParseInt(f[1], 10, 64)
			return kb << 10
		}
	}
	return 0
}

// wrap puts the cache in front of dev. Staging buffers for write-back and read misses come from
// p (registered memory, so that iSER moves them without a copy). With --cache off dev is
// returned unchanged.
func (cf *cacheFlags) wrap(dev block.Device, p *pool.Pool, log *zap.Logger) (block.Device, error) {
	cfg, err := cf.config()
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
