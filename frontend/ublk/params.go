package ublk

import (
	"fmt"
	"math/bits"
	"runtime"

	"github.com/iser-blk/iser-blk/block"
)

const (
	sectorShift = 9
	pageSize    = 4096
	// defaultMaxIO caps the per-request size (and so the per-tag buffer) when the device allows
	// more: queues × depth buffers of this size are allocated up front.
	defaultMaxIO = DefaultMaxIO
)

// Defaults of Options.
const (
	DefaultMaxIO = 512 << 10
	DefaultDepth = 64
)

// DefaultQueues is the queue count used when Options.Queues is 0: one per CPU, at most 4.
func DefaultQueues() int { return min(runtime.NumCPU(), 4) }

// log2 returns the exponent of a power of two, or -1.
func log2(v int64) int {
	if v <= 0 || v&(v-1) != 0 {
		return -1
	}
	return bits.TrailingZeros64(uint64(v))
}

// maxIOFor picks the per-request byte limit: the device's MaxTransfer capped by want (or
// defaultMaxIO) and by the driver's 32 MiB, rounded down to a whole page and logical block.
func maxIOFor(lim block.Limits, want int) int {
	n := int64(want)
	if n <= 0 {
		n = defaultMaxIO
	}
	if lim.MaxTransfer > 0 && lim.MaxTransfer < n {
		n = lim.MaxTransfer
	}
	if n > maxIOBufBytes {
		n = maxIOBufBytes
	}
	unit := int64(pageSize)
	if int64(lim.LogicalBlockSize) > unit {
		unit = int64(lim.LogicalBlockSize)
	}
	n -= n % unit
	return int(n)
}

// buildParams translates a Device's size and Limits into ublk parameters (ublk_cmd.h struct
// ublk_params; validated by the driver's ublk_validate_params). maxIO is the per-request byte
// limit already agreed with the driver (DevInfo.MaxIOBufBytes).
func buildParams(size int64, lim block.Limits, maxIO int) (Params, error) {
	var p Params
	lbs := int64(lim.LogicalBlockSize)
	lshift := log2(lbs)
	if lshift < sectorShift || lshift > 12 {
		return p, fmt.Errorf("ublk: logical block size %d is not a power of two in [512, 4096]: %w", lbs, block.ErrInvalid)
	}
	pbs := int64(lim.PhysicalBlockSize)
	if pbs < lbs {
		pbs = lbs
	}
	pshift := log2(pbs)
	if pshift < 0 {
		return p, fmt.Errorf("ublk: physical block size %d is not a power of two: %w", pbs, block.ErrInvalid)
	}
	if size <= 0 || size%lbs != 0 {
		return p, fmt.Errorf("ublk: device size %d is not a positive multiple of %d: %w", size, lbs, block.ErrInvalid)
	}
	if maxIO < int(lbs) || maxIO%int(lbs) != 0 {
		return p, fmt.Errorf("ublk: max transfer %d is not a multiple of the block size %d: %w", maxIO, lbs, block.ErrInvalid)
	}
	p.Types = paramTypeBasic
	b := &p.Basic
	b.LogicalBSShift = uint8(lshift)
	b.PhysicalBSShift = uint8(pshift)
	b.IOMinShift = uint8(pshift)
	if s := log2(lim.OptimalTransfer); s >= pshift && lim.OptimalTransfer <= int64(maxIO) {
		b.IOOptShift = uint8(s)
	}
	b.MaxSectors = uint32(maxIO >> sectorShift)
	b.DevSectors = uint64(size >> sectorShift)
	if lim.ReadOnly {
		b.Attrs |= attrReadOnly
	}
	if lim.Rotational {
		b.Attrs |= attrRotational
	}
	if lim.VolatileCache {
		b.Attrs |= attrVolatileCache
		if lim.CanFUA {
			b.Attrs |= attrFUA
		}
	}

	if !lim.ReadOnly && (lim.CanDiscard || lim.CanWriteZeroes) {
		p.Types |= paramTypeDiscard
		d := &p.Discard
		gran := lim.DiscardAlignment
		if gran <= 0 {
			gran = lbs
		}
		if gran > 1<<31 {
			return p, fmt.Errorf("ublk: discard granularity %d too large: %w", gran, block.ErrInvalid)
		}
		d.DiscardGranularity = uint32(gran)
		if lim.CanDiscard {
			d.MaxDiscardSectors = capSectors(lim.MaxDiscard, gran)
			d.MaxDiscardSegments = 1 // the driver supports single-range discards only
		}
		if lim.CanWriteZeroes {
			d.MaxWriteZeroesSectors = capSectors(lim.MaxWriteZeroes, lbs)
		}
	}
	return p, nil
}

// capSectors converts a byte limit (0: none) to a sector count that fits the u32 field and is a
// multiple of unit.
func capSectors(limit, unit int64) uint32 {
	const most = int64(^uint32(0)) << sectorShift
	if limit <= 0 || limit > most {
		limit = most
	}
	limit -= limit % unit
	return uint32(limit >> sectorShift)
}
