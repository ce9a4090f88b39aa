package iser

import (
	"fmt"
	"math/bits"

	"github.com/iser-blk/iser-blk/backend/iser/scsi"
	"github.com/iser-blk/iser-blk/block"
)

// probeReport is what the SCSI conversation at Open (probe.go) learnt about the LUN; the zero
// value of each part is what a target that did not answer is assumed to have.
type probeReport struct {
	capacity    scsi.Capacity
	use16       bool             // READ CAPACITY(16) worked: 16-byte CDBs
	blockLimits scsi.BlockLimits // VPD 0xB0 (zero: none reported)
	lbp         scsi.LogicalBlockProvisioning
	haveLBP     bool           // VPD 0xB2 decoded
	rotational  bool           // VPD 0xB1
	mode        scsi.ModeSense // MODE SENSE(10)
	modeOK      bool           // ... answered and decoded
	writeSame   int32          // wsUnknown, wsYes or wsNo
	ndob        bool           // WRITE SAME(16) honours NDOB
}

// derivedLimits is what the Device keeps from a probeReport.
type derivedLimits struct {
	shift          uint   // log2 of the logical block size
	maxXferBlocks  uint64 // one command's data
	maxUnmapBlocks uint64 // one UNMAP descriptor (or WRITE SAME with UNMAP)
	maxWSBlocks    uint64 // one WRITE SAME
	lbprz          bool   // unmapped blocks read as zeroes
	lbpu           bool   // UNMAP works
	lbpws          bool   // WRITE SAME with UNMAP works
	volatile       bool   // a volatile write cache: flushes are sent
	limits         block.Limits
}

// deriveLimits turns what the LUN reported into the Device's limits, without I/O: the transfer
// limit (the LUN's MAXIMUM TRANSFER LENGTH below maxSaneTransfer, capBytes (Options and
// transports; 0: none), 0xFFFF blocks without 16-byte CDBs, aligned to physical blocks), discard
// and write-zeroes capabilities (SBC-4 §6.6.4, §6.6.6), the cache and FUA from MODE SENSE. It
// fails only when capBytes is smaller than a block.
func deriveLimits(rep probeReport, capBytes int64, readOnly bool) (derivedLimits, error) {
	c, bl := rep.capacity, rep.blockLimits
	var out derivedLimits
	out.shift = uint(bits.TrailingZeros32(c.BlockSize))
	out.maxXferBlocks = maxTransferBlocks(rep, capBytes, out.shift)
	if out.maxXferBlocks == 0 {
		return out, fmt.Errorf("iser: transfer cap %d bytes is smaller than a %d-byte block: %w", capBytes, c.BlockSize, block.ErrInvalid)
	}

	out.lbprz = c.LBPRZ || (rep.haveLBP && rep.lbp.LBPRZ != 0)
	// A Block Limits page long enough to carry the UNMAP limits but with either at zero says
	// UNMAP is not implemented after all (SBC-4 §6.6.4), whatever LBPU claims.
	unmapLimitsZero := bl.Length >= 24 && (bl.MaxUnmapLBACount == 0 || bl.MaxUnmapDescriptorCount == 0)
	out.lbpu = rep.haveLBP && rep.lbp.LBPU && !unmapLimitsZero
	out.lbpws = rep.haveLBP && rep.lbp.LBPWS
	out.maxUnmapBlocks = 0xFFFFFFFF
	if bl.MaxUnmapLBACount != 0 {
		out.maxUnmapBlocks = uint64(bl.MaxUnmapLBACount)
	}
	if !out.lbpu {
		// Discard through WRITE SAME(16) with UNMAP follows WRITE SAME's limit.
		out.maxUnmapBlocks = min(out.maxUnmapBlocks, wsLimit(bl))
	}
	out.maxWSBlocks = wsLimit(bl)
	// Without MODE SENSE or its caching page, assume a volatile cache: flushes are sent.
	out.volatile = !rep.modeOK || !rep.mode.CachingPage || rep.mode.WCE
	out.limits = blockLimits(rep, out, readOnly)
	return out, nil
}

// maxTransferBlocks is one command's data limit in blocks (0: capBytes is below a block).
func maxTransferBlocks(rep probeReport, capBytes int64, shift uint) uint64 {
	c, bl := rep.capacity, rep.blockLimits
	maxX := uint64(defaultMaxTransfer) >> shift
	if bl.MaxTransferLength != 0 {
		// Some targets report their backstore's limit (LIO's RAM disk: 2 TiB). A command larger
		// than maxSaneTransfer gains no throughput and ties up a huge slice of the caller's
		// memory in one task, so the stated limit is honoured only below it.
		maxX = min(uint64(bl.MaxTransferLength), uint64(maxSaneTransfer)>>shift)
	}
	if capBytes > 0 {
		maxX = min(maxX, uint64(capBytes)>>shift)
	}
	if !rep.use16 {
		maxX = min(maxX, 0xFFFF)
	}
	maxX = min(maxX, 0xFFFFFFFF)
	// Keep pieces aligned to physical blocks when that costs nothing.
	if pb := uint64(1) << c.PhysBlockExponent; c.PhysBlockExponent <= 16 && maxX >= 2*pb {
		maxX -= maxX % pb
	}
	return maxX
}

// blockLimits is the block.Limits the Device advertises, from the report and the derived limits.
func blockLimits(rep probeReport, out derivedLimits, readOnly bool) block.Limits {
	c, bl, ms, shift := rep.capacity, rep.blockLimits, rep.mode, out.shift
	physBS := uint32(c.PhysicalBlockSize())
	if c.PhysBlockExponent > 16 {
		physBS = c.BlockSize
	}
	l := block.Limits{
		LogicalBlockSize:  c.BlockSize,
		PhysicalBlockSize: physBS,
		MaxTransfer:       int64(out.maxXferBlocks) << shift,
		OptimalTransfer:   int64(bl.OptimalTransferLength) << shift,
		ReadOnly:          ms.WriteProtect || readOnly,
		VolatileCache:     out.volatile,
		CanFlush:          true,
		CanFUA:            ms.DPOFUA,
		CanDiscard:        out.lbpu || out.lbpws,
		CanWriteZeroes:    true,
		CanFastZero:       rep.writeSame != wsNo,
		DiscardZeroes:     out.lbprz && (out.lbpu || out.lbpws),
		Rotational:        rep.rotational,
		MultiConn:         true,
	}
	if l.CanDiscard {
		l.MaxDiscard = int64(out.maxUnmapBlocks) << shift
		if bl.OptimalUnmapGranularity > 1 {
			l.DiscardAlignment = int64(bl.OptimalUnmapGranularity) << shift
		}
	}
	if rep.writeSame != wsNo {
		l.MaxWriteZeroes = int64(out.maxWSBlocks) << shift
	} else {
		l.MaxWriteZeroes = l.MaxTransfer
	}
	l.OptimalTransfer = min(l.OptimalTransfer, l.MaxTransfer)
	return l
}

// wsLimit is one WRITE SAME's limit in blocks: the LUN's, else Linux sd's default.
func wsLimit(bl scsi.BlockLimits) uint64 {
	if bl.MaxWriteSameLength == 0 {
		return defaultMaxWriteSameBlocks
	}
	return min(bl.MaxWriteSameLength, 0xFFFFFFFF)
}
