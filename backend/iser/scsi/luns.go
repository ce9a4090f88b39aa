package scsi

import (
	"encoding/binary"
	"fmt"
)

// ParseReportLUNs decodes REPORT LUNS parameter data (SPC-5 §6.33.2) into the raw 8-byte LUN
// values (see DecodeLUN). total is the number of LUNs the target has, which may exceed the
// entries returned when the allocation length was too small.
func ParseReportLUNs(b []byte) (luns []uint64, total int, err error) {
	if len(b) < 8 {
		return nil, 0, fmt.Errorf("REPORT LUNS: %w (%d bytes)", ErrShortData, len(b))
	}
	listLen := binary.BigEndian.Uint32(b[0:4])
	total = int(listLen / 8)
	body := b[8:]
	if uint64(len(body)) > uint64(listLen) {
		body = body[:listLen]
	}
	for len(body) >= 8 {
		luns = append(luns, binary.BigEndian.Uint64(body[:8]))
		body = body[8:]
	}
	return luns, total, nil
}

// OpcodeSupport is REPORT SUPPORTED OPERATION CODES one-command parameter data (SPC-5 §6.34.3).
type OpcodeSupport struct {
	// Support: 1 not supported, 3 supported as the standard says, 5 vendor-specific.
	Support uint8
	// Usage is the CDB usage bitmap: a set bit means the target honours that CDB bit.
	Usage []byte
}

// Supported reports a SUPPORT value of 011b or 101b.
func (o OpcodeSupport) Supported() bool { return o.Support == 3 || o.Support == 5 }

// UsageBit reports whether bit of byte i of the CDB is honoured.
func (o OpcodeSupport) UsageBit(i int, bit uint8) bool {
	return i < len(o.Usage) && o.Usage[i]&bit != 0
}

// ParseOpcodeSupport decodes one-command REPORT SUPPORTED OPERATION CODES data.
func ParseOpcodeSupport(b []byte) (OpcodeSupport, error) {
	if len(b) < 4 {
		return OpcodeSupport{}, fmt.Errorf("REPORT SUPPORTED OPERATION CODES: %w (%d bytes)", ErrShortData, len(b))
	}
	o := OpcodeSupport{Support: b[1] & 0x07}
	n := int(binary.BigEndian.Uint16(b[2:4]))
	o.Usage = append([]byte(nil), b[4:min(4+n, len(b))]...)
	return o, nil
}
