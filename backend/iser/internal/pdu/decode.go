package pdu

import (
	"encoding/binary"
	"fmt"
)

// PDU is a whole decoded PDU whose slices alias the input buffer.
type PDU struct {
	BHS  BHS
	AHS  []byte // total AHS, without the header digest
	Data []byte // data segment without padding and digest
}

// Decode parses one complete PDU from buf (as received from a target, RFC 7143 §11.2): BHS,
// AHS, optional header digest, data segment, padding, optional data digest. It verifies digests
// and validates the BHS (see BHS.Validate with maxData), and returns the number of bytes consumed.
// It never panics; malformed input yields an error wrapping ErrMalformed (or ErrDigest).
func Decode(buf []byte, headerDigest, dataDigest bool, maxData int) (PDU, int, error) {
	var p PDU
	if len(buf) < BHSLen {
		return p, 0, fmt.Errorf("%w: %d bytes is shorter than a BHS", ErrMalformed, len(buf))
	}
	copy(p.BHS[:], buf[:BHSLen])
	if err := p.BHS.Validate(maxData); err != nil {
		return p, 0, err
	}
	off := BHSLen
	ahsLen := p.BHS.TotalAHSLength()
	if len(buf)-off < ahsLen {
		return p, 0, fmt.Errorf("%w: truncated AHS", ErrMalformed)
	}
	p.AHS = buf[off : off+ahsLen]
	for rest := p.AHS; len(rest) > 0; {
		var err error
		if _, rest, err = NextAHS(rest); err != nil {
			return p, 0, err
		}
	}
	off += ahsLen
	if headerDigest {
		if len(buf)-off < DigestLen {
			return p, 0, fmt.Errorf("%w: truncated header digest", ErrMalformed)
		}
		if got, want := GetDigest(buf[off:]), HeaderDigest(&p.BHS, p.AHS); got != want {
			return p, 0, &DigestError{What: "header", Got: got, Want: want}
		}
		off += DigestLen
	}
	dsl := p.BHS.DataSegmentLength()
	if dsl > 0 {
		if len(buf)-off < Padded(dsl) {
			return p, 0, fmt.Errorf("%w: truncated data segment (%d of %d bytes)", ErrMalformed, len(buf)-off, Padded(dsl))
		}
		p.Data = buf[off : off+dsl]
		off += Padded(dsl)
		if dataDigest {
			if len(buf)-off < DigestLen {
				return p, 0, fmt.Errorf("%w: truncated data digest", ErrMalformed)
			}
			if got, want := GetDigest(buf[off:]), DataDigest(p.Data); got != want {
				return p, 0, &DigestError{What: "data", Got: got, Want: want}
			}
			off += DigestLen
		}
	}
	return p, off, nil
}

// DigestError reports a CRC32C mismatch. At ErrorRecoveryLevel 0 it is a connection error
// (RFC 7143 §7.8, §7.1.4.1).
type DigestError struct {
	What      string // "header" or "data"
	Got, Want uint32
}

func (e *DigestError) Error() string {
	return fmt.Sprintf("iSCSI %s digest mismatch: received 0x%08x, computed 0x%08x", e.What, e.Got, e.Want)
}

// Is makes a DigestError match ErrMalformed.
func (e *DigestError) Is(target error) bool { return target == ErrMalformed }

// SenseData splits the data segment of a SCSI Response (or a Data-In carrying sense, §11.4.7):
// a 2-byte SenseLength followed by the sense bytes. An empty segment has no sense.
func SenseData(data []byte) ([]byte, error) {
	if len(data) == 0 {
		return nil, nil
	}
	if len(data) < 2 {
		return nil, fmt.Errorf("%w: 1-byte SCSI Response data segment", ErrMalformed)
	}
	n := int(binary.BigEndian.Uint16(data[:2]))
	if n > len(data)-2 {
		return nil, fmt.Errorf("%w: SenseLength %d exceeds the %d-byte data segment", ErrMalformed, n, len(data)-2)
	}
	return data[2 : 2+n], nil
}
