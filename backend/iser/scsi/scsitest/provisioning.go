package scsitest

// Logical block provisioning and zeroing: UNMAP and WRITE SAME (SBC-4), over the
// sparse store.

import (
	"encoding/binary"

	"github.com/iser-blk/iser-blk/backend/iser/scsi"
)

// fillLocked writes pattern (one block) over blocks blocks at lba.
func (l *LUN) fillLocked(lba, blocks uint64, pattern []byte) {
	bs := uint64(l.cfg.BlockSize)
	zero := true
	for _, b := range pattern {
		if b != 0 {
			zero = false
			break
		}
	}
	for i := range blocks {
		off := (lba + i) * bs
		if zero && l.chunks[off/chunkSize] == nil {
			continue // already reads as zeroes
		}
		l.writeLocked(pattern, off)
	}
}

// deallocateLocked unmaps a range: it reads back as zeroes with LBPRZ, else as 0xDB.
func (l *LUN) deallocateLocked(lba, blocks uint64) {
	fill := make([]byte, l.cfg.BlockSize)
	if !l.cfg.LBPRZ {
		for i := range fill {
			fill[i] = 0xDB
		}
	}
	l.fillLocked(lba, blocks, fill)
}

func (l *LUN) unmap(cmd *scsi.Command, resp *scsi.Response) {
	if !l.cfg.LBPU {
		illegal(resp, scsi.ASCInvalidOpcode)
		return
	}
	if l.cfg.ReadOnly {
		resp.SetSense(scsi.KeyDataProtect, 0x27, 0x00)
		return
	}
	p := cmd.Data
	plen := int(binary.BigEndian.Uint16(cmd.CDB[7:9]))
	if plen != len(p) || cmd.Dir != scsi.DirWrite {
		illegal(resp, scsi.ASCInvalidFieldInCDB)
		return
	}
	if plen == 0 {
		return
	}
	if len(p) < 8 || int(binary.BigEndian.Uint16(p[0:2])) != len(p)-2 {
		illegal(resp, scsi.ASCParamListLengthError)
		return
	}
	dlen := int(binary.BigEndian.Uint16(p[2:4]))
	if dlen%16 != 0 || 8+dlen > len(p) {
		illegal(resp, scsi.ASCInvalidFieldInParams)
		return
	}
	n := dlen / 16
	if l.cfg.MaxUnmapDescriptors != 0 && n > int(l.cfg.MaxUnmapDescriptors) {
		illegal(resp, scsi.ASCInvalidFieldInParams)
		return
	}
	var total uint64
	for i := range n {
		d := p[8+16*i:]
		lba, cnt := binary.BigEndian.Uint64(d[0:8]), uint64(binary.BigEndian.Uint32(d[8:12]))
		if lba > l.cfg.Blocks || cnt > l.cfg.Blocks-lba {
			illegal(resp, scsi.ASCLBAOutOfRange)
			return
		}
		total += cnt
	}
	if l.cfg.MaxUnmapLBACount != 0 && total > uint64(l.cfg.MaxUnmapLBACount) {
		illegal(resp, scsi.ASCInvalidFieldInParams)
		return
	}
	for i := range n {
		d := p[8+16*i:]
		l.deallocateLocked(binary.BigEndian.Uint64(d[0:8]), uint64(binary.BigEndian.Uint32(d[8:12])))
	}
}

func (l *LUN) writeSame(cmd *scsi.Command, resp *scsi.Response) {
	c := cmd.CDB[:]
	if l.cfg.NoWriteSame {
		illegal(resp, scsi.ASCInvalidOpcode)
		return
	}
	if l.cfg.ReadOnly {
		resp.SetSense(scsi.KeyDataProtect, 0x27, 0x00)
		return
	}
	unmap := c[1]&0x08 != 0
	ndob := c[0] == scsi.OpWriteSame16 && c[1]&0x01 != 0
	lba, blocks := rwRange(c)
	switch {
	case ndob && l.cfg.NoNDOB, unmap && !l.cfg.LBPWS, blocks == 0:
		illegal(resp, scsi.ASCInvalidFieldInCDB)
		return
	case lba > l.cfg.Blocks || blocks > l.cfg.Blocks-lba:
		illegal(resp, scsi.ASCLBAOutOfRange)
		return
	case l.cfg.MaxWriteSameBlocks != 0 && blocks > l.cfg.MaxWriteSameBlocks:
		illegal(resp, scsi.ASCInvalidFieldInCDB)
		return
	}
	var pattern []byte
	if ndob {
		if cmd.Dir != scsi.DirNone || len(cmd.Data) != 0 {
			illegal(resp, scsi.ASCInvalidFieldInCDB)
			return
		}
		pattern = make([]byte, l.cfg.BlockSize)
	} else {
		if cmd.Dir != scsi.DirWrite || len(cmd.Data) != int(l.cfg.BlockSize) {
			illegal(resp, scsi.ASCInvalidFieldInCDB)
			return
		}
		pattern = cmd.Data
	}
	allZero := true
	for _, b := range pattern {
		if b != 0 {
			allZero = false
			break
		}
	}
	if unmap && allZero && l.cfg.LBPRZ {
		l.deallocateLocked(lba, blocks)
		return
	}
	l.fillLocked(lba, blocks, pattern)
}
