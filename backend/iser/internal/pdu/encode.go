package pdu

import "encoding/binary"

// The encoders below fill a *BHS in place (RFC 7143 §11). They overwrite all 48 bytes, so a
// reused BHS needs no Reset. Fields the session fills just before sending (CmdSN, ExpStatSN) can
// be patched later with SetCmdSN/SetExpStatSN.

func (b *BHS) head(op Opcode, immediate bool, flags uint8) {
	*b = BHS{}
	b[0] = byte(op)
	if immediate {
		b[0] |= immediateBit
	}
	b[1] = flags
}

// SCSICommand is a SCSI Command PDU (§11.3).
type SCSICommand struct {
	Immediate                  bool
	Final                      bool // F: no unsolicited Data-Out PDUs follow (§11.3.1)
	Read, Write                bool // R and W bits
	Attr                       uint8
	AHSLength                  int // bytes
	DataSegmentLength          int // immediate data
	LUN                        uint64
	ITT                        uint32
	ExpectedDataTransferLength uint32
	CmdSN, ExpStatSN           uint32
	CDB                        []byte // up to 16 bytes here; longer CDBs use an extended-CDB AHS
}

// Encode writes the command into b.
func (c *SCSICommand) Encode(b *BHS) {
	var f uint8
	if c.Final {
		f |= FlagFinal
	}
	if c.Read {
		f |= FlagRead
	}
	if c.Write {
		f |= FlagWrite
	}
	f |= c.Attr & attrMask
	b.head(OpSCSICommand, c.Immediate, f)
	b.SetTotalAHSLength(c.AHSLength)
	b.SetDataSegmentLength(c.DataSegmentLength)
	binary.BigEndian.PutUint64(b[8:16], c.LUN)
	b.setWord(16, c.ITT)
	b.setWord(20, c.ExpectedDataTransferLength)
	b.setWord(24, c.CmdSN)
	b.setWord(28, c.ExpStatSN)
	copy(b[32:48], c.CDB)
}

// DataOut is a SCSI Data-Out PDU (§11.7).
type DataOut struct {
	Final             bool
	DataSegmentLength int
	LUN               uint64
	ITT, TTT          uint32
	ExpStatSN         uint32
	DataSN            uint32
	BufferOffset      uint32
}

// Encode writes the Data-Out header into b.
func (d *DataOut) Encode(b *BHS) {
	var f uint8
	if d.Final {
		f = FlagFinal
	}
	b.head(OpDataOut, false, f)
	b.SetDataSegmentLength(d.DataSegmentLength)
	binary.BigEndian.PutUint64(b[8:16], d.LUN)
	b.setWord(16, d.ITT)
	b.setWord(20, d.TTT)
	b.setWord(28, d.ExpStatSN)
	b.setWord(36, d.DataSN)
	b.setWord(40, d.BufferOffset)
}

// NOPOut is a NOP-Out PDU (§11.18). A ping has ITT != 0xffffffff and TTT 0xffffffff; an answer
// to a target's NOP-In has ITT 0xffffffff and echoes the TTT and LUN (§11.18.2-3).
type NOPOut struct {
	Immediate         bool
	DataSegmentLength int
	LUN               uint64
	ITT, TTT          uint32
	CmdSN, ExpStatSN  uint32
}

// Encode writes the NOP-Out header into b.
func (n *NOPOut) Encode(b *BHS) {
	b.head(OpNOPOut, n.Immediate, FlagFinal)
	b.SetDataSegmentLength(n.DataSegmentLength)
	binary.BigEndian.PutUint64(b[8:16], n.LUN)
	b.setWord(16, n.ITT)
	b.setWord(20, n.TTT)
	b.setWord(24, n.CmdSN)
	b.setWord(28, n.ExpStatSN)
}

// Login stages (RFC 7143 §11.12.3).
const (
	StageSecurity    = 0
	StageOperational = 1
	StageFullFeature = 3
)

// LoginRequest is a Login Request PDU (§11.12). Login requests always carry the I bit.
type LoginRequest struct {
	Transit, Continue bool
	CSG, NSG          uint8
	VersionMax        uint8
	VersionMin        uint8
	DataSegmentLength int
	ISID              uint64 // 48 bits
	TSIH              uint16
	ITT               uint32
	CID               uint16
	CmdSN, ExpStatSN  uint32
}

// Encode writes the Login Request header into b.
func (l *LoginRequest) Encode(b *BHS) {
	var f uint8
	if l.Transit {
		f |= FlagTransit
	}
	if l.Continue {
		f |= FlagContinue
	}
	f |= (l.CSG & loginStageMask) << 2
	if l.Transit {
		f |= l.NSG & loginStageMask
	}
	b.head(OpLoginReq, true, f)
	b[2], b[3] = l.VersionMax, l.VersionMin
	b.SetDataSegmentLength(l.DataSegmentLength)
	b[8], b[9] = byte(l.ISID>>40), byte(l.ISID>>32)
	b.setWord(10, uint32(l.ISID))
	binary.BigEndian.PutUint16(b[14:16], l.TSIH)
	b.setWord(16, l.ITT)
	binary.BigEndian.PutUint16(b[20:22], l.CID)
	b.setWord(24, l.CmdSN)
	b.setWord(28, l.ExpStatSN)
}

// TextRequest is a Text Request PDU (§11.10).
type TextRequest struct {
	Immediate         bool
	Final, Continue   bool
	DataSegmentLength int
	LUN               uint64
	ITT, TTT          uint32
	CmdSN, ExpStatSN  uint32
}

// Encode writes the Text Request header into b.
func (t *TextRequest) Encode(b *BHS) {
	var f uint8
	if t.Final {
		f |= FlagFinal
	}
	if t.Continue {
		f |= FlagContinue
	}
	b.head(OpTextReq, t.Immediate, f)
	b.SetDataSegmentLength(t.DataSegmentLength)
	binary.BigEndian.PutUint64(b[8:16], t.LUN)
	b.setWord(16, t.ITT)
	b.setWord(20, t.TTT)
	b.setWord(24, t.CmdSN)
	b.setWord(28, t.ExpStatSN)
}

// Logout reason codes (§11.14.1).
const (
	LogoutCloseSession    = 0
	LogoutCloseConnection = 1
	LogoutRemoveForRecov  = 2
)

// LogoutRequest is a Logout Request PDU (§11.14).
type LogoutRequest struct {
	Immediate        bool
	Reason           uint8
	ITT              uint32
	CID              uint16
	CmdSN, ExpStatSN uint32
}

// Encode writes the Logout Request header into b.
func (l *LogoutRequest) Encode(b *BHS) {
	b.head(OpLogoutReq, l.Immediate, FlagFinal|l.Reason&0x7f)
	b.setWord(16, l.ITT)
	binary.BigEndian.PutUint16(b[20:22], l.CID)
	b.setWord(24, l.CmdSN)
	b.setWord(28, l.ExpStatSN)
}

// Task management functions (§11.5.1).
const (
	TMFAbortTask        = 1
	TMFAbortTaskSet     = 2
	TMFClearACA         = 3
	TMFClearTaskSet     = 4
	TMFLogicalUnitReset = 5
	TMFTargetWarmReset  = 6
	TMFTargetColdReset  = 7
	TMFTaskReassign     = 8
)

// TaskMgmtRequest is a Task Management Function Request PDU (§11.5).
type TaskMgmtRequest struct {
	Immediate        bool
	Function         uint8
	LUN              uint64
	ITT              uint32
	RefTaskTag       uint32
	CmdSN, ExpStatSN uint32
	RefCmdSN         uint32
	ExpDataSN        uint32
}

// Encode writes the TMF Request header into b.
func (t *TaskMgmtRequest) Encode(b *BHS) {
	b.head(OpTaskMgmtReq, t.Immediate, FlagFinal|t.Function&0x7f)
	binary.BigEndian.PutUint64(b[8:16], t.LUN)
	b.setWord(16, t.ITT)
	b.setWord(20, t.RefTaskTag)
	b.setWord(24, t.CmdSN)
	b.setWord(28, t.ExpStatSN)
	b.setWord(32, t.RefCmdSN)
	b.setWord(36, t.ExpDataSN)
}

// SNACKRequest is a SNACK Request PDU (§11.16); only meaningful at ErrorRecoveryLevel > 0.
type SNACKRequest struct {
	Type      uint8
	LUN       uint64
	ITT, TTT  uint32
	ExpStatSN uint32
	BegRun    uint32
	RunLength uint32
}

// Encode writes the SNACK header into b.
func (s *SNACKRequest) Encode(b *BHS) {
	b.head(OpSNACKReq, false, FlagFinal|s.Type&0x0f)
	binary.BigEndian.PutUint64(b[8:16], s.LUN)
	b.setWord(16, s.ITT)
	b.setWord(20, s.TTT)
	b.setWord(28, s.ExpStatSN)
	b.setWord(40, s.BegRun)
	b.setWord(44, s.RunLength)
}

// Target-side encoders. An initiator never sends these; they exist so tests (the in-process fake
// target) and fuzz seeds can build exact wire images with the same code that decodes them.

// TargetHeader holds the fields shared by target PDUs (StatSN, ExpCmdSN, MaxCmdSN).
type TargetHeader struct {
	StatSN, ExpCmdSN, MaxCmdSN uint32
}

func (b *BHS) targetSNs(t TargetHeader) {
	b.setWord(24, t.StatSN)
	b.setWord(28, t.ExpCmdSN)
	b.setWord(32, t.MaxCmdSN)
}

// EncodeDataIn fills a SCSI Data-In header (§11.7). flags holds F/A/O/U/S.
func EncodeDataIn(b *BHS, flags, status uint8, dataLen int, itt, ttt uint32, t TargetHeader,
	dataSN, offset, residual uint32) {
	b.head(OpDataIn, false, flags)
	if flags&FlagStatus != 0 {
		b[3] = status
	}
	b.SetDataSegmentLength(dataLen)
	b.setWord(16, itt)
	b.setWord(20, ttt)
	b.targetSNs(t)
	b.setWord(36, dataSN)
	b.setWord(40, offset)
	b.setWord(44, residual)
}

// EncodeSCSIResponse fills a SCSI Response header (§11.4). flags holds o/u/O/U.
func EncodeSCSIResponse(b *BHS, flags, response, status uint8, dataLen int, itt uint32,
	t TargetHeader, expDataSN, residual uint32) {
	b.head(OpSCSIResponse, false, FlagFinal|flags)
	b[2], b[3] = response, status
	b.SetDataSegmentLength(dataLen)
	b.setWord(16, itt)
	b.targetSNs(t)
	b.setWord(36, expDataSN)
	b.setWord(44, residual)
}

// EncodeR2T fills an R2T header (§11.8).
func EncodeR2T(b *BHS, lun uint64, itt, ttt uint32, t TargetHeader, r2tSN, offset, length uint32) {
	b.head(OpR2T, false, FlagFinal)
	binary.BigEndian.PutUint64(b[8:16], lun)
	b.setWord(16, itt)
	b.setWord(20, ttt)
	b.targetSNs(t)
	b.setWord(36, r2tSN)
	b.setWord(40, offset)
	b.setWord(44, length)
}

// EncodeNOPIn fills a NOP-In header (§11.19).
func EncodeNOPIn(b *BHS, dataLen int, lun uint64, itt, ttt uint32, t TargetHeader) {
	b.head(OpNOPIn, false, FlagFinal)
	b.SetDataSegmentLength(dataLen)
	binary.BigEndian.PutUint64(b[8:16], lun)
	b.setWord(16, itt)
	b.setWord(20, ttt)
	b.targetSNs(t)
}

// EncodeReject fills a Reject header (§11.17); the data segment is the rejected BHS.
func EncodeReject(b *BHS, reason uint8, t TargetHeader) {
	b.head(OpReject, false, FlagFinal)
	b[2] = reason
	b.SetDataSegmentLength(BHSLen)
	b.setWord(16, ReservedTag)
	b.targetSNs(t)
}

// EncodeAsyncMessage fills an Asynchronous Message header (§11.9).
func EncodeAsyncMessage(b *BHS, dataLen int, lun uint64, t TargetHeader, event, vcode uint8, p1, p2, p3 uint16) {
	b.head(OpAsyncMessage, false, FlagFinal)
	b.SetDataSegmentLength(dataLen)
	binary.BigEndian.PutUint64(b[8:16], lun)
	b.setWord(16, ReservedTag)
	b.targetSNs(t)
	b[36], b[37] = event, vcode
	binary.BigEndian.PutUint16(b[38:40], p1)
	binary.BigEndian.PutUint16(b[40:42], p2)
	binary.BigEndian.PutUint16(b[42:44], p3)
}

// EncodeLoginResponse fills a Login Response header (§11.13).
func EncodeLoginResponse(b *BHS, transit, cont bool, csg, nsg uint8, dataLen int, isid uint64,
	tsih uint16, itt uint32, t TargetHeader, class, detail uint8) {
	var f uint8
	if transit {
		f |= FlagTransit | nsg&loginStageMask
	}
	if cont {
		f |= FlagContinue
	}
	f |= (csg & loginStageMask) << 2
	b.head(OpLoginResp, false, f)
	b[2], b[3] = 0, 0
	b.SetDataSegmentLength(dataLen)
	b[8], b[9] = byte(isid>>40), byte(isid>>32)
	b.setWord(10, uint32(isid))
	binary.BigEndian.PutUint16(b[14:16], tsih)
	b.setWord(16, itt)
	b.targetSNs(t)
	b[36], b[37] = class, detail
}

// EncodeTextResponse fills a Text Response header (§11.11).
func EncodeTextResponse(b *BHS, final, cont bool, dataLen int, itt, ttt uint32, t TargetHeader) {
	var f uint8
	if final {
		f |= FlagFinal
	}
	if cont {
		f |= FlagContinue
	}
	b.head(OpTextResp, false, f)
	b.SetDataSegmentLength(dataLen)
	b.setWord(16, itt)
	b.setWord(20, ttt)
	b.targetSNs(t)
}

// EncodeLogoutResponse fills a Logout Response header (§11.15).
func EncodeLogoutResponse(b *BHS, response uint8, itt uint32, t TargetHeader, t2w, t2r uint16) {
	b.head(OpLogoutResp, false, FlagFinal)
	b[2] = response
	b.setWord(16, itt)
	b.targetSNs(t)
	binary.BigEndian.PutUint16(b[40:42], t2w)
	binary.BigEndian.PutUint16(b[42:44], t2r)
}

// EncodeTaskMgmtResponse fills a Task Management Function Response header (§11.6).
func EncodeTaskMgmtResponse(b *BHS, response uint8, itt uint32, t TargetHeader) {
	b.head(OpTaskMgmtResp, false, FlagFinal)
	b[2] = response
	b.setWord(16, itt)
	b.targetSNs(t)
}
