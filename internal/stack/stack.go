// Package stack assembles the device a gateway serves, bottom to top: the backend (an
// iSCSI/iSER LUN, or mem:// for tests and protocol benchmarks), a --cache-dev log in front of it
// (internal/cachedev) and the RAM cache (package cache) on top. The frontends (NBD, ublk) take
// the device from there; internal/gateway takes it down.
//
// Invariants:
//   - A Config's settings are checked before anything opens (ConfigError): a mistake costs no
//     login. The URL and the login options are checked by the backend, before it dials.
//   - The caller's buffer pool is registered for RDMA before the target is opened, so iSER
//     connections hand its buffers (frontend payloads, cache staging) to the target without a
//     copy; the cache stages its I/O in it.
//   - Open either returns the top of the stack, which owns everything below it (closing it
//     flushes and closes them), or leaves nothing open. The pool stays the caller's: it closes
//     the device first and the pool last.
package stack

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/dustin/go-humanize"
	"go.uber.org/zap"

	"github.com/iser-blk/iser-blk/backend/iser"
	"github.com/iser-blk/iser-blk/backend/memdev"
	"github.com/iser-blk/iser-blk/block"
	"github.com/iser-blk/iser-blk/cache"
	"github.com/iser-blk/iser-blk/internal/cachedev"
	"github.com/iser-blk/iser-blk/pool"
)

// Config is the stack to build, parsed from flags.
type Config struct {
	// Target is the LUN's URL: iscsi://, iser:// or mem://.
	Target string
	// Alternates name the same IQN/LUN on other portals (multipath).
	Alternates []string
	// ReadOnly opens the LUN read-only.
	ReadOnly bool
	// TargetOptions builds the login options (initiator name, CHAP, sessions, recovery) for
	// an iSCSI/iSER target whose URL names urlUser ("" for none). It is not called for mem://.
	TargetOptions func(urlUser string) (iser.Options, error)
	// Cache configures the RAM cache; Mode Off puts none in front of the backend.
	Cache cache.Config
	// CacheDev, when set, puts a --cache-dev log between the cache and the backend. It needs
	// Cache.Mode WriteBack (the log is the write-back cache; the RAM cache above it becomes
	// write-through). Its Target is set to Target.
	CacheDev *cachedev.Options
	// Log is the process's logger (nil: none); a CacheDev without its own logs to it.
	Log *zap.Logger
}

// openISER opens an iSCSI/iSER target; a variable so that tests can stand in for a target.
var openISER = func(ctx context.Context, url string, opts iser.Options) (block.Device, error) {
	d, err := iser.Open(ctx, url, opts)
	if err != nil {
		return nil, err // not a nil *iser.Device in a non-nil interface
	}
	return d, nil
}

// ConfigError is a Config Open refuses before opening anything: a usage error of the command
// that built it.
type ConfigError struct{ Msg string }

func (e *ConfigError) Error() string { return e.Msg }

func configErrorf(format string, a ...any) error { return &ConfigError{fmt.Sprintf(format, a...)} }

// Open builds the stack of cfg with its I/O staged in p and returns its top device.
func Open(ctx context.Context, cfg Config, p *pool.Pool) (block.Device, error) {
	if cfg.Log == nil {
		cfg.Log = zap.NewNop()
	}
	if err := cfg.check(); err != nil {
		return nil, err
	}
	if err := iser.UsePool(p); err != nil {
		return nil, fmt.Errorf("registering the buffer pool for RDMA: %w", err)
	}
	target, err := cfg.openTarget(ctx)
	if err != nil {
		return nil, err
	}
	return cfg.wrap(target, p)
}

// check refuses what would fail only after logging in.
func (cfg *Config) check() error {
	if cfg.Target == "" {
		return configErrorf("--target is required")
	}
	if cfg.CacheDev != nil && cfg.Cache.Mode != cache.WriteBack {
		return configErrorf("--cache-dev needs --cache writeback (it is a write-back cache)")
	}
	if cfg.isMem() {
		if _, err := memdev.ParseURL(cfg.Target); err != nil {
			return &ConfigError{err.Error()} // memdev's own text: it names the URL and the size
		}
	}
	return nil
}

func (cfg *Config) isMem() bool { return strings.HasPrefix(cfg.Target, "mem://") }

// openTarget opens the backend: mem:// in memory, everything else through the iSCSI/iSER
// backend.
func (cfg *Config) openTarget(ctx context.Context) (block.Device, error) {
	if cfg.isMem() {
		return memdev.ParseURL(cfg.Target)
	}
	t, err := iser.ParseURL(cfg.Target)
	if err != nil {
		return nil, err
	}
	if cfg.TargetOptions == nil {
		return nil, errors.New("stack: no TargetOptions for an iSCSI target")
	}
	opts, err := cfg.TargetOptions(t.User)
	if err != nil {
		return nil, err
	}
	opts.ReadOnly = cfg.ReadOnly
	opts.AlternateTargets = cfg.Alternates
	return openISER(ctx, cfg.Target, opts)
}

// wrap puts the --cache-dev log and the cache in front of target, which it closes on failure.
// Staging buffers for write-back and read misses come from p.
func (cfg *Config) wrap(target block.Device, p *pool.Pool) (block.Device, error) {
	ccfg := cfg.Cache
	if ccfg.Mode == cache.Off {
		return target, nil
	}
	dev := target
	if cfg.CacheDev != nil {
		o := *cfg.CacheDev
		o.Target = cfg.Target
		if o.Log == nil {
			o.Log = cfg.Log
		}
		var err error
		if dev, ccfg, err = cachedev.Open(target, ccfg, o); err != nil {
			target.Close()
			return nil, err
		}
	}
	ccfg.IOPool = p
	c, err := cache.New(dev, ccfg, cfg.Log)
	if err != nil {
		if cfg.CacheDev != nil {
			_ = dev.(block.Abandoner).Abandon() // keeps the log; closes the target too
		} else {
			target.Close()
		}
		return nil, fmt.Errorf("cache: %w", err)
	}
	cfg.Log.Info("cache", zap.Stringer("mode", cfg.Cache.Mode), zap.String("size", humanize.IBytes(uint64(ccfg.Size))))
	return c, nil
}
