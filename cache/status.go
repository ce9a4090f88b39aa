package cache

import (
	"github.com/iser-blk/iser-blk/block"
	"github.com/iser-blk/iser-blk/internal/status"
)

// Backend is the device the cache is in front of, for the status of the layers below it.
func (c *Cache) Backend() block.Device { return c.be }

// Below is Backend (block.Layered).
func (c *Cache) Below() block.Device { return c.be }

// CacheStatus implements status.CacheProvider: the cache's part of `iser-blk status` and of the
// metrics, read from the same counters as Stats (off the data path).
func (c *Cache) CacheStatus() status.Cache {
	s := c.Stats()
	st := status.Cache{
		Mode:             s.Mode,
		CapacityBytes:    uint64(s.SizeBytes),
		UsedBytes:        uint64(s.CachedBytes),
		DirtyBytes:       uint64(max(s.DirtyBytes, 0)),
		DirtyLimitBytes:  uint64(max(s.DirtyLimitBytes, 0)),
		Hits:             s.Hits,
		Misses:           s.Misses,
		WrittenBackBytes: s.WriteBackBytes,
		ThrottledSeconds: s.ThrottledTime.Seconds(),
		WriteBackErrors:  s.WriteBackErrors,
	}
	if s.LastWriteBackError != "" {
		at := s.LastWriteBackErrorAt
		st.LastWriteBackError, st.LastWriteBackAt = s.LastWriteBackError, &at
	}
	st.SetHitRatio()
	if d, ok := c.be.(interface{ CacheDeviceStatus() status.CacheDevice }); ok {
		ds := d.CacheDeviceStatus()
		st.Device = &ds
		st.DirtyBytes += ds.DirtyBytes // what the target lacks, wherever it is held
	}
	return st
}
