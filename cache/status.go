package cache

import "github.com/iser-blk/iser-blk/internal/status"

// CacheStatus implements status.CacheProvider: the cache's part of `iser-blk status` and of the
// metrics, read from the same counters as Stats (off the data path).
func (c *Cache) CacheStatus() status.Cache {
	s := c.Stats()
	st := status.Cache{
		Mode:             s.Mode,
		CapacityBytes:    uint64(s.SizeBytes),
		UsedBytes:        uint64(s.CachedBytes),
		DirtyBytes:       uint64(max(s.DirtyBytes, 0)),
		Hits:             s.Hits,
		Misses:           s.Misses,
		WrittenBackBytes: s.WriteBackBytes,
	}
	st.SetHitRatio()
	return st
}
