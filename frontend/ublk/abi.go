package ublk

// ABI of the ublk driver, from the kernel's include/uapi/linux/ublk_cmd.h (Linux 6.12; later
// kernels only append). Layouts are pinned by abi_test.go.

// ioctl encoding (include/uapi/asm-generic/ioctl.h): dir<<30 | size<<16 | type<<8 | nr.
const (
	iocWrite = 1
	iocRead  = 2
)

func ioc(dir, typ, nr, size uint32) uint32 { return dir<<30 | size<<16 | typ<<8 | nr }
func ior(nr, size uint32) uint32           { return ioc(iocRead, 'u', nr, size) }
func iowr(nr, size uint32) uint32          { return ioc(iocRead|iocWrite, 'u', nr, size) }

const (
	sizeofCtrlCmd = 32
	sizeofIOCmd   = 16
)

// Control commands on /dev/ublk-control (UBLK_U_CMD_*), ioctl-encoded (UBLK_F_CMD_IOCTL_ENCODE).
var (
	cmdGetDevInfo  = ior(0x02, sizeofCtrlCmd)
	cmdAddDev      = iowr(0x04, sizeofCtrlCmd)
	cmdDelDev      = iowr(0x05, sizeofCtrlCmd)
	cmdStartDev    = iowr(0x06, sizeofCtrlCmd)
	cmdStopDev     = iowr(0x07, sizeofCtrlCmd)
	cmdSetParams   = iowr(0x08, sizeofCtrlCmd)
	cmdGetParams   = ior(0x09, sizeofCtrlCmd)
	cmdGetFeatures = ior(0x13, sizeofCtrlCmd)
	// UBLK_U_CMD_START_USER_RECOVERY / END_USER_RECOVERY: hand a device whose server died
	// (UBLK_S_DEV_QUIESCED or FAIL_IO) to a new one.
	cmdStartUserRecovery = iowr(0x10, sizeofCtrlCmd)
	cmdEndUserRecovery   = iowr(0x11, sizeofCtrlCmd)
)

// I/O commands on /dev/ublkcN (UBLK_U_IO_*).
var (
	ioFetchReq       = iowr(0x20, sizeofIOCmd)
	ioCommitAndFetch = iowr(0x21, sizeofIOCmd)
)

// Results of FETCH / COMMIT_AND_FETCH CQEs (UBLK_IO_RES_*).
const (
	ioResOK          = 0
	ioResNeedGetData = 1
	ioResAbort       = -19 // -ENODEV: the device is going away; this tag is never refetched
)

// Feature flags (UBLK_F_*), reported by GET_FEATURES and requested in ADD_DEV.
const (
	FeatSupportZeroCopy     = 1 << 0
	FeatURingCmdCompInTask  = 1 << 1
	FeatNeedGetData         = 1 << 2
	FeatUserRecovery        = 1 << 3
	FeatUserRecoveryReissue = 1 << 4
	FeatUnprivilegedDev     = 1 << 5
	FeatCmdIoctlEncode      = 1 << 6
	FeatUserCopy            = 1 << 7
	FeatZoned               = 1 << 8
	FeatUserRecoveryFailIO  = 1 << 9
)

// Device states (UBLK_S_DEV_*).
const (
	devStateDead     = 0
	devStateLive     = 1
	devStateQuiesced = 2 // USER_RECOVERY: the server died, I/O waits in the kernel for a new one
	devStateFailIO   = 3 // USER_RECOVERY_FAIL_IO: the server died, I/O fails until a new one
)

// Request operations in ublksrv_io_desc.op_flags bits 0-7 (UBLK_IO_OP_*).
const (
	opRead        = 0
	opWrite       = 1
	opFlush       = 2
	opDiscard     = 3
	opWriteSame   = 4
	opWriteZeroes = 5
)

// Request flags in ublksrv_io_desc.op_flags (UBLK_IO_F_*), already shifted.
const (
	ioFFUA     = 1 << 13
	ioFNoUnmap = 1 << 15
)

// Parameter types and attributes (UBLK_PARAM_TYPE_*, UBLK_ATTR_*).
const (
	paramTypeBasic   = 1 << 0
	paramTypeDiscard = 1 << 1

	attrReadOnly      = 1 << 0
	attrRotational    = 1 << 1
	attrVolatileCache = 1 << 2
	attrFUA           = 1 << 3
)

// MaxID is the highest device number ADD_DEV accepts (UBLK_MAX_UBLKS - 1: a minor number).
const MaxID = 1<<20 - 1

// Limits of the driver.
const (
	maxQueueDepth = 4096    // UBLK_MAX_QUEUE_DEPTH
	maxQueues     = 4096    // UBLK_MAX_NR_QUEUES
	maxIOBufBytes = 1 << 25 // 1 << UBLK_IO_BUF_BITS: 32 MiB per request
	// ioDescArea is the per-queue stride of the descriptor mmap on /dev/ublkcN: room for
	// UBLK_MAX_QUEUE_DEPTH descriptors, page-rounded (ublk_max_cmd_buf_size()).
	ioDescArea = maxQueueDepth * sizeofIODesc
)

// ctrlCmd is struct ublksrv_ctrl_cmd, carried in the SQE128 command area.
type ctrlCmd struct {
	DevID      uint32
	QueueID    uint16 // 0xffff when the command is not for a queue
	Len        uint16
	Addr       uint64
	Data       [1]uint64
	DevPathLen uint16
	Pad        uint16
	Reserved   uint32
}

// DevInfo is struct ublksrv_ctrl_dev_info.
type DevInfo struct {
	NrHWQueues    uint16
	QueueDepth    uint16
	State         uint16
	Pad0          uint16
	MaxIOBufBytes uint32
	DevID         uint32
	UblksrvPID    int32
	Pad1          uint32
	Flags         uint64
	UblksrvFlags  uint64
	OwnerUID      uint32
	OwnerGID      uint32
	Reserved1     uint64
	Reserved2     uint64
}

const sizeofIODesc = 24

// ioDesc is struct ublksrv_io_desc, written by the driver into the mmapped per-queue array.
type ioDesc struct {
	OpFlags     uint32 // op in bits 0-7, UBLK_IO_F_* above
	NrSectors   uint32
	StartSector uint64
	Addr        uint64
}

// ioCmd is struct ublksrv_io_cmd, carried in the SQE command area of FETCH / COMMIT_AND_FETCH.
type ioCmd struct {
	QID    uint16
	Tag    uint16
	Result int32
	Addr   uint64
}

// paramBasic is struct ublk_param_basic.
type paramBasic struct {
	Attrs            uint32
	LogicalBSShift   uint8
	PhysicalBSShift  uint8
	IOOptShift       uint8
	IOMinShift       uint8
	MaxSectors       uint32
	ChunkSectors     uint32
	DevSectors       uint64
	VirtBoundaryMask uint64
}

// paramDiscard is struct ublk_param_discard.
type paramDiscard struct {
	DiscardAlignment      uint32
	DiscardGranularity    uint32
	MaxDiscardSectors     uint32
	MaxWriteZeroesSectors uint32
	MaxDiscardSegments    uint16
	Reserved0             uint16
}

// paramDevt is struct ublk_param_devt (read-only; filled by GET_PARAMS once started).
type paramDevt struct {
	CharMajor, CharMinor, DiskMajor, DiskMinor uint32
}

// paramZoned is struct ublk_param_zoned (unused, present so the layout matches 6.12's).
type paramZoned struct {
	MaxOpenZones         uint32
	MaxActiveZones       uint32
	MaxZoneAppendSectors uint32
	Reserved             [20]uint8
}

// Params is struct ublk_params as of Linux 6.12. Len tells the driver how much of it we pass;
// newer kernels with a longer struct accept the shorter one.
type Params struct {
	Len     uint32
	Types   uint32
	Basic   paramBasic
	Discard paramDiscard
	Devt    paramDevt
	Zoned   paramZoned
}

// StateName names DevInfo.State.
func (i DevInfo) StateName() string {
	switch i.State {
	case devStateDead:
		return "dead"
	case devStateLive:
		return "live"
	case devStateQuiesced:
		return "quiesced"
	case devStateFailIO:
		return "fail_io"
	}
	return "unknown"
}
