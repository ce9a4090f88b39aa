package scsi

import "encoding/binary"

// Operation codes (SPC-5 / SBC-4 annex "operation codes").
const (
	OpTestUnitReady      = 0x00
	OpInquiry            = 0x12
	OpModeSense6         = 0x1A
	OpReadCapacity10     = 0x25
	OpRead10             = 0x28
	OpWrite10            = 0x2A
	OpSynchronizeCache10 = 0x35
	OpWriteSame10        = 0x41
	OpUnmap              = 0x42
	OpModeSense10        = 0x5A
	OpRead16             = 0x88
	OpWrite16            = 0x8A
	OpSynchronizeCache16 = 0x91
	OpWriteSame16        = 0x93
	OpServiceActionIn16  = 0x9E // READ CAPACITY(16) is service action 0x10
	OpReportLUNs         = 0xA0
	OpMaintenanceIn      = 0xA3 // REPORT SUPPORTED OPERATION CODES is service action 0x0C

	SAReadCapacity16         = 0x10
	SAReportSupportedOpcodes = 0x0C
)

// VPD page codes (SPC-5 §7.7, SBC-4 §6.6).
const (
	VPDSupportedPages       = 0x00
	VPDUnitSerialNumber     = 0x80
	VPDDeviceIdentification = 0x83
	VPDBlockLimits          = 0xB0
	VPDBlockCharacteristics = 0xB1
	VPDLogicalBlockProvisn  = 0xB2
)

// Mode page codes (SPC-5 §7.5, SBC-4 §6.5).
const (
	ModePageCaching = 0x08
	ModePageAll     = 0x3F
)

// Page control values for MODE SENSE (SPC-5 §6.13, PC field).
const (
	PCCurrent    = 0
	PCChangeable = 1
	PCDefault    = 2
	PCSaved      = 3
)

// Bits of byte 1 of READ/WRITE(10/16) (SBC-4 §5.15, §5.40).
const (
	cdbFUA = 0x08
	// WRITE SAME(16) byte 1 (SBC-4 §5.50).
	wsUnmap = 0x08
	wsNDOB  = 0x01
)

// start resets c for a new CDB of n bytes, keeping the LUN (a free-listed Command stays bound to
// one LUN) and clearing everything else so no byte of a previous command leaks into this one.
func (c *Command) start(op byte, n uint8, dir Direction, data []byte) {
	c.CDB = [16]byte{}
	c.CDB[0] = op
	c.CDBLen = n
	c.Dir = dir
	c.Data = data
	c.Attr = AttrSimple
}

// TestUnitReady builds TEST UNIT READY (SPC-5 §6.47).
func (c *Command) TestUnitReady() {
	c.start(OpTestUnitReady, 6, DirNone, nil)
}

// Inquiry builds a standard INQUIRY (SPC-5 §6.6) with an allocation length of len(buf) (at most
// 65535; SPC-5 allows a 2-byte allocation length).
func (c *Command) Inquiry(buf []byte) {
	buf = capLen(buf, 0xFFFF)
	c.start(OpInquiry, 6, DirRead, buf)
	binary.BigEndian.PutUint16(c.CDB[3:5], uint16(len(buf)))
}

// InquiryVPD builds INQUIRY with EVPD=1 for a vital product data page (SPC-5 §6.6, §7.7).
func (c *Command) InquiryVPD(page byte, buf []byte) {
	buf = capLen(buf, 0xFFFF)
	c.start(OpInquiry, 6, DirRead, buf)
	c.CDB[1] = 0x01 // EVPD
	c.CDB[2] = page
	binary.BigEndian.PutUint16(c.CDB[3:5], uint16(len(buf)))
}

// ReadCapacity10 builds READ CAPACITY(10) (SBC-4 §5.20); buf must hold 8 bytes.
func (c *Command) ReadCapacity10(buf []byte) {
	c.start(OpReadCapacity10, 10, DirRead, buf)
}

// ReadCapacity16 builds READ CAPACITY(16) (SBC-4 §5.21) with an allocation length of len(buf)
// (32 is the full parameter data).
func (c *Command) ReadCapacity16(buf []byte) {
	c.start(OpServiceActionIn16, 16, DirRead, buf)
	c.CDB[1] = SAReadCapacity16
	binary.BigEndian.PutUint32(c.CDB[10:14], uint32(len(buf)))
}

// Read10 builds READ(10) (SBC-4 §5.15). buf receives blocks logical blocks.
func (c *Command) Read10(lba uint32, blocks uint16, fua bool, buf []byte) {
	c.start(OpRead10, 10, DirRead, buf)
	if fua {
		c.CDB[1] = cdbFUA
	}
	binary.BigEndian.PutUint32(c.CDB[2:6], lba)
	binary.BigEndian.PutUint16(c.CDB[7:9], blocks)
}

// Read16 builds READ(16) (SBC-4 §5.17).
func (c *Command) Read16(lba uint64, blocks uint32, fua bool, buf []byte) {
	c.start(OpRead16, 16, DirRead, buf)
	if fua {
		c.CDB[1] = cdbFUA
	}
	binary.BigEndian.PutUint64(c.CDB[2:10], lba)
	binary.BigEndian.PutUint32(c.CDB[10:14], blocks)
}

// Write10 builds WRITE(10) (SBC-4 §5.40). FUA asks the target to make the data durable before
// it reports GOOD.
func (c *Command) Write10(lba uint32, blocks uint16, fua bool, data []byte) {
	c.start(OpWrite10, 10, DirWrite, data)
	if fua {
		c.CDB[1] = cdbFUA
	}
	binary.BigEndian.PutUint32(c.CDB[2:6], lba)
	binary.BigEndian.PutUint16(c.CDB[7:9], blocks)
}

// Write16 builds WRITE(16) (SBC-4 §5.42).
func (c *Command) Write16(lba uint64, blocks uint32, fua bool, data []byte) {
	c.start(OpWrite16, 16, DirWrite, data)
	if fua {
		c.CDB[1] = cdbFUA
	}
	binary.BigEndian.PutUint64(c.CDB[2:10], lba)
	binary.BigEndian.PutUint32(c.CDB[10:14], blocks)
}

// SynchronizeCache10 builds SYNCHRONIZE CACHE(10) (SBC-4 §5.31). blocks == 0 means "from lba to
// the end of the medium".
func (c *Command) SynchronizeCache10(lba uint32, blocks uint16) {
	c.start(OpSynchronizeCache10, 10, DirNone, nil)
	binary.BigEndian.PutUint32(c.CDB[2:6], lba)
	binary.BigEndian.PutUint16(c.CDB[7:9], blocks)
}

// SynchronizeCache16 builds SYNCHRONIZE CACHE(16) (SBC-4 §5.32).
func (c *Command) SynchronizeCache16(lba uint64, blocks uint32) {
	c.start(OpSynchronizeCache16, 16, DirNone, nil)
	binary.BigEndian.PutUint64(c.CDB[2:10], lba)
	binary.BigEndian.PutUint32(c.CDB[10:14], blocks)
}

// Unmap builds UNMAP (SBC-4 §5.37) carrying the parameter list params (see EncodeUnmap).
func (c *Command) Unmap(params []byte) {
	c.start(OpUnmap, 10, DirWrite, params)
	binary.BigEndian.PutUint16(c.CDB[7:9], uint16(len(params)))
}

// WriteSame16 builds WRITE SAME(16) (SBC-4 §5.50). data is one logical block written to every
// block of the range; with ndob (no data-out buffer) data must be nil and the target writes
// zeroes. unmap lets the target deallocate the range instead when it then reads back the same.
// blocks == 0 means "to the end of the medium" only if the target's WSNZ bit is clear; callers
// never send 0.
func (c *Command) WriteSame16(lba uint64, blocks uint32, unmap, ndob bool, data []byte) {
	dir := DirWrite
	if ndob {
		dir, data = DirNone, nil
	}
	c.start(OpWriteSame16, 16, dir, data)
	if unmap {
		c.CDB[1] |= wsUnmap
	}
	if ndob {
		c.CDB[1] |= wsNDOB
	}
	binary.BigEndian.PutUint64(c.CDB[2:10], lba)
	binary.BigEndian.PutUint32(c.CDB[10:14], blocks)
}

// WriteSame10 builds WRITE SAME(10) (SBC-4 §5.49).
func (c *Command) WriteSame10(lba uint32, blocks uint16, unmap bool, data []byte) {
	c.start(OpWriteSame10, 10, DirWrite, data)
	if unmap {
		c.CDB[1] |= wsUnmap
	}
	binary.BigEndian.PutUint32(c.CDB[2:6], lba)
	binary.BigEndian.PutUint16(c.CDB[7:9], blocks)
}

// ModeSense10 builds MODE SENSE(10) (SPC-5 §6.14) for one page (ModePageAll for every page) with
// page control pc. dbd disables block descriptors, which iser-blk never needs.
func (c *Command) ModeSense10(page, subpage byte, pc byte, dbd bool, buf []byte) {
	buf = capLen(buf, 0xFFFF)
	c.start(OpModeSense10, 10, DirRead, buf)
	if dbd {
		c.CDB[1] = 0x08
	}
	c.CDB[2] = pc<<6 | page&0x3F
	c.CDB[3] = subpage
	binary.BigEndian.PutUint16(c.CDB[7:9], uint16(len(buf)))
}

// ReportLUNs builds REPORT LUNS (SPC-5 §6.33) with SELECT REPORT selectReport (0: the logical
// units accessible through this I_T nexus). SPC requires an allocation length of at least 16.
func (c *Command) ReportLUNs(selectReport byte, buf []byte) {
	c.start(OpReportLUNs, 12, DirRead, buf)
	c.CDB[2] = selectReport
	binary.BigEndian.PutUint32(c.CDB[6:10], uint32(len(buf)))
}

// ReportSupportedOpcode builds REPORT SUPPORTED OPERATION CODES (SPC-5 §6.34) asking about one
// command (REPORTING OPTIONS 011b: by operation code and, when sa is non-nil, service action;
// 001b without), which answers whether it is supported and which CDB bits the target honours.
func (c *Command) ReportSupportedOpcode(op byte, sa *uint16, buf []byte) {
	c.start(OpMaintenanceIn, 12, DirRead, buf)
	c.CDB[1] = SAReportSupportedOpcodes
	c.CDB[2] = 0x01
	c.CDB[3] = op
	if sa != nil {
		c.CDB[2] = 0x03
		binary.BigEndian.PutUint16(c.CDB[4:6], *sa)
	}
	binary.BigEndian.PutUint32(c.CDB[6:10], uint32(len(buf)))
}

// UnmapDescriptor is one range of an UNMAP parameter list.
type UnmapDescriptor struct {
	LBA    uint64
	Blocks uint32
}

// UnmapParamLen is the size of an UNMAP parameter list with n block descriptors.
func UnmapParamLen(n int) int { return 8 + 16*n }

// EncodeUnmap writes the UNMAP parameter list (SBC-4 §5.37.2) for descs into dst, which must
// hold UnmapParamLen(len(descs)) bytes, and returns the used part of dst.
func EncodeUnmap(dst []byte, descs []UnmapDescriptor) []byte {
	n := UnmapParamLen(len(descs))
	dst = dst[:n]
	binary.BigEndian.PutUint16(dst[0:2], uint16(n-2))
	binary.BigEndian.PutUint16(dst[2:4], uint16(16*len(descs)))
	clear(dst[4:8])
	for i, d := range descs {
		b := dst[8+16*i : 8+16*(i+1)]
		binary.BigEndian.PutUint64(b[0:8], d.LBA)
		binary.BigEndian.PutUint32(b[8:12], d.Blocks)
		clear(b[12:16])
	}
	return dst
}

// EncodeLUN turns a logical unit number into the value of the 8-byte SAM LUN field (SAM-5
// §4.7): peripheral device addressing for LUNs below 256 (what every target uses for small
// numbers) and flat space addressing up to 16383.
func EncodeLUN(lun uint16) uint64 {
	var b [8]byte
	if lun < 256 {
		b[1] = byte(lun)
	} else {
		b[0] = 0x40 | byte(lun>>8)&0x3F
		b[1] = byte(lun)
	}
	return binary.BigEndian.Uint64(b[:])
}

// DecodeLUN is the inverse of EncodeLUN for the first level of a LUN field: peripheral device
// and flat space addressing. ok is false for other addressing methods or multi-level LUNs.
func DecodeLUN(v uint64) (lun uint16, ok bool) {
	var b [8]byte
	binary.BigEndian.PutUint64(b[:], v)
	for _, x := range b[2:] {
		if x != 0 {
			return 0, false
		}
	}
	switch b[0] >> 6 {
	case 0: // peripheral device addressing, bus 0
		if b[0] != 0 {
			return 0, false
		}
		return uint16(b[1]), true
	case 1: // flat space addressing
		return uint16(b[0]&0x3F)<<8 | uint16(b[1]), true
	}
	return 0, false
}

func capLen(b []byte, n int) []byte {
	if len(b) > n {
		return b[:n]
	}
	return b
}

// OpName names the command in cdb for errors and logs.
func OpName(cdb []byte) string {
	if len(cdb) == 0 {
		return "UNKNOWN"
	}
	switch cdb[0] {
	case OpTestUnitReady:
		return "TEST UNIT READY"
	case OpInquiry:
		if len(cdb) > 1 && cdb[1]&1 != 0 {
			return "INQUIRY VPD"
		}
		return "INQUIRY"
	case OpModeSense6:
		return "MODE SENSE(6)"
	case OpReadCapacity10:
		return "READ CAPACITY(10)"
	case OpRead10:
		return "READ(10)"
	case OpWrite10:
		return "WRITE(10)"
	case OpSynchronizeCache10:
		return "SYNCHRONIZE CACHE(10)"
	case OpWriteSame10:
		return "WRITE SAME(10)"
	case OpUnmap:
		return "UNMAP"
	case OpModeSense10:
		return "MODE SENSE(10)"
	case OpRead16:
		return "READ(16)"
	case OpWrite16:
		return "WRITE(16)"
	case OpSynchronizeCache16:
		return "SYNCHRONIZE CACHE(16)"
	case OpWriteSame16:
		return "WRITE SAME(16)"
	case OpServiceActionIn16:
		if len(cdb) > 1 && cdb[1]&0x1F == SAReadCapacity16 {
			return "READ CAPACITY(16)"
		}
		return "SERVICE ACTION IN(16)"
	case OpReportLUNs:
		return "REPORT LUNS"
	case OpMaintenanceIn:
		if len(cdb) > 1 && cdb[1]&0x1F == SAReportSupportedOpcodes {
			return "REPORT SUPPORTED OPERATION CODES"
		}
		if len(cdb) > 1 && cdb[1]&0x1F == SAReportTargetPortGroups {
			return "REPORT TARGET PORT GROUPS"
		}
		return "MAINTENANCE IN"
	}
	return "OPCODE 0x" + hex2(cdb[0])
}

func hex2(b byte) string {
	const digits = "0123456789abcdef"
	return string([]byte{digits[b>>4], digits[b&15]})
}

// Name names the command c carries.
func (c *Command) Name() string { return OpName(c.CDB[:max(int(c.CDBLen), 1)]) }
