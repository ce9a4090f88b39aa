package csipool

// Erasing a returned LUN: make every block read back as zeroes through the project's own backend
// session, make that durable, and check a sample before the LUN may be handed out again
// (erasing.go runs this in the background; the claims file keeps the LUN out of the pool
// meanwhile).
//
// How the zeroes are made is block.Device.WriteZeroes without NoHole, which backend/iser
// (zeroing.go) turns into the cheapest form the SCSI standard guarantees to read back as zeroes:
//   - WRITE SAME(16) with the UNMAP bit, when the LUN reports LBPWS and LBPRZ (SBC-4 §5.50 and
//     SBC-3 §5.42, WRITE SAME(16); §6.6.4, Logical Block Provisioning VPD page; §5.20.2, READ
//     CAPACITY(16) LBPRZ): each LBA is either deallocated, and then reads as zeroes because of
//     LBPRZ, or written with the zero block. The array does no data I/O for what it unmaps.
//   - else WRITE SAME(16) of one zero block without UNMAP (SBC-4 §5.50): the array writes the
//     zeroes itself; one block crosses the wire per command.
//   - else, when the LUN has no WRITE SAME (INVALID OPERATION CODE, or LIO's INVALID FIELD IN
//     CDB), WRITEs of a shared zero buffer, the largest the LUN takes.
//
// A plain UNMAP command is not used even with LBPRZ: UNMAP only requests deallocation (SBC-4
// §5.31, §4.7.3.4): a device server may leave LBAs mapped (those not on a whole unmap granule,
// §4.7.3.4 with the Block Limits page's OPTIMAL UNMAP GRANULARITY; a fully provisioned LUN may
// accept UNMAP and do nothing, T10 reflector, January 2015), and LBPRZ describes only the LBAs it
// did deallocate. WRITE SAME with UNMAP costs the array as little and leaves no LBA unzeroed.

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"

	"go.uber.org/zap"

	"github.com/iser-blk/iser-blk/backend/iser"
	"github.com/iser-blk/iser-blk/block"
)

// Eraser makes a LUN of the pool read back as zeroes. Erase returns nil only when every block of
// the LUN is zeroes, durably (a flush followed), and a sample read back confirms it. It is
// called for one LUN at a time per goroutine, from several goroutines at once, and must return
// soon after ctx ends.
type Eraser interface {
	Erase(ctx context.Context, lun LUN) (Erased, error)
}

// Erased is what an erase did, for the log.
type Erased struct {
	Method string // how the zeroes were made
	Bytes  int64  // the LUN's size: all of it was zeroed
}

// ISEREraser erases LUNs through backend/iser: it logs in read-write, zeroes the whole LUN
// (EraseDevice), and logs out.
type ISEREraser struct {
	// Options are the login's, as ISERProber's (the same ones in production).
	Options iser.Options
}

// Erase implements Eraser.
func (e ISEREraser) Erase(ctx context.Context, lun LUN) (Erased, error) {
	d, err := openLUN(ctx, e.Options, lun, false)
	if err != nil {
		return Erased{}, err
	}
	res, err := EraseDevice(ctx, d, zeroMethod(d.Info()))
	if cerr := d.Close(); cerr != nil && e.Options.Logger != nil {
		// The zeroes are flushed and checked already; a failed logout leaves the target to
		// time the session out.
		e.Options.Logger.Warn("logout after erasing the LUN failed", zap.String("lun", lun.Key), zap.Error(cerr))
	}
	return res, err
}

// zeroMethod says which form backend/iser's WriteZeroes (flags 0) takes on a LUN of info (the
// ladder in this file's comment).
func zeroMethod(info iser.Info) string {
	switch {
	case info.WriteSameUnmap && info.ZeroesAfterUnmap:
		return "WRITE SAME(16) with UNMAP (LBPWS, LBPRZ)"
	case info.WriteSame != "no":
		return "WRITE SAME(16) of a zero block (WRITEs of zeroes if the LUN refuses it)"
	default:
		return "WRITEs of zeroes (no WRITE SAME)"
	}
}

// Erase sizes: eraseChunk bounds one WriteZeroes call, so an erase of a large LUN notices a
// cancelled context between chunks (the backend splits each call to the LUN's own limits);
// writeChunk is the zero buffer of the plain-write fallback; sampleBytes is each region
// verifyZeroes reads, sampleRandom how many random regions it reads besides the first and last.
const (
	eraseChunk   = 1 << 30
	writeChunk   = 1 << 20
	sampleBytes  = 64 << 10
	sampleRandom = 8
)

// EraseDevice zeroes all of d: WriteZeroes (flags 0, so a LUN that deallocates to zeroes may
// deallocate) when d has it, else WriteAt of zero buffers; then Flush, so the zeroes survive a
// power loss of the array before the LUN is handed out; then verifyZeroes. method names what
// WriteZeroes does on d, for the result.
func EraseDevice(ctx context.Context, d block.Device, method string) (Erased, error) {
	lim := d.Limits()
	if lim.ReadOnly {
		return Erased{}, fmt.Errorf("erase: the LUN is read-only: %w", block.ErrReadOnly)
	}
	size, bs := d.Size(), int64(d.BlockSize())
	res := Erased{Method: method, Bytes: size}
	zeroed := false
	if lim.CanWriteZeroes {
		chunk := int64(eraseChunk)
		if lim.MaxWriteZeroes > 0 {
			chunk = min(chunk, lim.MaxWriteZeroes)
		}
		chunk = max(chunk/bs*bs, bs)
		var err error
		for off := int64(0); off < size && err == nil; off += chunk {
			err = d.WriteZeroes(ctx, off, min(chunk, size-off), 0)
		}
		switch {
		case err == nil:
			zeroed = true
		case !errors.Is(err, block.ErrNotSupported):
			return Erased{}, fmt.Errorf("erase: %s: %w", method, err)
		}
	}
	if !zeroed {
		res.Method = "WRITEs of zeroes"
		n := int64(writeChunk)
		if lim.MaxTransfer > 0 {
			n = min(n, lim.MaxTransfer)
		}
		n = max(n/bs*bs, bs)
		zeroes := make([]byte, n)
		for off := int64(0); off < size; off += n {
			if err := d.WriteAt(ctx, zeroes[:min(n, size-off)], off, 0); err != nil {
				return Erased{}, fmt.Errorf("erase: %s: %w", res.Method, err)
			}
		}
	}
	if lim.CanFlush {
		if err := d.Flush(ctx); err != nil {
			return Erased{}, fmt.Errorf("erase: flushing the zeroes: %w", err)
		}
	}
	if err := verifyZeroes(ctx, d); err != nil {
		return Erased{}, fmt.Errorf("erase by %s: %w", res.Method, err)
	}
	return res, nil
}

// verifyZeroes reads the first and the last sampleBytes of d and sampleRandom regions at random
// offsets, and fails on any byte that is not zero. A sample, not a proof: it catches a target
// that acknowledged the zeroing without doing it (a WRITE SAME ignored, a cache lost), at the
// cost of a few reads instead of the whole LUN.
func verifyZeroes(ctx context.Context, d block.Device) error {
	size, bs := d.Size(), int64(d.BlockSize())
	n := min(int64(sampleBytes), size)
	if lim := d.Limits().MaxTransfer; lim > 0 {
		n = min(n, lim)
	}
	n = max(n/bs*bs, bs)
	offs := []int64{0, size - n}
	for range sampleRandom {
		offs = append(offs, rand.Int64N((size-n)/bs+1)*bs)
	}
	buf := make([]byte, n)
	for _, off := range offs {
		if err := d.ReadAt(ctx, buf, off); err != nil {
			return fmt.Errorf("reading back at %d: %w", off, err)
		}
		if i := firstNonZero(buf); i >= 0 {
			return fmt.Errorf("the LUN is not zeroes after the erase: byte %d is not zero", off+int64(i))
		}
	}
	return nil
}

// firstNonZero is the index of b's first byte that is not zero, or -1.
func firstNonZero(b []byte) int {
	for i, c := range b {
		if c != 0 {
			return i
		}
	}
	return -1
}
