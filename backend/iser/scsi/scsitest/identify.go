package scsitest

// The identification commands a probe sends: INQUIRY and its VPD pages, MODE SENSE, REPORT
// SUPPORTED OPERATION CODES.

import (
	"encoding/binary"
	"fmt"

	"github.com/iser-blk/iser-blk/backend/iser/scsi"
)

func (l *LUN) modeSense(cmd *scsi.Command, resp *scsi.Response) {
	if l.cfg.NoModeSense {
		illegal(resp, scsi.ASCInvalidOpcode)
		return
	}
	page := cmd.CDB[2] & 0x3F
	pc := cmd.CDB[2] >> 6
	if page != scsi.ModePageCaching && page != scsi.ModePageAll {
		illegal(resp, scsi.ASCInvalidFieldInCDB)
		return
	}
	var b [8 + 20]byte
	binary.BigEndian.PutUint16(b[0:2], uint16(len(b)-2))
	if l.cfg.ReadOnly {
		b[3] |= 0x80
	}
	if l.cfg.DPOFUA {
		b[3] |= 0x10
	}
	b[8] = scsi.ModePageCaching
	b[9] = 18
	switch pc {
	case scsi.PCChangeable:
		b[10] = 0x04
	default:
		if l.cfg.WCE {
			b[10] = 0x04
		}
	}
	alloc := int(binary.BigEndian.Uint16(cmd.CDB[7:9]))
	dataIn(cmd, resp, b[:min(alloc, len(b))])
}

func (l *LUN) rsoc(cmd *scsi.Command, resp *scsi.Response) {
	c := cmd.CDB[:]
	if l.cfg.NoRSOC || c[1]&0x1F != scsi.SAReportSupportedOpcodes {
		illegal(resp, scsi.ASCInvalidOpcode)
		return
	}
	opt := c[2] & 0x07
	if opt != 1 && opt != 3 {
		illegal(resp, scsi.ASCInvalidFieldInCDB)
		return
	}
	b := make([]byte, 4+16)
	op := c[3]
	switch {
	case op == scsi.OpWriteSame16 && !l.cfg.NoWriteSame:
		b[1] = 3
		binary.BigEndian.PutUint16(b[2:4], 16)
		u := b[4:]
		u[0] = op
		u[1] = 0x08 // UNMAP
		if !l.cfg.NoNDOB {
			u[1] |= 0x01
		}
		for i := 2; i < 14; i++ {
			u[i] = 0xFF
		}
		u[15] = 0x07
	default:
		b[1] = 1
		b = b[:4]
	}
	alloc := int(binary.BigEndian.Uint32(c[6:10]))
	dataIn(cmd, resp, b[:min(alloc, len(b))])
}

func (l *LUN) inquiry(cmd *scsi.Command, resp *scsi.Response) {
	c := cmd.CDB[:]
	alloc := int(binary.BigEndian.Uint16(c[3:5]))
	out := func(b []byte) { dataIn(cmd, resp, b[:min(alloc, len(b))]) }
	if c[1]&0x01 == 0 {
		if c[2] != 0 {
			illegal(resp, scsi.ASCInvalidFieldInCDB)
			return
		}
		out(l.standardInquiry())
		return
	}
	page := c[2]
	payload, ok := l.vpdPayload(page)
	if !ok {
		illegal(resp, scsi.ASCInvalidFieldInCDB)
		return
	}
	b := make([]byte, 4+len(payload))
	b[0] = l.cfg.DeviceType & 0x1F
	b[1] = page
	binary.BigEndian.PutUint16(b[2:4], uint16(len(payload)))
	copy(b[4:], payload)
	out(b)
}

// standardInquiry is the standard INQUIRY data (SPC-5 §6.6.2), 36 bytes.
func (l *LUN) standardInquiry() []byte {
	b := make([]byte, 36)
	b[0] = l.cfg.DeviceType & 0x1F
	b[2] = 0x06 // SPC-4
	b[3] = 0x02 | 0x10
	b[4] = 31
	b[7] = 0x02 // CMDQUE
	pad(b[8:16], l.cfg.Vendor)
	pad(b[16:32], l.cfg.Product)
	pad(b[32:36], l.cfg.Revision)
	return b
}

// vpdPayload is the payload of VPD page (after its 4-byte header); false: the LUN does not
// have the page (ILLEGAL REQUEST, INVALID FIELD IN CDB).
func (l *LUN) vpdPayload(page byte) ([]byte, bool) {
	var payload []byte
	switch page {
	case scsi.VPDSupportedPages:
		payload = []byte{0x00, 0x80, 0x83}
		if !l.cfg.NoBlockLimitsVPD {
			payload = append(payload, 0xB0)
		}
		if l.cfg.RotationRate != 0 {
			payload = append(payload, 0xB1)
		}
		if !l.cfg.NoLBPVPD {
			payload = append(payload, 0xB2)
		}
	case scsi.VPDUnitSerialNumber:
		payload = []byte(l.cfg.Serial)
	case scsi.VPDDeviceIdentification:
		naa := append([]byte{0x01, 0x03, 0x00, byte(len(l.cfg.NAA))}, l.cfg.NAA...)
		t10 := append([]byte{0x02, 0x01, 0x00, 0}, []byte(fmt.Sprintf("%-8s%s", l.cfg.Vendor, l.cfg.Serial))...)
		t10[3] = byte(len(t10) - 4)
		payload = append(naa, t10...)
	case scsi.VPDBlockLimits:
		if l.cfg.NoBlockLimitsVPD {
			return nil, false
		}
		payload = make([]byte, 0x3C)
		p := func(off int) []byte { return payload[off-4:] }
		binary.BigEndian.PutUint32(p(8), l.cfg.MaxTransferBlocks)
		binary.BigEndian.PutUint32(p(12), l.cfg.OptimalTransferBlocks)
		if l.cfg.LBPU {
			// SBC-4 §6.6.4: 0 would mean "UNMAP not supported"; no limit is all ones.
			binary.BigEndian.PutUint32(p(20), orAllOnes(l.cfg.MaxUnmapLBACount))
			binary.BigEndian.PutUint32(p(24), orAllOnes(l.cfg.MaxUnmapDescriptors))
		}
		binary.BigEndian.PutUint32(p(28), l.cfg.UnmapGranularity)
		binary.BigEndian.PutUint64(p(36), l.cfg.MaxWriteSameBlocks)
		p(4)[0] = 0x01 // WSNZ
	case scsi.VPDBlockCharacteristics:
		if l.cfg.RotationRate == 0 {
			return nil, false
		}
		payload = make([]byte, 0x3C)
		binary.BigEndian.PutUint16(payload[0:2], l.cfg.RotationRate)
	case scsi.VPDLogicalBlockProvisn:
		if l.cfg.NoLBPVPD {
			return nil, false
		}
		payload = make([]byte, 4)
		if l.cfg.LBPU {
			payload[1] |= 0x80
		}
		if l.cfg.LBPWS {
			payload[1] |= 0x40
		}
		if l.cfg.LBPRZ {
			payload[1] |= 0x04
		}
		if l.cfg.Thin {
			payload[2] = 2
		}
	default:
		return nil, false
	}
	return payload, true
}

func pad(dst []byte, s string) {
	for i := range dst {
		dst[i] = ' '
	}
	copy(dst, s)
}

func orAllOnes(v uint32) uint32 {
	if v == 0 {
		return 0xFFFFFFFF
	}
	return v
}
