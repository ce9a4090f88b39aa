package cache

import (
	"fmt"
	"os"
	"strconv"
	"strings"

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

// HostMemory is MemTotal from /proc/meminfo in bytes, or 0 when it cannot be read: what SizeFor
// takes.
func HostMemory() int64 {
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
