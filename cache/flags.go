package cache

import (
	"fmt"

	"github.com/dustin/go-humanize"
)

// Flags are the cache's command-line flags as given: --cache, --cache-size and --cache-dirty
// (ParseConfig) and the cutoffs --cache-write-around and --cache-read-around (sizes; 0 turns
// one off). An empty string means the default.
type Flags struct {
	Mode, Size, Dirty       string
	WriteAround, ReadAround string
}

// Config parses the flags into a Config; errors name the flag.
func (f Flags) Config() (Config, error) {
	cfg, err := ParseConfig(f.Mode, f.Size, f.Dirty)
	if err != nil {
		return cfg, err
	}
	if cfg.WriteAround, err = parseCutoff("--cache-write-around", f.WriteAround); err != nil {
		return cfg, err
	}
	cfg.ReadAround, err = parseCutoff("--cache-read-around", f.ReadAround)
	return cfg, err
}

// parseCutoff parses a size flag where 0 disables (Config's -1) and "" is the default (0).
func parseCutoff(name, v string) (int64, error) {
	if v == "" {
		return 0, nil
	}
	n, err := humanize.ParseBytes(v)
	if err != nil || n > 1<<40 {
		return 0, fmt.Errorf("%s %q: want a size", name, v)
	}
	if n == 0 {
		return -1, nil
	}
	return int64(n), nil
}
