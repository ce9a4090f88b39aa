package pdu

import (
	"encoding/binary"
	"fmt"
)

// AHS types (RFC 7143 §11.2.2.3).
const (
	AHSExtendedCDB    = 1
	AHSBidiReadLength = 2
)

// MaxAHSLength is the largest total AHS the 8-bit TotalAHSLength word count allows.
const MaxAHSLength = 255 * 4

// appendExtendedCDB appends an Extended-CDB AHS (§11.2.2.3) carrying cdb[16:] to dst and returns
// the extended slice. cdb must be longer than 16 bytes; the first 16 go into the BHS. Appending
// into a buffer with enough capacity does not allocate.
func appendExtendedCDB(dst, cdb []byte) []byte {
	rest := cdb[16:]
	n := len(rest) + 1 // AHSLength counts the reserved byte
	dst = append(dst, byte(n>>8), byte(n), AHSExtendedCDB, 0)
	dst = append(dst, rest...)
	return append(dst, zeroPad[:PadLen(len(rest)+4)]...)
}

// AppendBidiReadLength appends a Bidirectional Read Expected Data Transfer Length AHS (§11.2.2.4).
func AppendBidiReadLength(dst []byte, length uint32) []byte {
	dst = append(dst, 0, 5, AHSBidiReadLength, 0)
	return binary.BigEndian.AppendUint32(dst, length)
}

// AHS is one decoded Additional Header Segment; Specific aliases the input buffer.
type AHS struct {
	Type     uint8
	Specific []byte // the AHS-Specific field without the leading reserved byte
}

// NextAHS decodes the first AHS of ahs and returns it with the remaining bytes. It returns an error
// for truncated or zero-length segments and never panics.
func NextAHS(ahs []byte) (AHS, []byte, error) {
	if len(ahs) < 4 {
		return AHS{}, nil, fmt.Errorf("%w: truncated AHS (%d bytes)", ErrMalformed, len(ahs))
	}
	n := int(binary.BigEndian.Uint16(ahs[0:2]))
	if n < 1 {
		return AHS{}, nil, fmt.Errorf("%w: AHS with zero length", ErrMalformed)
	}
	total := Padded(3 + n)
	if total > len(ahs) {
		return AHS{}, nil, fmt.Errorf("%w: AHS of %d bytes overruns the %d-byte AHS area", ErrMalformed, total, len(ahs))
	}
	a := AHS{Type: ahs[2], Specific: ahs[4 : 3+n]}
	if a.Type == AHSBidiReadLength && n != 5 {
		return AHS{}, nil, fmt.Errorf("%w: bidirectional read length AHS of length %d", ErrMalformed, n)
	}
	return a, ahs[total:], nil
}

// BidiReadLength returns the value of a Bidirectional Read Expected Data Transfer Length AHS.
func (a AHS) BidiReadLength() uint32 {
	if len(a.Specific) < 4 {
		return 0
	}
	return binary.BigEndian.Uint32(a.Specific)
}
