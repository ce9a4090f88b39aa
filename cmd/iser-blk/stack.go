package main

// The device stack every serving command builds: the registered buffer pool, the backend
// (iSCSI/iSER or mem://) and the cache in front of it (--cache); the frontends (serve.go,
// attach.go, attach_ublk.go) take it from there. shutdown.go takes it down.

import (
	"context"
	"flag"
	"fmt"
	"os"
	"strconv"
	"strings"

	"github.com/dustin/go-humanize"
	"go.uber.org/zap"

	"github.com/iser-blk/iser-blk/backend/iser"
	"github.com/iser-blk/iser-blk/backend/memdev"
	"github.com/iser-blk/iser-blk/block"
	"github.com/iser-blk/iser-blk/cache"
	"github.com/iser-blk/iser-blk/frontend/nbd"
	"github.com/iser-blk/iser-blk/pool"
)

// openStack builds what serve and attach share: the registered buffer pool (--buffer-memory,
// mem bytes), the target (--target) and the cache (--cache) in front of it, staging its I/O in
// the pool. The caller closes the device first (the gateway's shutdown) and the pool last.
func openStack(ctx context.Context, tf *targetFlags, ef *exportFlags, log *zap.Logger) (dev block.Device, p *pool.Pool, mem int64, err error) {
	if _, err := ef.cache.config(); err != nil {
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
	if dev, err = ef.cache.wrap(target, p, log); err != nil {
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
	fs.StringVar(&cf.readAround, "cache-read-around", "256KiB", "reads this large, cached or not (a quarter of it for a miss continuing a sequential\n"+
		"stream), are read straight from the target with dirty pages copied over, and not cached;\n"+
		"0 caches every read")
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
