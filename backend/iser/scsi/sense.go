package scsi

import (
	"encoding/binary"
	"errors"
	"fmt"

	"github.com/iser-blk/iser-blk/block"
)

// SenseKey is the 4-bit sense key (SPC-5 §4.4.2, table 49).
type SenseKey uint8

const (
	KeyNoSense        SenseKey = 0x0
	KeyRecoveredError SenseKey = 0x1
	KeyNotReady       SenseKey = 0x2
	KeyMediumError    SenseKey = 0x3
	KeyHardwareError  SenseKey = 0x4
	KeyIllegalRequest SenseKey = 0x5
	KeyUnitAttention  SenseKey = 0x6
	KeyDataProtect    SenseKey = 0x7
	KeyBlankCheck     SenseKey = 0x8
	KeyVendorSpecific SenseKey = 0x9
	KeyCopyAborted    SenseKey = 0xA
	KeyAbortedCommand SenseKey = 0xB
	KeyVolumeOverflow SenseKey = 0xD
	KeyMiscompare     SenseKey = 0xE
	KeyCompleted      SenseKey = 0xF
)

var senseKeyNames = [16]string{
	"NO SENSE", "RECOVERED ERROR", "NOT READY", "MEDIUM ERROR", "HARDWARE ERROR",
	"ILLEGAL REQUEST", "UNIT ATTENTION", "DATA PROTECT", "BLANK CHECK", "VENDOR SPECIFIC",
	"COPY ABORTED", "ABORTED COMMAND", "RESERVED (0xC)", "VOLUME OVERFLOW", "MISCOMPARE", "COMPLETED",
}

func (k SenseKey) String() string { return senseKeyNames[k&0xF] }

// Additional sense codes iser-blk acts on (SPC-5 annex F.1), as ASC<<8 | ASCQ.
const (
	ASCNone                   = 0x0000
	ASCLUNotReadyBecoming     = 0x0401 // LOGICAL UNIT IS IN PROCESS OF BECOMING READY
	ASCInvalidOpcode          = 0x2000 // INVALID COMMAND OPERATION CODE
	ASCLBAOutOfRange          = 0x2100 // LOGICAL BLOCK ADDRESS OUT OF RANGE
	ASCInvalidFieldInCDB      = 0x2400 // INVALID FIELD IN CDB
	ASCLUNotSupported         = 0x2500 // LOGICAL UNIT NOT SUPPORTED
	ASCInvalidFieldInParams   = 0x2600 // INVALID FIELD IN PARAMETER LIST
	ASCParamListLengthError   = 0x1A00 // PARAMETER LIST LENGTH ERROR
	ASCWriteProtected         = 0x2700 // WRITE PROTECTED
	ASCSpaceAllocFailedWP     = 0x2707 // SPACE ALLOCATION FAILED WRITE PROTECT
	ASCPowerOnReset           = 0x2900 // POWER ON, RESET, OR BUS DEVICE RESET OCCURRED
	ASCParametersChanged      = 0x2A00 // PARAMETERS CHANGED
	ASCCapacityDataChanged    = 0x2A09 // CAPACITY DATA HAS CHANGED
	ASCReportedLUNsChanged    = 0x3F0E // REPORTED LUNS DATA HAS CHANGED
	ASCThinSoftThreshold      = 0x3807 // THIN PROVISIONING SOFT THRESHOLD REACHED
	ASCUnrecoveredReadError   = 0x1100 // UNRECOVERED READ ERROR
	ASCMediumNotPresent       = 0x3A00 // MEDIUM NOT PRESENT
	ASCLUNotReadyInProgress   = 0x0407 // LOGICAL UNIT NOT READY, OPERATION IN PROGRESS
	ASCLUNotReadyManualInterv = 0x0403 // LOGICAL UNIT NOT READY, MANUAL INTERVENTION REQUIRED
)

// Sense is decoded sense data (SPC-5 §4.4): fixed format (response codes 0x70/0x71) or
// descriptor format (0x72/0x73).
type Sense struct {
	ResponseCode uint8 // 0x70..0x73
	Deferred     bool  // the error belongs to an earlier command (0x71/0x73)
	Key          SenseKey
	ASC, ASCQ    uint8
	InfoValid    bool   // Info holds the INFORMATION field (e.g. the first failing LBA)
	Info         uint64 // INFORMATION
	CmdInfo      uint64 // COMMAND-SPECIFIC INFORMATION
	SKSValid     bool   // SenseKeySpecific is valid
	// SenseKeySpecific holds the 3 sense-key specific bytes (SKSV bit cleared), e.g. the
	// field pointer of an ILLEGAL REQUEST.
	SenseKeySpecific [3]byte
}

// Code is ASC<<8 | ASCQ, to compare against the ASC* constants.
func (s *Sense) Code() uint16 { return uint16(s.ASC)<<8 | uint16(s.ASCQ) }

// ErrShortSense reports sense data too short to carry a sense key.
var ErrShortSense = errors.New("scsi: sense data too short")

// ParseSense decodes sense data as it arrives from a target (untrusted: any length, any bytes).
// Fields past the end of a truncated buffer or past the ADDITIONAL SENSE LENGTH read as zero, as
// SPC-5 §4.4.1 tells an application client to do.
func ParseSense(b []byte) (Sense, error) {
	var s Sense
	if len(b) < 1 {
		return s, ErrShortSense
	}
	s.ResponseCode = b[0] & 0x7F
	switch s.ResponseCode {
	case 0x70, 0x71:
		return s, parseFixedSense(b, &s)
	case 0x72, 0x73:
		return s, parseDescriptorSense(b, &s)
	}
	return s, fmt.Errorf("scsi: unknown sense response code 0x%02x", s.ResponseCode)
}

// parseFixedSense decodes fixed-format sense (SPC-5 §4.4.3).
func parseFixedSense(b []byte, s *Sense) error {
	s.Deferred = s.ResponseCode == 0x71
	if len(b) < 3 {
		return ErrShortSense
	}
	// Bytes past the additional sense length are not sense data.
	if len(b) >= 8 {
		if n := 8 + int(b[7]); n < len(b) {
			b = b[:n]
		}
	}
	s.Key = SenseKey(b[2] & 0x0F)
	if len(b) >= 7 {
		s.InfoValid = b[0]&0x80 != 0
		s.Info = uint64(binary.BigEndian.Uint32(b[3:7]))
	}
	if len(b) >= 12 {
		s.CmdInfo = uint64(binary.BigEndian.Uint32(b[8:12]))
	}
	if len(b) >= 13 {
		s.ASC = b[12]
	}
	if len(b) >= 14 {
		s.ASCQ = b[13]
	}
	if len(b) >= 18 && b[15]&0x80 != 0 {
		s.SKSValid = true
		s.SenseKeySpecific = [3]byte{b[15] & 0x7F, b[16], b[17]}
	}
	return nil
}

// parseDescriptorSense decodes descriptor-format sense (SPC-5 §4.4.2) and the descriptors
// iser-blk uses: information (0x00), command-specific information (0x01), sense-key specific (0x02).
func parseDescriptorSense(b []byte, s *Sense) error {
	s.Deferred = s.ResponseCode == 0x73
	if len(b) < 2 {
		return ErrShortSense
	}
	s.Key = SenseKey(b[1] & 0x0F)
	if len(b) >= 3 {
		s.ASC = b[2]
	}
	if len(b) >= 4 {
		s.ASCQ = b[3]
	}
	if len(b) < 8 {
		return nil
	}
	end := min(8+int(b[7]), len(b))
	for p := 8; p+2 <= end; {
		typ, n := b[p], int(b[p+1])
		next := p + 2 + n
		if next > end {
			break // truncated descriptor: ignore it rather than read past the data
		}
		d := b[p:next]
		switch typ {
		case 0x00: // information: VALID in byte 2, 8-byte INFORMATION at 4..11
			if len(d) >= 12 {
				s.InfoValid = d[2]&0x80 != 0
				s.Info = binary.BigEndian.Uint64(d[4:12])
			}
		case 0x01:
			if len(d) >= 12 {
				s.CmdInfo = binary.BigEndian.Uint64(d[4:12])
			}
		case 0x02:
			if len(d) >= 7 && d[4]&0x80 != 0 {
				s.SKSValid = true
				s.SenseKeySpecific = [3]byte{d[4] & 0x7F, d[5], d[6]}
			}
		}
		p = next
	}
	return nil
}

// SenseError is a command that completed with CHECK CONDITION. It satisfies exactly one block
// sentinel through Is, so the layers above map it to an errno without knowing SCSI.
type SenseError struct {
	Command string // e.g. "WRITE(16)"
	Sense
}

func (e *SenseError) Error() string {
	msg := fmt.Sprintf("scsi: %s: %s", e.Command, e.Key)
	if d := ascDescription(e.Code()); d != "" {
		msg += ": " + d
	}
	msg += fmt.Sprintf(" (ASC/ASCQ 0x%02x/0x%02x)", e.ASC, e.ASCQ)
	if e.InfoValid {
		msg += fmt.Sprintf(" at information 0x%x", e.Info)
	}
	if e.Deferred {
		msg += " (deferred)"
	}
	return msg
}

// Sentinel is the block sentinel this sense maps to.
func (e *SenseError) Sentinel() error {
	code := e.Code()
	switch e.Key {
	case KeyDataProtect:
		if code == ASCSpaceAllocFailedWP {
			return block.ErrNoSpace
		}
		return block.ErrReadOnly
	case KeyIllegalRequest:
		switch code {
		case ASCInvalidOpcode:
			return block.ErrNotSupported
		case ASCLBAOutOfRange, ASCInvalidFieldInCDB, ASCInvalidFieldInParams, ASCParamListLengthError:
			return block.ErrInvalid
		}
		return block.ErrIO
	case KeyMediumError:
		return block.ErrMedium
	}
	return block.ErrIO
}

// Is maps the sense to the block sentinels (see Sentinel).
func (e *SenseError) Is(target error) bool { return target == e.Sentinel() }

// StatusError is a command that completed with a status other than GOOD or CHECK CONDITION
// (or CHECK CONDITION without sense data). It maps to block.ErrIO.
type StatusError struct {
	Command string
	Status  Status
}

func (e *StatusError) Error() string {
	return fmt.Sprintf("scsi: %s: status %s", e.Command, e.Status)
}

// Is makes a StatusError match block.ErrIO.
func (e *StatusError) Is(target error) bool { return target == block.ErrIO }

func (s Status) String() string {
	switch s {
	case StatusGood:
		return "GOOD"
	case StatusCheckCondition:
		return "CHECK CONDITION"
	case StatusConditionMet:
		return "CONDITION MET"
	case StatusBusy:
		return "BUSY"
	case StatusReservationConflict:
		return "RESERVATION CONFLICT"
	case StatusTaskSetFull:
		return "TASK SET FULL"
	case StatusACAActive:
		return "ACA ACTIVE"
	case StatusTaskAborted:
		return "TASK ABORTED"
	}
	return fmt.Sprintf("0x%02x", uint8(s))
}

// CheckStatus turns a completed command's response into nil (GOOD, CONDITION MET) or an error:
// *SenseError for CHECK CONDITION with decodable sense, *StatusError otherwise. It allocates
// nothing on the GOOD path. The error does not name the command; see CheckCommand.
func CheckStatus(resp *Response) error {
	return checkStatus("command", resp)
}

// CheckCommand is CheckStatus with the command's name in the error.
func CheckCommand(cmd *Command, resp *Response) error {
	if resp.Status == StatusGood || resp.Status == StatusConditionMet {
		return nil
	}
	return checkStatus(cmd.Name(), resp)
}

func checkStatus(name string, resp *Response) error {
	switch resp.Status {
	case StatusGood, StatusConditionMet:
		return nil
	case StatusCheckCondition:
		s, err := ParseSense(resp.Sense[:min(int(resp.SenseLen), MaxSense)])
		if err != nil {
			return &StatusError{Command: name, Status: resp.Status}
		}
		return &SenseError{Command: name, Sense: s}
	}
	return &StatusError{Command: name, Status: resp.Status}
}

// SetSense fills resp with CHECK CONDITION and fixed-format sense; for targets in tests and for
// synthesising errors.
func (resp *Response) SetSense(key SenseKey, asc, ascq uint8) {
	resp.Status = StatusCheckCondition
	resp.Sense = [MaxSense]byte{}
	resp.Sense[0] = 0x70
	resp.Sense[2] = byte(key)
	resp.Sense[7] = 10
	resp.Sense[12] = asc
	resp.Sense[13] = ascq
	resp.SenseLen = 18
}

// Reset clears resp for reuse.
func (resp *Response) Reset() {
	resp.Status = StatusGood
	resp.SenseLen = 0
	resp.Residual = 0
}

func ascDescription(code uint16) string {
	switch code {
	case ASCNone:
		return ""
	case ASCLUNotReadyBecoming:
		return "logical unit is becoming ready"
	case ASCLUNotReadyManualInterv:
		return "logical unit not ready, manual intervention required"
	case ASCInvalidOpcode:
		return "invalid command operation code"
	case ASCLBAOutOfRange:
		return "logical block address out of range"
	case ASCInvalidFieldInCDB:
		return "invalid field in CDB"
	case ASCLUNotSupported:
		return "logical unit not supported"
	case ASCInvalidFieldInParams:
		return "invalid field in parameter list"
	case ASCParamListLengthError:
		return "parameter list length error"
	case ASCWriteProtected:
		return "write protected"
	case ASCSpaceAllocFailedWP:
		return "space allocation failed write protect"
	case ASCPowerOnReset:
		return "power on, reset, or bus device reset occurred"
	case ASCParametersChanged:
		return "parameters changed"
	case ASCCapacityDataChanged:
		return "capacity data has changed"
	case ASCReportedLUNsChanged:
		return "reported luns data has changed"
	case ASCThinSoftThreshold:
		return "thin provisioning soft threshold reached"
	case ASCUnrecoveredReadError:
		return "unrecovered read error"
	case ASCMediumNotPresent:
		return "medium not present"
	}
	return ""
}
