package cache

import (
	"context"
	"fmt"

	"github.com/iser-blk/iser-blk/block"
)

// Write-around: a write of at least Config.WriteAround bytes goes from the caller's buffer
// straight to the backend instead of through the pages (bcache's sequential cutoff, by request
// size). Caching it would copy every byte twice (into pages, then into a write-back's staging
// buffer) and book every page, which made write-back half as fast as no cache for large
// sequential writes; a request this large gains nothing from coalescing, and what it writes is
// rarely read back soon.
//
// It is a direct operation (see direct.go) with one difference: the dirty pages it overlaps are
// not dropped but overwritten with the new data and stay dirty (supersede). So nothing
// acknowledged ever leaves the cache before the write that replaces it reached the backend: a
// Flush that started before still finds the page dirty and waits for it, and what is written
// back afterwards is the newer data. Clean cached sectors of the range are dropped, fills of the
// range in flight do not install (the invalidation bumps invalSeq), write-backs of the range in
// flight finish before the backend write is issued and none starts until it returned, so the
// backend never sees an older write-back land after it. The backend write carries FUA when the
// caller asked for it (or is followed by a backend Flush when the backend has no FUA).

// writesAround reports whether a write of n bytes goes around the pages.
func (c *Cache) writesAround(n int) bool {
	return c.cfg.WriteAround > 0 && int64(n) >= c.cfg.WriteAround
}

// writeAround writes p (non-empty, in range) at off to the backend, keeping the cached pages of
// the range consistent with it (see above).
func (c *Cache) writeAround(ctx context.Context, p []byte, off int64, flags block.WriteFlags) error {
	length := int64(len(p))
	defer c.endDirect(off, length)
	if err := c.beginDirect(ctx, off, length, supersede, p); err != nil {
		return err
	}
	fua := flags&block.FUA != 0
	var beFlags block.WriteFlags
	if fua && c.lim.CanFUA {
		beFlags = block.FUA
	}
	for pos := int64(0); pos < length; {
		n := length - pos
		if mt := c.lim.MaxTransfer; mt > 0 && n > mt {
			n = mt / c.bs * c.bs
		}
		if err := c.be.WriteAt(ctx, p[pos:pos+n], off+pos, beFlags); err != nil {
			return fmt.Errorf("cache: write-around [%d, +%d): %w", off+pos, n, err)
		}
		pos += n
	}
	if fua && beFlags == 0 && c.lim.CanFlush {
		if err := c.be.Flush(ctx); err != nil {
			return fmt.Errorf("cache: flush for FUA emulation: %w", err)
		}
	}
	c.st.writeAround.Add(uint64(length))
	return nil
}
