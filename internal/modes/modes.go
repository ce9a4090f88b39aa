// Package modes holds the two enumerations the layers share: the kind of frontend a gateway
// serves through and the mode of its cache. The state file (internal/statefile), the status
// schema (internal/status), the cache (cache.Mode is modes.Cache) and the lifecycle packages all
// use these types, so a spelling cannot drift between them.
//
// Invariants: each value's text is the one the status schema, the state file and the --cache flag
// use; Parse and UnmarshalText accept exactly the values String produces (plus --cache's short
// aliases for Cache) and reject anything else with an error.
package modes

import (
	"fmt"
	"strings"
)

// Frontend is the kind of frontend a gateway serves through.
type Frontend string

// The frontends. NBD and Ublk are kernel block devices a state file can name; NBDSocket is
// `serve`'s NBD export on a socket.
const (
	NBDSocket Frontend = "nbd-socket"
	NBD       Frontend = "nbd"
	Ublk      Frontend = "ublk"
)

// KernelDevice reports whether f is a kernel block device (one a successor can take over).
func (f Frontend) KernelDevice() bool { return f == NBD || f == Ublk }

// Cache is how the cache treats writes. The zero value is WriteBack, the default.
type Cache int

const (
	// WriteBack acknowledges writes once they are in cache pages; Flush and FUA make them
	// durable. The cache advertises a volatile write cache.
	WriteBack Cache = iota
	// WriteThrough acknowledges a write only after the backend accepted it; reads are cached.
	WriteThrough
	// Off removes the cache.
	Off
)

func (m Cache) String() string {
	switch m {
	case WriteBack:
		return "writeback"
	case WriteThrough:
		return "writethrough"
	case Off:
		return "off"
	}
	return fmt.Sprintf("Cache(%d)", int(m))
}

// ParseCache parses a --cache value: writeback (wb, or empty), writethrough (wt), off (none).
func ParseCache(s string) (Cache, error) {
	switch strings.ToLower(strings.TrimSpace(s)) {
	case "", "writeback", "wb":
		return WriteBack, nil
	case "writethrough", "wt":
		return WriteThrough, nil
	case "off", "none":
		return Off, nil
	}
	return 0, fmt.Errorf("cache mode %q: want writeback, writethrough or off", s)
}

// MarshalText is String, for JSON (the status schema and the state file spell it so).
func (m Cache) MarshalText() ([]byte, error) {
	switch m {
	case WriteBack, WriteThrough, Off:
		return []byte(m.String()), nil
	}
	return nil, fmt.Errorf("cache mode %d has no name", int(m))
}

// UnmarshalText accepts exactly what MarshalText produces: a file or document is not a flag.
func (m *Cache) UnmarshalText(b []byte) error {
	for _, c := range []Cache{WriteBack, WriteThrough, Off} {
		if string(b) == c.String() {
			*m = c
			return nil
		}
	}
	return fmt.Errorf("cache mode %.40q: want writeback, writethrough or off", b)
}
