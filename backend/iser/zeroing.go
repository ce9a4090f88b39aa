package iser

// Discard and write zeroes: UNMAP, WRITE SAME(16) (with UNMAP, NDOB) when the LUN has them, and
// the emulation by writing zero buffers when it has not.

import (
	"context"
	"errors"
	"fmt"

	"github.com/iser-blk/iser-blk/backend/iser/scsi"
	"github.com/iser-blk/iser-blk/block"
)

// Discard implements block.Device with UNMAP (LBPU) or WRITE SAME(16) with UNMAP (LBPWS).
func (d *Device) Discard(ctx context.Context, off, length int64) error {
	if err := d.checkWrite(off, length); err != nil {
		return err
	}
	if !d.limits.CanDiscard {
		return fmt.Errorf("iser: discard: the LUN supports neither UNMAP nor WRITE SAME with UNMAP: %w", block.ErrNotSupported)
	}
	if length == 0 {
		return nil
	}
	lba, blocks := uint64(off)>>d.shift, uint64(length)>>d.shift
	n := int((blocks + d.maxUnmapBlocks - 1) / d.maxUnmapBlocks)
	return fanout(n, func(i int) error {
		plba := lba + uint64(i)*d.maxUnmapBlocks
		pn := min(d.maxUnmapBlocks, lba+blocks-plba)
		r := d.get()
		defer d.put(r)
		if d.lbpu {
			r.cmd.Unmap(scsi.EncodeUnmap(r.param[:], []scsi.UnmapDescriptor{{LBA: plba, Blocks: uint32(pn)}}))
		} else {
			r.cmd.WriteSame16(plba, uint32(pn), true, false, d.zeroBlock())
		}
		return opError("discard", int64(plba)<<d.shift, int64(pn)<<d.shift, d.run(ctx, r))
	})
}

// zeroBlock returns a shared, never-written buffer of zeroes of at least one block (it is
// also the write-zeroes emulation's source).
func (d *Device) zeroBlock() []byte { return d.zeroes()[:d.bs] }

func (d *Device) zeroes() []byte {
	d.zeroOnce.Do(func() {
		n := min(int64(d.maxXferBlocks)<<d.shift, zeroBufMax)
		n = max(n, d.bs)
		d.zeroBuf = make([]byte, n)
	})
	return d.zeroBuf
}

// WriteZeroes implements block.Device: WRITE SAME(16) (with UNMAP when the LUN deallocates to
// zeroes and the caller allows holes; with NDOB when the LUN honours it), else writes of zeroes
// unless the caller asked for FastOnly.
func (d *Device) WriteZeroes(ctx context.Context, off, length int64, flags block.ZeroFlags) error {
	if err := d.checkWrite(off, length); err != nil {
		return err
	}
	if length == 0 {
		return nil
	}
	if d.ws.Load() != wsNo {
		err := d.writeSame(ctx, off, length, flags)
		if !errors.Is(err, errWriteSameUnsupported) {
			return err
		}
	}
	if flags&block.FastOnly != 0 {
		return fmt.Errorf("iser: write zeroes: the LUN has no WRITE SAME and FastOnly was asked: %w", block.ErrNotSupported)
	}
	buf := d.zeroes()
	step := int64(len(buf))
	n := int((length + step - 1) / step)
	fua := flags&block.ZeroFUA != 0
	err := fanout(n, func(i int) error {
		lo := int64(i) * step
		return d.transfer(ctx, buf[:min(step, length-lo)], off+lo, true, fua && d.limits.CanFUA)
	})
	if err != nil || !fua || d.limits.CanFUA {
		return err
	}
	return d.syncRange(ctx, off, length)
}

var errWriteSameUnsupported = errors.New("WRITE SAME unsupported")

func (d *Device) writeSame(ctx context.Context, off, length int64, flags block.ZeroFlags) error {
	unmap := flags&block.NoHole == 0 && d.lbpws && d.lbprz
	lba, blocks := uint64(off)>>d.shift, uint64(length)>>d.shift
	piece := func(i int) error {
		plba := lba + uint64(i)*d.maxWSBlocks
		pn := min(d.maxWSBlocks, lba+blocks-plba)
		r := d.get()
		defer d.put(r)
		for {
			ndob := d.ndob.Load()
			r.cmd.WriteSame16(plba, uint32(pn), unmap, ndob, d.zeroBlock())
			err := d.run(ctx, r)
			switch {
			case err == nil:
				d.ws.CompareAndSwap(wsUnknown, wsYes)
				return nil
			case ndob && isInvalidField(err):
				d.ndob.Store(false) // the target does not honour NDOB after all
				continue
			case isInvalidOpcode(err) && d.ws.Load() != wsYes:
				d.ws.Store(wsNo)
				return errWriteSameUnsupported
			case isInvalidField(err):
				// The target refuses this form of WRITE SAME (LIO answers "invalid field in
				// CDB" for a backstore that cannot do it, even when REPORT SUPPORTED OPERATION
				// CODES lists it): the caller writes zeroes instead, and WRITE SAME is not
				// tried again on this device. Requests are already split at the LUN's
				// MAXIMUM WRITE SAME LENGTH, so a length refusal is not expected.
				d.ws.Store(wsNo)
				return errWriteSameUnsupported
			}
			return opError("write zeroes", int64(plba)<<d.shift, int64(pn)<<d.shift, err)
		}
	}
	n := int((blocks + d.maxWSBlocks - 1) / d.maxWSBlocks)
	start := 0
	if d.ws.Load() == wsUnknown {
		// Learn whether WRITE SAME works on one piece before sending the rest.
		if err := piece(0); err != nil {
			return err
		}
		start = 1
	}
	if start < n {
		if err := fanout(n-start, func(i int) error { return piece(i + start) }); err != nil {
			return err
		}
	}
	if flags&block.ZeroFUA != 0 {
		// WRITE SAME has no FUA bit.
		return d.syncRange(ctx, off, length)
	}
	return nil
}
