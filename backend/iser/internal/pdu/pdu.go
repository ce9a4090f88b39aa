// Package pdu encodes and decodes iSCSI PDUs (RFC 7143 §11): the 48-byte Basic Header Segment
// (BHS), Additional Header Segments (AHS, §11.2.2), data-segment padding (§11.2.3) and CRC32C
// header/data digests (§11.2.4, §13.1).
//
// Invariants:
//   - Encoding writes into caller-provided storage (a *BHS, a []byte) and never allocates.
//   - Decoding never panics on any input and reports malformed input with an error wrapping
//     ErrMalformed; a decoded BHS is only trusted after Validate accepted it.
//   - A BHS is a plain [48]byte: accessors read the field named by RFC 7143 for the PDU's opcode,
//     so the same storage serves every opcode without conversion.
package pdu

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
)

// BHSLen is the size of the Basic Header Segment (RFC 7143 §11.2.1).
const BHSLen = 48

// DigestLen is the size of a CRC32C header or data digest (RFC 7143 §11.2.4).
const DigestLen = 4

// MaxDataSegmentLength is the largest DataSegmentLength the 24-bit field can carry; the
// negotiated MaxRecvDataSegmentLength is at most this (RFC 7143 §13.12).
const MaxDataSegmentLength = 1<<24 - 1

// ReservedTag is the reserved Initiator/Target Task Tag value 0xffffffff (RFC 7143 §11.2.1.8).
const ReservedTag = 0xffffffff

// ErrMalformed is wrapped by every decoding error.
var ErrMalformed = errors.New("malformed iSCSI PDU")

// Opcode is the 6-bit iSCSI opcode (RFC 7143 §11.2.1.2).
type Opcode uint8

// Initiator opcodes (RFC 7143 §11.2.1.2).
const (
	OpNOPOut      Opcode = 0x00
	OpSCSICommand Opcode = 0x01
	OpTaskMgmtReq Opcode = 0x02
	OpLoginReq    Opcode = 0x03
	OpTextReq     Opcode = 0x04
	OpDataOut     Opcode = 0x05
	OpLogoutReq   Opcode = 0x06
	OpSNACKReq    Opcode = 0x10
)

// Target opcodes (RFC 7143 §11.2.1.2).
const (
	OpNOPIn        Opcode = 0x20
	OpSCSIResponse Opcode = 0x21
	OpTaskMgmtResp Opcode = 0x22
	OpLoginResp    Opcode = 0x23
	OpTextResp     Opcode = 0x24
	OpDataIn       Opcode = 0x25
	OpLogoutResp   Opcode = 0x26
	OpR2T          Opcode = 0x31
	OpAsyncMessage Opcode = 0x32
	OpReject       Opcode = 0x3f
)

var opNames = [64]string{
	OpNOPOut: "NOP-Out", OpSCSICommand: "SCSI Command", OpTaskMgmtReq: "Task Management Request",
	OpLoginReq: "Login Request", OpTextReq: "Text Request", OpDataOut: "SCSI Data-Out",
	OpLogoutReq: "Logout Request", OpSNACKReq: "SNACK Request", OpNOPIn: "NOP-In",
	OpSCSIResponse: "SCSI Response", OpTaskMgmtResp: "Task Management Response",
	OpLoginResp: "Login Response", OpTextResp: "Text Response", OpDataIn: "SCSI Data-In",
	OpLogoutResp: "Logout Response", OpR2T: "R2T", OpAsyncMessage: "Asynchronous Message",
	OpReject: "Reject",
}

func (o Opcode) String() string {
	if int(o) < len(opNames) && opNames[o] != "" {
		return opNames[o]
	}
	return fmt.Sprintf("opcode 0x%02x", uint8(o))
}

// FromTarget reports whether the opcode is one a target sends.
func (o Opcode) FromTarget() bool { return o&0x20 != 0 }

// Flag bits of BHS byte 1 (meaning depends on the opcode).
const (
	FlagFinal    = 0x80 // F: final PDU of a sequence (§11.2.1.3)
	FlagContinue = 0x40 // C: text/login continues (§11.10.2, §11.12.2)
	FlagTransit  = 0x80 // T: login transit (§11.12.1)

	// SCSI Command (§11.3.1).
	FlagRead  = 0x40 // R
	FlagWrite = 0x20 // W

	// SCSI Data-In (§11.7.1..5).
	FlagAck        = 0x40 // A
	FlagOverflow   = 0x04 // O
	FlagUnderflow  = 0x02 // U
	FlagStatus     = 0x01 // S
	FlagBidiOver   = 0x10 // o (SCSI Response, §11.4.5.1)
	FlagBidiUnder  = 0x08 // u
	immediateBit   = 0x40 // byte 0 I bit (§11.2.1.1)
	opcodeMask     = 0x3f
	attrMask       = 0x07
	loginStageMask = 0x03
)

// BHS is a Basic Header Segment (RFC 7143 §11.2.1). The zero value is an all-zero header.
type BHS [BHSLen]byte

// Reset zeroes the header.
func (b *BHS) Reset() { *b = BHS{} }

// Opcode returns the opcode (byte 0, low 6 bits).
func (b *BHS) Opcode() Opcode { return Opcode(b[0] & opcodeMask) }

// Immediate reports the I bit (byte 0, 0x40): immediate delivery (§11.2.1.1).
func (b *BHS) Immediate() bool { return b[0]&immediateBit != 0 }

// Flags returns byte 1 (opcode-specific flags).
func (b *BHS) Flags() uint8 { return b[1] }

// Final reports the F bit.
func (b *BHS) Final() bool { return b[1]&FlagFinal != 0 }

// TotalAHSLength returns the total AHS length in bytes (byte 4 counts 4-byte words, §11.2.1.4).
func (b *BHS) TotalAHSLength() int { return int(b[4]) * 4 }

// DataSegmentLength returns the data segment length without padding (bytes 5-7, §11.2.1.5).
func (b *BHS) DataSegmentLength() int {
	return int(b[5])<<16 | int(b[6])<<8 | int(b[7])
}

// SetDataSegmentLength sets bytes 5-7; n must be < 2^24.
func (b *BHS) SetDataSegmentLength(n int) {
	b[5], b[6], b[7] = byte(n>>16), byte(n>>8), byte(n)
}

// SetTotalAHSLength sets byte 4 from a length in bytes (a multiple of 4, at most 1020).
func (b *BHS) SetTotalAHSLength(n int) { b[4] = byte(n / 4) }

// LUN returns bytes 8-15 (the LUN field, §11.2.1.6).
func (b *BHS) LUN() uint64 { return binary.BigEndian.Uint64(b[8:16]) }

// ITT returns the Initiator Task Tag (bytes 16-19, §11.2.1.8).
func (b *BHS) ITT() uint32 { return binary.BigEndian.Uint32(b[16:20]) }

// word returns the big-endian 32-bit word at byte offset off.
func (b *BHS) word(off int) uint32 { return binary.BigEndian.Uint32(b[off : off+4]) }

func (b *BHS) setWord(off int, v uint32) { binary.BigEndian.PutUint32(b[off:off+4], v) }

// TTT is the Target Transfer Tag (bytes 20-23) of Data-Out/Data-In, R2T, NOP, Text (§11.7.4, §11.8.2).
func (b *BHS) TTT() uint32 { return b.word(20) }

// StatSN is bytes 24-27 of a target PDU (§11.4.9 and every target PDU).
func (b *BHS) StatSN() uint32 { return b.word(24) }

// ExpCmdSN is bytes 28-31 of a target PDU (§11.4.10).
func (b *BHS) ExpCmdSN() uint32 { return b.word(28) }

// MaxCmdSN is bytes 32-35 of a target PDU (§11.4.10).
func (b *BHS) MaxCmdSN() uint32 { return b.word(32) }

// DataSN is bytes 36-39 of Data-In (DataSN), R2T (R2TSN), SCSI Response (ExpDataSN) and Reject
// (DataSN/R2TSN) (§11.7.5, §11.8.5).
func (b *BHS) DataSN() uint32 { return b.word(36) }

// BufferOffset is bytes 40-43 of Data-In/Data-Out/R2T (§11.7.6, §11.8.6).
func (b *BHS) BufferOffset() uint32 { return b.word(40) }

// ResidualCount is bytes 44-47 of Data-In and SCSI Response (§11.4.5.2).
func (b *BHS) ResidualCount() uint32 { return b.word(44) }

// DesiredDataTransferLength is bytes 44-47 of an R2T (§11.8.7).
func (b *BHS) DesiredDataTransferLength() uint32 { return b.word(44) }

// Response is byte 2 of SCSI Response, Task Management Response and Logout Response (§11.4.3).
func (b *BHS) Response() uint8 { return b[2] }

// Status is byte 3 of SCSI Response and of Data-In with the S bit (§11.4.2, §11.7.3).
func (b *BHS) Status() uint8 { return b[3] }

// RejectReason is byte 2 of a Reject (§11.17.1).
func (b *BHS) RejectReason() uint8 { return b[2] }

// ISID returns the 6-byte ISID of a Login PDU as an integer (§11.12.5).
func (b *BHS) ISID() uint64 {
	return uint64(b[8])<<40 | uint64(b[9])<<32 | uint64(binary.BigEndian.Uint32(b[10:14]))
}

// TSIH returns bytes 14-15 of a Login PDU (§11.12.6).
func (b *BHS) TSIH() uint16 { return binary.BigEndian.Uint16(b[14:16]) }

// LoginStages returns CSG and NSG of a login PDU (byte 1 bits 2-3 and 0-1, §11.12.3).
func (b *BHS) LoginStages() (csg, nsg uint8) {
	return (b[1] >> 2) & loginStageMask, b[1] & loginStageMask
}

// Transit reports the T bit of a login PDU.
func (b *BHS) Transit() bool { return b[1]&FlagTransit != 0 }

// Continue reports the C bit of a login or text PDU.
func (b *BHS) Continue() bool { return b[1]&FlagContinue != 0 }

// VersionMax / VersionActive are bytes 2 and 3 of a Login Response (§11.13.1-2).
func (b *BHS) VersionMax() uint8 { return b[2] }

// VersionActive is byte 3 of a Login Response.
func (b *BHS) VersionActive() uint8 { return b[3] }

// LoginStatus returns Status-Class and Status-Detail of a Login Response (bytes 36-37, §11.13.5).
func (b *BHS) LoginStatus() (class, detail uint8) { return b[36], b[37] }

// AsyncEvent returns AsyncEvent, AsyncVCode and Parameter1..3 of an Asynchronous Message
// (bytes 36-43, §11.9.1).
func (b *BHS) AsyncEvent() (event, vcode uint8, p1, p2, p3 uint16) {
	return b[36], b[37], binary.BigEndian.Uint16(b[38:40]), binary.BigEndian.Uint16(b[40:42]),
		binary.BigEndian.Uint16(b[42:44])
}

// CDB returns the 16-byte CDB field of a SCSI Command (bytes 32-47, §11.3.5).
func (b *BHS) CDB() []byte { return b[32:48] }

// ExpectedDataTransferLength is bytes 20-23 of a SCSI Command (§11.3.4).
func (b *BHS) ExpectedDataTransferLength() uint32 { return b.word(20) }

// CmdSN is bytes 24-27 of an initiator PDU (§11.3.6).
func (b *BHS) CmdSN() uint32 { return b.word(24) }

// ExpStatSN is bytes 28-31 of an initiator PDU (§11.3.7).
func (b *BHS) ExpStatSN() uint32 { return b.word(28) }

// Validate checks a BHS received from a target: a known target opcode, sane fixed bits and
// lengths. maxData bounds DataSegmentLength (our declared MaxRecvDataSegmentLength; 0 means the
// 24-bit maximum). It never panics.
func (b *BHS) Validate(maxData int) error {
	op := b.Opcode()
	if opNames[op] == "" {
		return fmt.Errorf("%w: unknown opcode 0x%02x", ErrMalformed, uint8(op))
	}
	if !op.FromTarget() {
		return fmt.Errorf("%w: initiator opcode %v received from the target", ErrMalformed, op)
	}
	dsl := b.DataSegmentLength()
	if maxData > 0 && dsl > maxData {
		return fmt.Errorf("%w: %v data segment of %d bytes exceeds MaxRecvDataSegmentLength %d",
			ErrMalformed, op, dsl, maxData)
	}
	switch op {
	case OpR2T:
		if !b.Final() {
			return fmt.Errorf("%w: R2T without the F bit", ErrMalformed)
		}
		if dsl != 0 {
			return fmt.Errorf("%w: R2T with a %d-byte data segment", ErrMalformed, dsl)
		}
		if b.DesiredDataTransferLength() == 0 {
			return fmt.Errorf("%w: R2T for zero bytes", ErrMalformed)
		}
	case OpDataIn:
		f := b[1]
		if f&FlagStatus != 0 && f&FlagFinal == 0 {
			return fmt.Errorf("%w: Data-In with S but not F", ErrMalformed)
		}
		if f&FlagOverflow != 0 && f&FlagUnderflow != 0 {
			return fmt.Errorf("%w: Data-In with both overflow and underflow", ErrMalformed)
		}
	case OpSCSIResponse:
		if b[1]&FlagOverflow != 0 && b[1]&FlagUnderflow != 0 {
			return fmt.Errorf("%w: SCSI Response with both overflow and underflow", ErrMalformed)
		}
	case OpReject:
		if dsl < BHSLen {
			return fmt.Errorf("%w: Reject carrying %d bytes instead of the rejected header", ErrMalformed, dsl)
		}
	case OpLoginResp:
		csg, nsg := b.LoginStages()
		if csg == 2 || (b.Transit() && nsg == 2) {
			return fmt.Errorf("%w: Login Response with reserved stage 2", ErrMalformed)
		}
		if b.Transit() && b.Continue() {
			return fmt.Errorf("%w: Login Response with both T and C", ErrMalformed)
		}
	case OpTextResp:
		if b.Final() && b.Continue() {
			return fmt.Errorf("%w: Text Response with both F and C", ErrMalformed)
		}
	}
	return nil
}

// PadLen returns the number of zero bytes that pad an n-byte segment to a 4-byte boundary
// (RFC 7143 §11.2.3).
func PadLen(n int) int { return (4 - n&3) & 3 }

// Padded returns n rounded up to a multiple of 4.
func Padded(n int) int { return n + PadLen(n) }

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// CRC32C returns the iSCSI digest (CRC32C, RFC 7143 §13.1 and Appendix B.4) of p, continuing from
// crc (start with 0).
func CRC32C(crc uint32, p []byte) uint32 { return crc32.Update(crc, castagnoli, p) }

// zeroPad is the padding source for digests and writes.
var zeroPad [4]byte

// ZeroPad returns n (0..3) zero bytes of padding; the slice must not be modified.
func ZeroPad(n int) []byte { return zeroPad[:n] }

// HeaderDigest is the CRC32C over the BHS and AHS (§11.2.4: the header digest covers both).
func HeaderDigest(bhs *BHS, ahs []byte) uint32 {
	return CRC32C(CRC32C(0, bhs[:]), ahs)
}

// DataDigest is the CRC32C over the data segment and its padding (§11.2.4).
func DataDigest(data []byte) uint32 {
	return CRC32C(CRC32C(0, data), zeroPad[:PadLen(len(data))])
}

// PutDigest stores a digest in the wire byte order. RFC 7143 §13.1 (via RFC 3385) transmits the
// CRC32C with its least significant byte first, which is how Linux, libiscsi and tgt put it.
func PutDigest(dst []byte, d uint32) { binary.LittleEndian.PutUint32(dst, d) }

// GetDigest reads a digest in the wire byte order (see PutDigest).
func GetDigest(src []byte) uint32 { return binary.LittleEndian.Uint32(src) }

// Word20 returns bytes 20-23 raw (TTT, Referenced Task Tag, ExpectedDataTransferLength, ... by
// opcode). Word32 returns bytes 32-35 raw (MaxCmdSN, RefCmdSN, ...). For tests and tracing.
func (b *BHS) Word20() uint32 { return b.word(20) }

// Word32 returns bytes 32-35 raw.
func (b *BHS) Word32() uint32 { return b.word(32) }
