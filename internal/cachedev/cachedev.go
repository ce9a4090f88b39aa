// Package cachedev puts a --cache-dev log (cache/journal) into a gateway's device stack: it
// names the LUN for the cache device's superblock, opens the journal in front of the target and
// turns the RAM cache above it to write-through (the log is the write-back cache), its page
// memory less the journal's index. cmd/iser-blk parses the flags into Options.
package cachedev

import (
	"fmt"
	"strings"

	"go.uber.org/zap"

	"github.com/iser-blk/iser-blk/backend/iser"
	"github.com/iser-blk/iser-blk/block"
	"github.com/iser-blk/iser-blk/cache"
	"github.com/iser-blk/iser-blk/cache/journal"
)

// Options are --cache-dev's, parsed.
type Options struct {
	Path    string // the cache device
	NewSize int64  // --cache-dev-size: the size of a file that does not exist yet or is empty
	Format  bool   // --cache-dev-format
	Target  string // the --target URL the LUN was opened with
	Log     *zap.Logger
}

// Open puts the journal of o.Path in front of target and returns it with the RAM cache's
// configuration cfg (write-back, as the caller checked) adjusted for it. On failure target is
// left open for the caller.
func Open(target block.Device, cfg cache.Config, o Options) (block.Device, cache.Config, error) {
	j, err := journal.OpenPath(o.Path, o.NewSize, target, Identity(target, o.Target),
		journal.Options{Format: o.Format, WriteAround: cfg.WriteAround, Log: o.Log.Named("cache-dev")})
	if err != nil {
		return nil, cfg, err
	}
	cfg.Mode = cache.WriteThrough
	cfg.Size = max(cfg.Size-int64(j.Stats().IndexMemory), cache.MinAutoSize/4)
	return j, cfg, nil
}

// Identity names the LUN for the cache device's superblock: its IQN and LUN number (not the
// portal, which multipath and a moved target change) and its WWN when the target reports one.
func Identity(target block.Device, raw string) journal.Identity {
	id := journal.Identity{URL: iser.RedactURL(raw)}
	if t, err := iser.ParseURL(raw); err == nil && !strings.HasPrefix(raw, "mem://") {
		id.URL = fmt.Sprintf("%s/%d", t.IQN, t.LUN)
	}
	if d, ok := target.(interface{ Info() iser.Info }); ok {
		id.WWN = d.Info().WWN
	}
	return id
}
