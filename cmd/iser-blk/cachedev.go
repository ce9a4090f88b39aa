package main

// --cache-dev's flags (internal/stack puts the log into the stack, through internal/cachedev).

import (
	"path/filepath"

	"github.com/dustin/go-humanize"
	"github.com/spf13/pflag"
	"go.uber.org/zap"

	"github.com/iser-blk/iser-blk/internal/cachedev"
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

// options parses --cache-dev-size into the options of internal/cachedev.
func (f *cacheDevFlags) options(log *zap.Logger) (cachedev.Options, error) {
	size, err := humanize.ParseBytes(f.size)
	if err != nil || size > 1<<50 {
		return cachedev.Options{}, usagef("--cache-dev-size %q: want a size", f.size)
	}
	return cachedev.Options{Path: f.path, NewSize: int64(size), Format: f.format, Log: log}, nil
}
