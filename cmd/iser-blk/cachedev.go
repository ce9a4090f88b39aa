package main

// --cache-dev: a persistent write-back log on a local file or block device (cache/journal) under
// the RAM cache, which then writes through to it.

import (
	"fmt"
	"path/filepath"
	"strings"

	"github.com/dustin/go-humanize"
	"github.com/spf13/pflag"
	"go.uber.org/zap"

	"github.com/iser-blk/iser-blk/backend/iser"
	"github.com/iser-blk/iser-blk/block"
	"github.com/iser-blk/iser-blk/cache"
	"github.com/iser-blk/iser-blk/cache/journal"
)

// cacheDevFlags are --cache-dev, --cache-dev-size and --cache-dev-format.
type cacheDevFlags struct {
	path, size string
	format     bool
}

func (f *cacheDevFlags) register(fs *pflag.FlagSet) {
	fs.StringVar(&f.path, "cache-dev", "", "a local file or block device that keeps written data durably (with --cache writeback):\n"+
		"FLUSH and FUA complete once it is durable there, not on the target, and the data is written\n"+
		"back later; it survives kill -9 and power loss, not the loss of that device (docs/cache-dev.md)")
	fs.StringVar(&f.size, "cache-dev-size", "4GiB", "the size of a --cache-dev file that does not exist yet or is empty")
	fs.BoolVar(&f.format, "cache-dev-format", false, "format a --cache-dev that holds another LUN's cache or other data\n"+
		"(what it held is lost)")
}

// absPath is --cache-dev as an absolute path ("" without one): what a state file records.
func (f *cacheDevFlags) absPath() (string, error) {
	if f.path == "" {
		return "", nil
	}
	p, err := filepath.Abs(f.path)
	if err != nil {
		return "", usagef("--cache-dev %q: %v", f.path, err)
	}
	return p, nil
}

// open puts the journal of --cache-dev in front of target and returns it with the RAM cache's
// configuration adjusted: write-through onto the journal (whose log is the write-back cache),
// its page memory less the journal's index. Without --cache-dev it returns target and cfg.
func (f *cacheDevFlags) open(target block.Device, cfg cache.Config, rawTarget string, log *zap.Logger) (block.Device, cache.Config, error) {
	if f.path == "" {
		return target, cfg, nil
	}
	if cfg.Mode != cache.WriteBack {
		return nil, cfg, usagef("--cache-dev needs --cache writeback (it is a write-back cache)")
	}
	size, err := humanize.ParseBytes(f.size)
	if err != nil || size > 1<<50 {
		return nil, cfg, usagef("--cache-dev-size %q: want a size", f.size)
	}
	j, err := journal.OpenPath(f.path, int64(size), target, lunIdentity(target, rawTarget),
		journal.Options{Format: f.format, WriteAround: cfg.WriteAround, Log: log.Named("cache-dev")})
	if err != nil {
		return nil, cfg, err
	}
	idx := j.Stats().IndexMemory
	cfg.Mode = cache.WriteThrough
	cfg.Size = max(cfg.Size-int64(idx), cache.MinAutoSize/4)
	log.Info("cache device", zap.String("path", f.path), zap.String("log", humanize.IBytes(j.Stats().Capacity)),
		zap.String("index memory", humanize.IBytes(uint64(idx))))
	return j, cfg, nil
}

// lunIdentity names the LUN for the cache device's superblock: its IQN and LUN number (not the
// portal, which multipath and a moved target change) and its WWN when the target reports one.
func lunIdentity(target block.Device, raw string) journal.Identity {
	id := journal.Identity{URL: iser.RedactURL(raw)}
	if t, err := iser.ParseURL(raw); err == nil && !strings.HasPrefix(raw, "mem://") {
		id.URL = fmt.Sprintf("%s/%d", t.IQN, t.LUN)
	}
	if d, ok := target.(interface{ Info() iser.Info }); ok {
		id.WWN = d.Info().WWN
	}
	return id
}
