package login

import (
	"fmt"
	"time"
)

// Params is the result of a successful login: every operational key of RFC 7143 §13 as it applies
// to this session/connection, plus the identifiers the full-feature phase needs. The session and
// the transport read it; nothing changes it after login.
type Params struct {
	// Session identity (RFC 7143 §4.1, §11.12.5-6).
	ISID       uint64 // 48-bit initiator session ID
	TSIH       uint16 // target-assigned session handle (non-zero after a normal login)
	CID        uint16
	TargetName string // empty for discovery sessions
	// TargetAlias and TargetPortalGroupTag are declared by the target (§13.6, §13.9).
	TargetAlias          string
	TargetPortalGroupTag uint16

	// Sequence numbers at the end of login: the first full-feature command uses ExpCmdSN as its
	// CmdSN (§4.2.2.1); StatSN is the last StatSN the target sent (ExpStatSN = StatSN+1).
	StatSN, ExpCmdSN, MaxCmdSN uint32

	HeaderDigest bool // CRC32C on headers (§13.1)
	DataDigest   bool // CRC32C on data segments (§13.1)

	MaxConnections uint32 // §13.2
	InitialR2T     bool   // §13.10: true = no unsolicited Data-Out PDUs
	ImmediateData  bool   // §13.11
	// MaxRecvDataSegmentLength is what we declared: the largest data segment the target may send us
	// (§13.12). TargetMaxRecvDataSegmentLength is what the target declared: the largest data
	// segment we may send it.
	MaxRecvDataSegmentLength       uint32
	TargetMaxRecvDataSegmentLength uint32
	MaxBurstLength                 uint32 // §13.13
	FirstBurstLength               uint32 // §13.14 (irrelevant when InitialR2T && !ImmediateData)
	DefaultTime2Wait               time.Duration
	DefaultTime2Retain             time.Duration
	MaxOutstandingR2T              uint32 // §13.17
	DataPDUInOrder                 bool   // §13.18
	DataSequenceInOrder            bool   // §13.19
	ErrorRecoveryLevel             uint8  // §13.20

	// Extra holds keys a transport hook negotiated (e.g. iSER's RDMAExtensions), key → final value.
	Extra map[string]string
}

// Defaults returns the RFC 7143 §13 default value of every key: what applies when a key is never
// negotiated.
func Defaults() Params {
	return Params{
		MaxConnections:                 1,
		InitialR2T:                     true,
		ImmediateData:                  true,
		MaxRecvDataSegmentLength:       8192,
		TargetMaxRecvDataSegmentLength: 8192,
		MaxBurstLength:                 262144,
		FirstBurstLength:               65536,
		DefaultTime2Wait:               2 * time.Second,
		DefaultTime2Retain:             20 * time.Second,
		MaxOutstandingR2T:              1,
		DataPDUInOrder:                 true,
		DataSequenceInOrder:            true,
		ErrorRecoveryLevel:             0,
	}
}

// UnsolicitedLimit returns how many bytes of a write may be sent without an R2T (immediate data
// plus unsolicited Data-Out, RFC 7143 §13.10-14), capped at the write length. immediate is the
// part that rides in the SCSI Command PDU itself.
func (p *Params) UnsolicitedLimit(writeLen int) (unsolicited, immediate int) {
	if p.InitialR2T && !p.ImmediateData {
		return 0, 0
	}
	u := min(writeLen, int(p.FirstBurstLength))
	if p.ImmediateData {
		immediate = min(u, int(p.TargetMaxRecvDataSegmentLength))
	}
	if p.InitialR2T {
		u = immediate // only immediate data is unsolicited
	}
	return u, immediate
}

func (p *Params) String() string {
	return fmt.Sprintf("HeaderDigest=%v DataDigest=%v InitialR2T=%v ImmediateData=%v "+
		"MaxRecvDataSegmentLength=%d/%d MaxBurstLength=%d FirstBurstLength=%d MaxOutstandingR2T=%d ERL=%d",
		yn(p.HeaderDigest), yn(p.DataDigest), yn(p.InitialR2T), yn(p.ImmediateData),
		p.MaxRecvDataSegmentLength, p.TargetMaxRecvDataSegmentLength, p.MaxBurstLength,
		p.FirstBurstLength, p.MaxOutstandingR2T, p.ErrorRecoveryLevel)
}

func yn(b bool) string {
	if b {
		return "Yes"
	}
	return "No"
}
