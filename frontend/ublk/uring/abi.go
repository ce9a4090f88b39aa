package uring

// ABI of io_uring as defined by the kernel's include/uapi/linux/io_uring.h. Field names follow the
// header; the layouts are checked against the header's sizes and offsets in abi_test.go.

// io_uring_setup(2) flags (IORING_SETUP_*).
const (
	SetupCQSize       = 1 << 3  // Params.CQEntries is honoured
	SetupClamp        = 1 << 4  // clamp entries to the kernel maximum instead of failing
	SetupSubmitAll    = 1 << 7  // keep submitting after a failed SQE
	SetupCoopTaskrun  = 1 << 8  // run task work only on kernel entry (no IPI)
	SetupSQE128       = 1 << 10 // 128-byte SQEs: 80 bytes of command data for URING_CMD
	SetupCQE32        = 1 << 11 // 32-byte CQEs
	SetupSingleIssuer = 1 << 12 // one task submits
)

// io_uring_enter(2) flags (IORING_ENTER_*).
const (
	EnterGetEvents = 1 << 0
)

// Params.Features bits (IORING_FEAT_*).
const (
	FeatSingleMmap = 1 << 0 // SQ and CQ rings share one mapping
	FeatNoDrop     = 1 << 1 // CQEs are never dropped on CQ overflow
	FeatFastPoll   = 1 << 5 // non-blocking files are polled internally instead of punted
)

// Opcodes (enum io_uring_op).
const (
	OpNop      = 0
	OpPollAdd  = 6
	OpRead     = 22
	OpWrite    = 23
	OpMsgRing  = 40
	OpUringCmd = 46
)

// CQE flags (IORING_CQE_F_*).
const (
	CQEFMore = 1 << 1 // the SQE will post more CQEs (multishot)
)

// mmap offsets (IORING_OFF_*).
const (
	offSQRing = 0
	offCQRing = 0x8000000
	offSQEs   = 0x10000000
)

// sqringOffsets is struct io_sqring_offsets.
type sqringOffsets struct {
	Head, Tail, RingMask, RingEntries, Flags, Dropped, Array, Resv1 uint32
	UserAddr                                                        uint64
}

// cqringOffsets is struct io_cqring_offsets.
type cqringOffsets struct {
	Head, Tail, RingMask, RingEntries, Overflow, CQEs, Flags, Resv1 uint32
	UserAddr                                                        uint64
}

// Params is struct io_uring_params: passed to io_uring_setup, filled in by the kernel.
type Params struct {
	SQEntries    uint32
	CQEntries    uint32
	Flags        uint32
	SQThreadCPU  uint32
	SQThreadIdle uint32
	Features     uint32
	WQFd         uint32
	Resv         [3]uint32
	SQOff        sqringOffsets
	CQOff        cqringOffsets
}

// SQE is the first 64 bytes of struct io_uring_sqe. With SetupSQE128 each entry is 128 bytes and
// the 80 bytes from offset 48 (Addr3 onward) are the command area of IORING_OP_URING_CMD; reach
// them with Ring.Cmd.
type SQE struct {
	Opcode      uint8
	Flags       uint8
	IOPrio      uint16
	Fd          int32
	Off         uint64 // file offset; for URING_CMD the low-addressed 32 bits are cmd_op
	Addr        uint64
	Len         uint32
	OpFlags     uint32 // rw_flags, poll32_events, uring_cmd_flags, msg_ring_flags, ...
	UserData    uint64
	BufIndex    uint16
	Personality uint16
	SpliceFdIn  int32
	Addr3       uint64
	pad2        uint64
}

// CQE is struct io_uring_cqe (without the CQE32 extension).
type CQE struct {
	UserData uint64
	Res      int32
	Flags    uint32
}

// CmdSize is the size of the URING_CMD command area in a 128-byte SQE.
const CmdSize = 80

// cmdOffset is where the command area starts inside an SQE (offsetof(struct io_uring_sqe, cmd)).
const cmdOffset = 48
