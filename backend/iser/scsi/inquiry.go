package scsi

import (
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"
)

// Peripheral device types iser-blk cares about (SPC-5 table 150).
const (
	TypeDisk       = 0x00 // direct access block device
	TypeController = 0x0C // storage array controller (tgt's LUN 0)
	TypeNone       = 0x1F // unknown or no device type
)

// StandardInquiry is the standard INQUIRY data (SPC-5 §6.6.2).
type StandardInquiry struct {
	Qualifier  uint8 // PERIPHERAL QUALIFIER: 0 connected, 1 not connected, 3 no such LU
	DeviceType uint8 // PERIPHERAL DEVICE TYPE
	Removable  bool
	Version    uint8
	HiSup      bool
	Format     uint8 // RESPONSE DATA FORMAT (2)
	Protect    bool  // protection information supported
	ThreePC    bool
	CmdQue     bool  // command queuing supported
	TPGS       uint8 // TARGET PORT GROUP SUPPORT: 0 no ALUA, 1 implicit, 2 explicit, 3 both (alua.go)
	Vendor     string
	Product    string
	Revision   string
}

// ErrShortData reports parameter data shorter than its fixed part.
var ErrShortData = errors.New("scsi: parameter data too short")

// ParseInquiry decodes standard INQUIRY data. Strings are ASCII, trailing spaces and NULs trimmed,
// non-printable bytes replaced, so a lying target cannot inject control characters into logs.
func ParseInquiry(b []byte) (StandardInquiry, error) {
	var q StandardInquiry
	if len(b) < 5 {
		return q, fmt.Errorf("INQUIRY: %w (%d bytes)", ErrShortData, len(b))
	}
	if n := 5 + int(b[4]); n < len(b) {
		b = b[:n]
	}
	q.Qualifier = b[0] >> 5
	q.DeviceType = b[0] & 0x1F
	q.Removable = b[1]&0x80 != 0
	q.Version = b[2]
	q.HiSup = b[3]&0x10 != 0
	q.Format = b[3] & 0x0F
	if len(b) > 5 {
		q.Protect = b[5]&0x01 != 0
		q.TPGS = (b[5] >> 4) & 0x03
		q.ThreePC = b[5]&0x08 != 0
	}
	if len(b) > 7 {
		q.CmdQue = b[7]&0x02 != 0
	}
	q.Vendor = asciiField(b, 8, 16)
	q.Product = asciiField(b, 16, 32)
	q.Revision = asciiField(b, 32, 36)
	return q, nil
}

func asciiField(b []byte, from, to int) string {
	if from >= len(b) {
		return ""
	}
	return cleanASCII(b[from:min(to, len(b))])
}

func cleanASCII(b []byte) string {
	var sb strings.Builder
	for _, c := range b {
		if c < 0x20 || c > 0x7E {
			if c == 0 {
				continue
			}
			c = '?'
		}
		sb.WriteByte(c)
	}
	return strings.TrimSpace(sb.String())
}

// vpdPayload checks a VPD page header (SPC-5 §7.7.1) and returns its payload, cut to the PAGE
// LENGTH and to what was transferred.
func vpdPayload(b []byte, page byte, name string) ([]byte, error) {
	if len(b) < 4 {
		return nil, fmt.Errorf("%s VPD: %w (%d bytes)", name, ErrShortData, len(b))
	}
	if b[1] != page {
		return nil, fmt.Errorf("%s VPD: target returned page 0x%02x", name, b[1])
	}
	n := int(binary.BigEndian.Uint16(b[2:4]))
	return b[4:min(4+n, len(b))], nil
}

// ParseSupportedVPDPages decodes VPD page 0x00 (SPC-5 §7.7.16).
func ParseSupportedVPDPages(b []byte) ([]byte, error) {
	p, err := vpdPayload(b, VPDSupportedPages, "supported pages")
	if err != nil {
		return nil, err
	}
	return append([]byte(nil), p...), nil
}

// ParseUnitSerial decodes VPD page 0x80 (SPC-5 §7.7.18).
func ParseUnitSerial(b []byte) (string, error) {
	p, err := vpdPayload(b, VPDUnitSerialNumber, "unit serial number")
	if err != nil {
		return "", err
	}
	return cleanASCII(p), nil
}

// Designator association, code set and type values (SPC-5 §7.7.6.1).
const (
	AssocLU     = 0 // the logical unit
	AssocPort   = 1 // the target port
	AssocTarget = 2 // the SCSI target device

	CodeSetBinary = 1
	CodeSetASCII  = 2
	CodeSetUTF8   = 3

	DesigVendor    = 0x0 // vendor specific
	DesigT10       = 0x1 // T10 vendor ID based
	DesigEUI64     = 0x2
	DesigNAA       = 0x3
	DesigRelPort   = 0x4
	DesigTPG       = 0x5
	DesigLUGroup   = 0x6
	DesigMD5       = 0x7
	DesigSCSIName  = 0x8
	DesigProtoPort = 0x9
	DesigUUID      = 0xA
)

// Designator is one identification descriptor of VPD page 0x83 (SPC-5 §7.7.6).
type Designator struct {
	ProtocolID  uint8
	CodeSet     uint8
	PIV         bool
	Association uint8
	Type        uint8
	Value       []byte
}

// String renders the designator the way Linux (/dev/disk/by-id, sg_vpd) does: naa.<hex>,
// eui.<hex>, t10.<ascii>, the SCSI name itself, else hex.
func (d Designator) String() string {
	switch d.Type {
	case DesigNAA:
		return "naa." + hex.EncodeToString(d.Value)
	case DesigEUI64:
		return "eui." + hex.EncodeToString(d.Value)
	case DesigT10:
		return "t10." + cleanASCII(d.Value)
	case DesigSCSIName:
		return cleanASCII(d.Value)
	case DesigUUID:
		if len(d.Value) == 18 {
			u := hex.EncodeToString(d.Value[2:])
			return "uuid." + u[0:8] + "-" + u[8:12] + "-" + u[12:16] + "-" + u[16:20] + "-" + u[20:]
		}
	}
	if d.CodeSet == CodeSetASCII || d.CodeSet == CodeSetUTF8 {
		return cleanASCII(d.Value)
	}
	return hex.EncodeToString(d.Value)
}

// ParseDeviceIdentification decodes VPD page 0x83 (SPC-5 §7.7.6). A descriptor running past the
// page ends the list (the ones before it are kept).
func ParseDeviceIdentification(b []byte) ([]Designator, error) {
	p, err := vpdPayload(b, VPDDeviceIdentification, "device identification")
	if err != nil {
		return nil, err
	}
	var out []Designator
	for len(p) >= 4 {
		n := int(p[3])
		if 4+n > len(p) {
			break
		}
		out = append(out, Designator{
			ProtocolID:  p[0] >> 4,
			CodeSet:     p[0] & 0x0F,
			PIV:         p[1]&0x80 != 0,
			Association: (p[1] >> 4) & 0x03,
			Type:        p[1] & 0x0F,
			Value:       append([]byte(nil), p[4:4+n]...),
		})
		p = p[4+n:]
	}
	return out, nil
}

// BlockLimits is VPD page 0xB0 (SBC-4 §6.6.4). Lengths are in logical blocks; 0 means "not
// reported / no limit" as SBC defines for each field.
type BlockLimits struct {
	Length                    int  // PAGE LENGTH as reported (0x3C for a full SBC-3+ page)
	WSNZ                      bool // WRITE SAME with NUMBER OF LOGICAL BLOCKS 0 is rejected
	MaxCompareAndWrite        uint8
	OptimalTransferGranule    uint16
	MaxTransferLength         uint32
	OptimalTransferLength     uint32
	MaxPrefetchLength         uint32
	MaxUnmapLBACount          uint32
	MaxUnmapDescriptorCount   uint32
	OptimalUnmapGranularity   uint32
	UnmapGranularityAlignment uint32
	UGAValid                  bool
	MaxWriteSameLength        uint64
}

// ParseBlockLimits decodes VPD page 0xB0. Targets return pages of many lengths (SBC-2's was
// 0x0C bytes); absent fields are zero.
func ParseBlockLimits(b []byte) (BlockLimits, error) {
	var l BlockLimits
	p, err := vpdPayload(b, VPDBlockLimits, "block limits")
	if err != nil {
		return l, err
	}
	l.Length = len(p)
	// Field offsets below are relative to the page start; the payload starts at byte 4.
	get := func(off, n int) []byte {
		off -= 4
		if off+n > len(p) {
			return nil
		}
		return p[off : off+n]
	}
	if f := get(4, 1); f != nil {
		l.WSNZ = f[0]&0x01 != 0
	}
	if f := get(5, 1); f != nil {
		l.MaxCompareAndWrite = f[0]
	}
	if f := get(6, 2); f != nil {
		l.OptimalTransferGranule = binary.BigEndian.Uint16(f)
	}
	if f := get(8, 4); f != nil {
		l.MaxTransferLength = binary.BigEndian.Uint32(f)
	}
	if f := get(12, 4); f != nil {
		l.OptimalTransferLength = binary.BigEndian.Uint32(f)
	}
	if f := get(16, 4); f != nil {
		l.MaxPrefetchLength = binary.BigEndian.Uint32(f)
	}
	if f := get(20, 4); f != nil {
		l.MaxUnmapLBACount = binary.BigEndian.Uint32(f)
	}
	if f := get(24, 4); f != nil {
		l.MaxUnmapDescriptorCount = binary.BigEndian.Uint32(f)
	}
	if f := get(28, 4); f != nil {
		l.OptimalUnmapGranularity = binary.BigEndian.Uint32(f)
	}
	if f := get(32, 4); f != nil {
		l.UGAValid = f[0]&0x80 != 0
		l.UnmapGranularityAlignment = binary.BigEndian.Uint32(f) & 0x7FFFFFFF
	}
	if f := get(36, 8); f != nil {
		l.MaxWriteSameLength = binary.BigEndian.Uint64(f)
	}
	return l, nil
}

// LogicalBlockProvisioning is VPD page 0xB2 (SBC-4 §6.6.6).
type LogicalBlockProvisioning struct {
	ThresholdExponent uint8
	LBPU              bool  // UNMAP supported
	LBPWS             bool  // WRITE SAME(16) with UNMAP supported
	LBPWS10           bool  // WRITE SAME(10) with UNMAP supported
	LBPRZ             uint8 // 3 bits: non-zero means unmapped blocks read back as zeroes
	ANCSup            bool
	DP                bool
	ProvisioningType  uint8 // 0 full / unknown, 1 resource provisioned, 2 thin
}

// ParseLogicalBlockProvisioning decodes VPD page 0xB2.
func ParseLogicalBlockProvisioning(b []byte) (LogicalBlockProvisioning, error) {
	var l LogicalBlockProvisioning
	p, err := vpdPayload(b, VPDLogicalBlockProvisn, "logical block provisioning")
	if err != nil {
		return l, err
	}
	if len(p) < 2 {
		return l, fmt.Errorf("logical block provisioning VPD: %w (%d-byte page)", ErrShortData, len(p))
	}
	l.ThresholdExponent = p[0]
	l.LBPU = p[1]&0x80 != 0
	l.LBPWS = p[1]&0x40 != 0
	l.LBPWS10 = p[1]&0x20 != 0
	l.LBPRZ = (p[1] >> 2) & 0x07
	l.ANCSup = p[1]&0x02 != 0
	l.DP = p[1]&0x01 != 0
	if len(p) > 2 {
		l.ProvisioningType = p[2] & 0x07
	}
	return l, nil
}

// BlockCharacteristics is VPD page 0xB1 (SBC-4 §6.6.2).
type BlockCharacteristics struct {
	// MediumRotationRate: 0 not reported, 1 non-rotating (solid state), 0x0401..0xFFFE rpm.
	MediumRotationRate uint16
	ProductType        uint8
	FormFactor         uint8 // NOMINAL FORM FACTOR
}

// Rotational reports a rotating medium; an unreported rate counts as not rotating, as Linux
// sd does.
func (b BlockCharacteristics) Rotational() bool {
	return b.MediumRotationRate >= 0x0401 && b.MediumRotationRate <= 0xFFFE
}

// ParseBlockCharacteristics decodes VPD page 0xB1.
func ParseBlockCharacteristics(b []byte) (BlockCharacteristics, error) {
	var c BlockCharacteristics
	p, err := vpdPayload(b, VPDBlockCharacteristics, "block device characteristics")
	if err != nil {
		return c, err
	}
	if len(p) < 2 {
		return c, fmt.Errorf("block device characteristics VPD: %w (%d-byte page)", ErrShortData, len(p))
	}
	c.MediumRotationRate = binary.BigEndian.Uint16(p[0:2])
	if len(p) > 2 {
		c.ProductType = p[2]
	}
	if len(p) > 3 {
		c.FormFactor = p[3] & 0x0F
	}
	return c, nil
}
