// Package scsi builds the SCSI commands iser-blk sends (SBC-4/SPC-5 CDBs) and decodes what comes
// back (status, fixed and descriptor sense) into typed errors that satisfy the block package's
// sentinels. It knows nothing about iSCSI: a Command goes to an Executor, which an iSCSI session
// implements over TCP or iSER.
//
// It stays public (not under backend/iser/internal) because its types are part of the backend's
// API: iser.NewDevice takes []scsi.Executor (the seam that lets frontends, the cache and the e2e
// suites run the real device layer over scsitest's in-memory LUN), Options.Retry is a
// *scsi.RetryPolicy, and callers match command failures with errors.As(err, *scsi.SenseError).
//
// Invariant: every failure it decodes satisfies a block sentinel (errors.Is).
package scsi

import "context"

// Direction of a command's data phase, seen from the initiator.
type Direction uint8

const (
	DirNone  Direction = iota // no data phase
	DirRead                   // data-in: target to initiator (READ, INQUIRY, ...)
	DirWrite                  // data-out: initiator to target (WRITE, UNMAP parameter list, ...)
)

// TaskAttr is the SAM task attribute of a command (RFC 7143 §11.3.1 ATTR field).
type TaskAttr uint8

const (
	AttrUntagged TaskAttr = 0
	AttrSimple   TaskAttr = 1
	AttrOrdered  TaskAttr = 2
	AttrHead     TaskAttr = 3
	AttrACA      TaskAttr = 4
)

// MaxSense is the largest sense buffer SPC allows (252 bytes).
const MaxSense = 252

// Command is one SCSI command for an Executor. It is designed to be reused: a caller keeps
// Commands in a free list so the hot path allocates nothing.
type Command struct {
	LUN    uint64   // SAM LUN (already encoded as the 8-byte LUN field's value, see EncodeLUN)
	CDB    [16]byte // command descriptor block
	CDBLen uint8    // 6, 10, 12 or 16
	Dir    Direction
	// Data is the data-in buffer (Dir == DirRead, len = expected transfer length) or the data-out
	// payload (Dir == DirWrite). The Executor does not keep it after Execute returns.
	Data []byte
	Attr TaskAttr
}

// Response is what the target answered. Also reusable.
type Response struct {
	Status   Status
	SenseLen uint8
	Sense    [MaxSense]byte
	// Residual is the SCSI residual count: positive when the target moved fewer bytes than
	// expected (underflow), negative on overflow.
	Residual int64
}

// Executor runs SCSI commands: an iSCSI session implements it. Execute blocks until the command
// completes (or ctx ends, in which case the Executor aborts or abandons the task and returns the
// context's error). A transport or session failure is an error; a completed command with a
// non-GOOD status is not an error at this level: the caller inspects resp (see CheckStatus).
// Execute is safe for concurrent use: many commands are in flight at once.
type Executor interface {
	Execute(ctx context.Context, cmd *Command, resp *Response) error
}

// Status is the SAM status byte.
type Status uint8

const (
	StatusGood                Status = 0x00
	StatusCheckCondition      Status = 0x02
	StatusConditionMet        Status = 0x04
	StatusBusy                Status = 0x08
	StatusReservationConflict Status = 0x18
	StatusTaskSetFull         Status = 0x28
	StatusACAActive           Status = 0x30
	StatusTaskAborted         Status = 0x40
)
