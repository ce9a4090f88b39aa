package nbd

import (
	"errors"

	"go.uber.org/zap"

	"github.com/iser-blk/iser-blk/block"
)

// execute runs one validated request against the device and records its NBD error value.
func (c *conn) execute(r *request) {
	ctx := c.s.ioCtx
	dev := c.s.dev
	off := int64(r.Offset)
	var err error
	switch r.Type {
	case cmdRead:
		if err = c.reserve(r); err != nil {
			break
		}
		left := int(r.Length)
		for left > 0 && err == nil {
			l := min(left, c.s.seg)
			var b []byte
			b, err = c.s.pool.Get(ctx, l)
			if err != nil {
				break
			}
			r.bufs = append(r.bufs, b)
			err = dev.ReadAt(ctx, b, off)
			off += int64(l)
			left -= l
		}
	case cmdWrite:
		var wf block.WriteFlags
		if r.Flags&cmdFlagFUA != 0 {
			wf = block.FUA
		}
		for _, b := range r.bufs {
			if err = dev.WriteAt(ctx, b, off, wf); err != nil {
				break
			}
			off += int64(len(b))
		}
	case cmdFlush:
		err = dev.Flush(ctx)
	case cmdTrim:
		err = c.splitRange(off, int64(r.Length), dev.Limits().MaxDiscard, func(o, l int64) error {
			return dev.Discard(ctx, o, l)
		})
		if err == nil && r.Flags&cmdFlagFUA != 0 {
			err = dev.Flush(ctx)
		}
	case cmdWriteZeroes:
		var zf block.ZeroFlags
		if r.Flags&cmdFlagNoHole != 0 {
			zf |= block.NoHole
		}
		if r.Flags&cmdFlagFastZero != 0 {
			zf |= block.FastOnly
		}
		if r.Flags&cmdFlagFUA != 0 {
			zf |= block.ZeroFUA
		}
		err = c.splitRange(off, int64(r.Length), dev.Limits().MaxWriteZeroes, func(o, l int64) error {
			return dev.WriteZeroes(ctx, o, l, zf)
		})
	case cmdCache:
		// A prefetch hint (proto.md "NBD_CMD_CACHE"): succeeding without doing anything is
		// allowed; the cache layer does its own read-ahead.
	}
	if err != nil {
		r.errno = wireErrno(err)
		if !(r.Type == cmdWriteZeroes && errors.Is(err, block.ErrNotSupported)) {
			c.log.Warn("nbd request failed", zap.Uint16("cmd", r.Type), zap.Uint64("offset", r.Offset),
				zap.Uint32("length", r.Length), zap.Error(err))
		}
	}
}

// splitRange calls fn over [off, off+length) in pieces no larger than limit (0: one piece),
// keeping every piece a multiple of the block size.
func (c *conn) splitRange(off, length, limit int64, fn func(o, l int64) error) error {
	bs := int64(c.s.dev.BlockSize())
	if limit > 0 {
		limit -= limit % bs
	}
	if limit <= 0 {
		limit = length
	}
	for length > 0 {
		l := min(length, limit)
		if err := fn(off, l); err != nil {
			return err
		}
		off += l
		length -= l
	}
	return nil
}
