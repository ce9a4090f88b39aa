package main

// The device stack every serving command builds from its flags: the registered buffer pool
// here, the backend (iSCSI/iSER or mem://) and the cache in front of it (--cache) in
// internal/stack; the frontends (serve.go, attach.go, attach_ublk.go) take it from there;
// internal/gateway takes it down.

import (
	"context"
	"fmt"

	"github.com/dustin/go-humanize"
	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	"go.uber.org/zap"

	"github.com/iser-blk/iser-blk/backend/iser"
	"github.com/iser-blk/iser-blk/block"
	"github.com/iser-blk/iser-blk/cache"
	"github.com/iser-blk/iser-blk/frontend/nbd"
	"github.com/iser-blk/iser-blk/internal/cli"
	"github.com/iser-blk/iser-blk/internal/memlimit"
	"github.com/iser-blk/iser-blk/internal/stack"
	"github.com/iser-blk/iser-blk/pool"
)

// openStack builds what serve and attach share (internal/stack): the registered buffer pool
// (--buffer-memory), the target (--target) and the cache (--cache) in front of it,
// staging its I/O in the pool. The caller closes the device first (the gateway's shutdown) and
// the pool last.
func openStack(ctx context.Context, tf *targetFlags, ef *exportFlags, log *zap.Logger) (dev block.Device, p *pool.Pool, err error) {
	cfg, err := ef.stackConfig(tf, log) // before logging in, so a typo costs no session
	if err != nil {
		return nil, nil, err
	}
	if p, err = newBufferPool(ef); err != nil {
		return nil, nil, err
	}
	if dev, err = stack.Open(ctx, cfg, p); err != nil {
		p.Close()
		return nil, nil, err
	}
	return dev, p, nil
}

// stackConfig is the stack the flags describe.
func (ef *exportFlags) stackConfig(tf *targetFlags, log *zap.Logger) (stack.Config, error) {
	ccfg, err := ef.cache.Config()
	if err != nil {
		return stack.Config{}, usagef("%v", err)
	}
	cfg := stack.Config{Target: ef.target, Alternates: ef.alternates, ReadOnly: ef.readOnly, Cache: ccfg, Log: log,
		TargetOptions: func(urlUser string) (iser.Options, error) { return tf.options(urlUser, log) }}
	if ef.cache.dev.path != "" {
		o, err := ef.cache.dev.options(log)
		if err != nil {
			return stack.Config{}, err
		}
		cfg.CacheDev = &o
	}
	return cfg, nil
}

// newBufferPool builds the registered-memory buffer pool from --buffer-memory.
func newBufferPool(ef *exportFlags) (*pool.Pool, error) {
	mem, err := humanize.ParseBytes(ef.bufferMemory)
	if err != nil || mem < 2*nbd.MaxPayload || mem > 1<<40 {
		return nil, usagef("--buffer-memory %q: need a size of at least %s", ef.bufferMemory, humanize.IBytes(2*nbd.MaxPayload))
	}
	p, err := pool.New(pool.Config{MaxBytes: int64(mem), HugePages: true})
	if err != nil {
		return nil, fmt.Errorf("buffer pool: %w", err)
	}
	return p, nil
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
