package iser

// Data I/O: READ and WRITE (split at the transfer limit, FUA native or emulated) and
// SYNCHRONIZE CACHE, each request checked before anything is sent.

import (
	"context"
	"fmt"

	"github.com/iser-blk/iser-blk/backend/iser/scsi"
	"github.com/iser-blk/iser-blk/block"
)

// check is the entry check of every request: open, in range, aligned.
func (d *Device) check(off, length int64) error {
	if d.closed.Load() {
		return block.ErrClosed
	}
	return block.CheckRange(d, off, length)
}

func (d *Device) checkWrite(off, length int64) error {
	if err := d.check(off, length); err != nil {
		return err
	}
	if d.limits.ReadOnly {
		return fmt.Errorf("iser: %s: %w", d.info.URL, block.ErrReadOnly)
	}
	return nil
}

// ReadAt implements block.Device.
func (d *Device) ReadAt(ctx context.Context, p []byte, off int64) error {
	if err := d.check(off, int64(len(p))); err != nil {
		return err
	}
	return d.transfer(ctx, p, off, false, false)
}

// WriteAt implements block.Device. Without native FUA (MODE SENSE DPOFUA clear) a FUA write is a
// WRITE followed by SYNCHRONIZE CACHE of its range.
func (d *Device) WriteAt(ctx context.Context, p []byte, off int64, flags block.WriteFlags) error {
	if err := d.checkWrite(off, int64(len(p))); err != nil {
		return err
	}
	fua := flags&block.FUA != 0
	if !fua || d.limits.CanFUA {
		return d.transfer(ctx, p, off, true, fua)
	}
	if err := d.transfer(ctx, p, off, true, false); err != nil {
		return err
	}
	return d.syncRange(ctx, off, int64(len(p)))
}

// transfer reads or writes p at off, splitting at the per-command limit.
func (d *Device) transfer(ctx context.Context, p []byte, off int64, write, fua bool) error {
	if len(p) == 0 {
		return nil
	}
	maxBytes := int64(d.maxXferBlocks) << d.shift
	if int64(len(p)) <= maxBytes {
		return d.transferOne(ctx, p, off, write, fua)
	}
	n := int((int64(len(p)) + maxBytes - 1) / maxBytes)
	return fanout(n, func(i int) error {
		lo := int64(i) * maxBytes
		hi := min(lo+maxBytes, int64(len(p)))
		return d.transferOne(ctx, p[lo:hi], off+lo, write, fua)
	})
}

// buildRW fills cmd with the READ or WRITE of p at byte offset off: the 16-byte CDBs when the
// LUN needs (or was probed to take) them, the 10-byte ones otherwise.
func (d *Device) buildRW(cmd *scsi.Command, p []byte, off int64, write, fua bool) {
	lba := uint64(off) >> d.shift
	blocks := uint64(len(p)) >> d.shift
	switch {
	case write && d.use16:
		cmd.Write16(lba, uint32(blocks), fua, p)
	case write:
		cmd.Write10(uint32(lba), uint16(blocks), fua, p)
	case d.use16:
		cmd.Read16(lba, uint32(blocks), false, p)
	default:
		cmd.Read10(uint32(lba), uint16(blocks), false, p)
	}
}

func (d *Device) transferOne(ctx context.Context, p []byte, off int64, write, fua bool) error {
	r := d.get()
	defer d.put(r)
	d.buildRW(&r.cmd, p, off, write, fua)
	if err := d.run(ctx, r); err != nil {
		if write {
			return opError("write", off, int64(len(p)), err)
		}
		return opError("read", off, int64(len(p)), err)
	}
	if r.resp.Residual != 0 {
		// A GOOD status that moved fewer (or more) bytes than asked is a lying or broken target;
		// a short read must never look like success.
		op := "read"
		if write {
			op = "write"
		}
		return fmt.Errorf("iser: %s [%d, +%d): target reported residual %d: %w", op, off, len(p), r.resp.Residual, block.ErrIO)
	}
	return nil
}

// Flush implements block.Device: SYNCHRONIZE CACHE of the whole LUN on one session, which covers
// writes completed on every session (the cache belongs to the logical unit).
func (d *Device) Flush(ctx context.Context) error {
	if d.closed.Load() {
		return block.ErrClosed
	}
	return d.syncCache(ctx, 0, 0)
}

// syncRange makes [off, +n) durable when the LUN has a volatile cache.
func (d *Device) syncRange(ctx context.Context, off, n int64) error {
	if !d.volatile || n == 0 {
		return nil
	}
	lba := uint64(off) >> d.shift
	blocks := uint64(n) >> d.shift
	if blocks > 0xFFFFFFFF {
		blocks = 0 // to the end of the medium
	}
	return d.syncCache(ctx, lba, blocks)
}

func (d *Device) syncCache(ctx context.Context, lba, blocks uint64) error {
	r := d.get()
	defer d.put(r)
	for {
		use10 := d.sync10.Load() || !d.use16
		if use10 {
			b10 := blocks
			if lba > 0xFFFFFFFF {
				// SYNCHRONIZE CACHE(10) cannot address it: flush everything.
				lba, b10 = 0, 0
			} else if b10 > 0xFFFF {
				b10 = 0
			}
			r.cmd.SynchronizeCache10(uint32(lba), uint16(b10))
		} else {
			r.cmd.SynchronizeCache16(lba, uint32(blocks))
		}
		err := d.run(ctx, r)
		if err != nil && !use10 && isInvalidOpcode(err) {
			d.sync10.Store(true)
			continue
		}
		return opError("flush", int64(lba)<<d.shift, int64(blocks)<<d.shift, err)
	}
}
