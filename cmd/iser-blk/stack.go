package main

// The device stack every serving command builds: the registered buffer pool, the backend
// (iSCSI/iSER or mem://) and the cache in front of it (--cache); the frontends (serve.go,
// attach.go, attach_ublk.go) take it from there; internal/gateway takes it down.

import (
	"context"
	"fmt"
	"strings"

	"github.com/dustin/go-humanize"
	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	"go.uber.org/zap"

	"github.com/iser-blk/iser-blk/backend/iser"
	"github.com/iser-blk/iser-blk/backend/memdev"
	"github.com/iser-blk/iser-blk/block"
	"github.com/iser-blk/iser-blk/cache"
	"github.com/iser-blk/iser-blk/frontend/nbd"
	"github.com/iser-blk/iser-blk/internal/cachedev"
	"github.com/iser-blk/iser-blk/internal/cli"
	"github.com/iser-blk/iser-blk/internal/memlimit"
	"github.com/iser-blk/iser-blk/pool"
)

// openStack builds what serve and attach share: the registered buffer pool (--buffer-memory,
// mem bytes), the target (--target) and the cache (--cache) in front of it, staging its I/O in
// the pool. The caller closes the device first (the gateway's shutdown) and the pool last.
func openStack(ctx context.Context, tf *targetFlags, ef *exportFlags, log *zap.Logger) (dev block.Device, p *pool.Pool, mem int64, err error) {
	if _, err := ef.cache.Config(); err != nil {
		return nil, nil, 0, usagef("%v", err) // before logging in, so a typo costs no session
	}
	if p, mem, err = newBufferPool(ef); err != nil {
		return nil, nil, 0, err
	}
	pl := p // the returns below set p to nil before this runs
	defer func() {
		if err != nil {
			pl.Close()
		}
	}()
	// iSER connections register the pool's regions once and hand its buffers (NBD payloads,
	// cache staging) to the target without a copy; without RDMA this does nothing.
	if err = iser.UsePool(p); err != nil {
		return nil, nil, 0, fmt.Errorf("registering the buffer pool for RDMA: %w", err)
	}
	target, err := openTarget(ctx, tf, ef, log)
	if err != nil {
		return nil, nil, 0, err
	}
	if dev, err = ef.cache.wrap(target, ef.target, p, log); err != nil {
		target.Close()
		return nil, nil, 0, err
	}
	return dev, p, mem, nil
}

// openTarget opens --target as a block.Device. mem:// is an in-memory device for tests and
// protocol benchmarks; everything else goes to the iSCSI/iSER backend.
func openTarget(ctx context.Context, tf *targetFlags, ef *exportFlags, log *zap.Logger) (block.Device, error) {
	if ef.target == "" {
		return nil, usagef("--target is required")
	}
	if strings.HasPrefix(ef.target, "mem://") {
		d, err := memdev.ParseURL(ef.target)
		if err != nil {
			return nil, usagef("%v", err)
		}
		return d, nil
	}
	t, err := iser.ParseURL(ef.target)
	if err != nil {
		return nil, err
	}
	opts, err := tf.options(t.User, log)
	if err != nil {
		return nil, err
	}
	opts.ReadOnly = ef.readOnly
	opts.AlternateTargets = ef.alternates
	return iser.Open(ctx, ef.target, opts)
}

// newBufferPool builds the registered-memory buffer pool from --buffer-memory.
func newBufferPool(ef *exportFlags) (*pool.Pool, int64, error) {
	mem, err := humanize.ParseBytes(ef.bufferMemory)
	if err != nil || mem < 2*nbd.MaxPayload || mem > 1<<40 {
		return nil, 0, usagef("--buffer-memory %q: need a size of at least %s", ef.bufferMemory, humanize.IBytes(2*nbd.MaxPayload))
	}
	p, err := pool.New(pool.Config{MaxBytes: int64(mem), HugePages: true})
	if err != nil {
		return nil, 0, fmt.Errorf("buffer pool: %w", err)
	}
	return p, int64(mem), nil
}

// cacheFlags are --cache, --cache-size, --cache-dirty and the cutoffs --cache-write-around and
// --cache-read-around; Config parses them.
type cacheFlags struct {
	cache.Flags
	dev cacheDevFlags
}

func (cf *cacheFlags) register(fs *pflag.FlagSet) {
	fs.StringVar(&cf.Mode, "cache", "writeback", "cache mode: writeback (a volatile write cache; clients' FLUSH/FUA make data durable), writethrough or off")
	fs.StringVar(&cf.Size, "cache-size", humanize.IBytes(uint64(cache.SizeFor(memlimit.Own()))),
		"memory for cached pages; the default is a sixteenth of this host's memory, between 64 MiB and 1 GiB")
	fs.StringVar(&cf.Dirty, "cache-dirty", "50%", "most dirty data held before writers are throttled: a percentage of --cache-size or a size")
	fs.StringVar(&cf.WriteAround, "cache-write-around", "256KiB", "writes this large (a quarter of it when continuing a sequential stream) go\n"+
		"straight to the target instead of through the cache; 0 caches every write")
	fs.StringVar(&cf.ReadAround, "cache-read-around", "256KiB", "reads this large, cached or not (a quarter of it for a miss continuing a sequential\n"+
		"stream), are read straight from the target with dirty pages copied over, and not cached;\n"+
		"0 caches every read")
	cf.dev.register(fs)
}

// complete offers --cache's modes in shell completion.
func (cf *cacheFlags) complete(cmd *cobra.Command) {
	cli.CompleteWords(cmd, "cache", "writeback", "writethrough", "off")
}

// wrap puts the cache in front of dev. Staging buffers for write-back and read misses come from
// p (registered memory, so that iSER moves them without a copy). With --cache off dev is
// returned unchanged.
func (cf *cacheFlags) wrap(dev block.Device, rawTarget string, p *pool.Pool, log *zap.Logger) (block.Device, error) {
	cfg, err := cf.Config()
	if err != nil {
		return nil, usagef("%v", err)
	}
	if cf.dev.path != "" && cfg.Mode != cache.WriteBack {
		return nil, usagef("--cache-dev needs --cache writeback (it is a write-back cache)")
	}
	if cfg.Mode == cache.Off {
		return dev, nil
	}
	if cf.dev.path != "" {
		o, err := cf.dev.options(rawTarget, log)
		if err != nil {
			return nil, err
		}
		if dev, cfg, err = cachedev.Open(dev, cfg, o); err != nil {
			return nil, err
		}
	}
	cfg.IOPool = p
	c, err := cache.New(dev, cfg, log)
	if err != nil {
		if cf.dev.path != "" {
			_ = dev.(block.Abandoner).Abandon() // keeps the log; closes the target too
		}
		return nil, fmt.Errorf("cache: %w", err)
	}
	log.Info("cache", zap.String("mode", cf.Mode), zap.String("size", humanize.IBytes(uint64(cfg.Size))))
	return c, nil
}
