package ublk

import (
	"errors"
	"fmt"
	"os/exec"
	"strings"
	"sync"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/iser-blk/iser-blk/block"
	"github.com/iser-blk/iser-blk/frontend/ublk/uring"
)

// DefaultControlPath is the ublk control device.
const DefaultControlPath = "/dev/ublk-control"

// ErrNoKernel means the running kernel has no ublk driver (no /dev/ublk-control and
// `modprobe ublk_drv` failed). The CLI maps it to exitNoKernel and suggests --nbd.
var ErrNoKernel = errors.New("the kernel lacks ublk (CONFIG_BLK_DEV_UBLK)")

// ErrIDTaken: Options.ID names a device that exists already (ADD_DEV answered EEXIST).
var ErrIDTaken = errors.New("the ublk device number is taken")

// ErrBadOptions: Options the driver cannot take (queues × depth, the request size, the device
// number, a pool too small for the tags' buffers); the caller can mend them. It is also
// block.ErrInvalid. A LUN the driver cannot describe (a block size or a size it does not
// accept) is block.ErrInvalid without it: no option mends that.
var ErrBadOptions error = badOptions{}

type badOptions struct{}

func (badOptions) Error() string { return "options the ublk driver cannot take" }
func (badOptions) Unwrap() error { return block.ErrInvalid }

// Control issues control commands (ADD_DEV, SET_PARAMS, START_DEV, ...) to /dev/ublk-control as
// IORING_OP_URING_CMD with ioctl-encoded opcodes (ublk_cmd.h, UBLK_U_CMD_*). Commands are
// serialised; each one waits for its CQE. It is safe for concurrent use.
type Control struct {
	mu   sync.Mutex
	fd   int
	ring *uring.Ring
	// payload is what a command's Addr points at: the driver reads and writes it by address
	// while the command runs, so it must not move. Go never moves heap memory but does move a
	// goroutine's stack when it grows, and a caller's local variable may live there: the driver
	// would then write into the abandoned copy (GET_FEATURES answered 0). Callers' values are
	// copied in and out of this buffer under mu.
	payload []byte
}

// maxPayload is the largest control payload: struct ublk_params.
const maxPayload = int(unsafe.Sizeof(Params{}))

// OpenControl opens the control device at path (DefaultControlPath when empty). If it does not
// exist it tries `modprobe ublk_drv` once; if that fails too the error wraps ErrNoKernel.
func OpenControl(path string) (*Control, error) {
	if path == "" {
		path = DefaultControlPath
	}
	fd, err := unix.Open(path, unix.O_RDWR|unix.O_CLOEXEC, 0)
	if errors.Is(err, unix.ENOENT) {
		out, merr := exec.Command("modprobe", "ublk_drv").CombinedOutput()
		fd, err = unix.Open(path, unix.O_RDWR|unix.O_CLOEXEC, 0)
		if errors.Is(err, unix.ENOENT) {
			why := strings.TrimSpace(string(out))
			if merr != nil && why == "" {
				why = merr.Error()
			}
			return nil, fmt.Errorf("%w: %s does not exist and `modprobe ublk_drv` failed (%s); use --nbd instead", ErrNoKernel, path, why)
		}
	}
	if err != nil {
		return nil, fmt.Errorf("open %s: %w", path, err)
	}
	// Control payloads are 32 bytes, so SQE128 is required (the driver rejects 64-byte SQEs).
	ring, err := uring.New(4, 0, uring.SetupSQE128)
	if err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("ublk control ring: %w", err)
	}
	size := max(maxPayload, int(unsafe.Sizeof(DevInfo{})), 8)
	return &Control{fd: fd, ring: ring, payload: make([]byte, size)}, nil
}

// Close releases the control device.
func (c *Control) Close() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.ring == nil {
		return nil
	}
	c.ring.Close()
	c.ring = nil
	return unix.Close(c.fd)
}

var ctrlNames = map[uint32]string{
	cmdGetDevInfo: "GET_DEV_INFO", cmdAddDev: "ADD_DEV", cmdDelDev: "DEL_DEV",
	cmdStartDev: "START_DEV", cmdStopDev: "STOP_DEV", cmdSetParams: "SET_PARAMS",
	cmdGetParams: "GET_PARAMS", cmdGetFeatures: "GET_FEATURES",
	cmdStartUserRecovery: "START_USER_RECOVERY", cmdEndUserRecovery: "END_USER_RECOVERY",
}

// do runs one control command. payload (nil for none) is the caller's value as bytes: it is
// copied into c.payload, which cmd.Addr and cmd.Len then describe, and copied back once the CQE
// has arrived, so the driver never sees the caller's memory.
func (c *Control) do(op uint32, cmd ctrlCmd, payload []byte) (int32, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.ring == nil {
		return 0, fmt.Errorf("ublk %s: control device closed", ctrlNames[op])
	}
	if len(payload) > 0 {
		buf := c.payload[:len(payload)]
		copy(buf, payload)
		cmd.Addr, cmd.Len = uint64(uintptr(unsafe.Pointer(&buf[0]))), uint16(len(buf))
	}
	sqe := c.ring.GetSQE()
	uring.PrepUringCmd(sqe, c.fd, op, uint64(op))
	*(*ctrlCmd)(unsafe.Pointer(c.ring.Cmd(sqe))) = cmd
	if _, err := c.ring.SubmitAndWait(1); err != nil {
		return 0, fmt.Errorf("ublk %s: %w", ctrlNames[op], err)
	}
	cqe := c.ring.PeekCQE()
	if cqe == nil {
		return 0, fmt.Errorf("ublk %s: no completion", ctrlNames[op])
	}
	res := cqe.Res
	c.ring.SeenCQE()
	copy(payload, c.payload)
	if res < 0 {
		return res, fmt.Errorf("ublk %s (dev %d): %w", ctrlNames[op], int32(cmd.DevID), unix.Errno(-res))
	}
	return res, nil
}

// bytesOf views *v as its bytes, for copying a control payload in and out.
func bytesOf[T any](v *T) []byte {
	return unsafe.Slice((*byte)(unsafe.Pointer(v)), unsafe.Sizeof(*v))
}

// Features returns the driver's UBLK_F_* feature bits (UBLK_U_CMD_GET_FEATURES).
func (c *Control) Features() (uint64, error) {
	var f uint64
	_, err := c.do(cmdGetFeatures, ctrlCmd{DevID: ^uint32(0), QueueID: 0xffff}, bytesOf(&f))
	return f, err
}

// AddDev creates a device. info.DevID ^0 asks the driver to pick the id. On return info holds
// what the driver granted (id, queue count clamped to the CPU count, buffer size).
func (c *Control) AddDev(info *DevInfo) error {
	_, err := c.do(cmdAddDev, ctrlCmd{DevID: info.DevID, QueueID: 0xffff}, bytesOf(info))
	return err
}

// SetParams sets the block parameters of a device that is not started yet.
func (c *Control) SetParams(id uint32, p *Params) error {
	p.Len = uint32(unsafe.Sizeof(*p))
	_, err := c.do(cmdSetParams, ctrlCmd{DevID: id, QueueID: 0xffff}, bytesOf(p))
	return err
}

// Params reads back a device's parameters (including the disk's major:minor once started).
func (c *Control) Params(id uint32) (Params, error) {
	var p Params
	p.Len = uint32(unsafe.Sizeof(p))
	_, err := c.do(cmdGetParams, ctrlCmd{DevID: id, QueueID: 0xffff}, bytesOf(&p))
	return p, err
}

// StartDev adds the disk /dev/ublkbN. The driver waits until every queue has fetched every tag,
// then runs add_disk (whose partition scan is served by the queues), so it can block a while.
func (c *Control) StartDev(id uint32, pid int) error {
	_, err := c.do(cmdStartDev, ctrlCmd{DevID: id, QueueID: 0xffff, Data: [1]uint64{uint64(pid)}}, nil)
	return err
}

// StopDev removes the disk (del_gendisk): new I/O fails, in-flight requests are waited for, so
// the queues must keep serving until it returns.
func (c *Control) StopDev(id uint32) error {
	_, err := c.do(cmdStopDev, ctrlCmd{DevID: id, QueueID: 0xffff}, nil)
	return err
}

// DelDev deletes the device. The driver waits until /dev/ublkcN is closed and every reference
// is gone.
func (c *Control) DelDev(id uint32) error {
	_, err := c.do(cmdDelDev, ctrlCmd{DevID: id, QueueID: 0xffff}, nil)
	return err
}

// DevInfo returns the device's info (state, pid, queues, flags).
func (c *Control) DevInfo(id uint32) (DevInfo, error) {
	var info DevInfo
	_, err := c.do(cmdGetDevInfo, ctrlCmd{DevID: id, QueueID: 0xffff}, bytesOf(&info))
	return info, err
}
