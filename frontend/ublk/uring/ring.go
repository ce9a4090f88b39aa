// Package uring is the minimal io_uring that the ublk frontend needs, written against the kernel
// UAPI (include/uapi/linux/io_uring.h) with golang.org/x/sys/unix only. Generic Go io_uring
// libraries lack 128-byte SQEs and IORING_OP_URING_CMD, which ublk is built on.
//
// Invariants:
//   - A Ring is owned by one goroutine: GetSQE, Submit*, PeekCQE and SeenCQE are not safe for
//     concurrent use. (The ublk queue runs each Ring on one locked OS thread.)
//   - The kernel and this process share the ring heads and tails. Every read of a kernel-written
//     index (SQ head, CQ tail) is an atomic load (acquire) and every write of a user-written index
//     (SQ tail, CQ head) is an atomic store (release), so an SQE is fully written before the kernel
//     can see it and a CQE is fully read before the kernel may reuse its slot. sync/atomic is
//     sequentially consistent, which is stronger than the acquire/release the ABI requires.
//   - The SQ index array is the identity (slot i holds i), written once at setup, so the SQE for
//     tail t is always entry t&mask.
//   - SubmitAndWait(n) returns only once n CQEs are there: a wait cut short by a signal (the Go
//     runtime's preemption signal among them) is resumed, so a caller that waits for the CQE of
//     the command it just submitted always finds it.
//   - A wait hands the calling thread's P to the Go scheduler before it blocks (enter.go), unless
//     the owner asked it to keep it (SetWaitKeepsP); a call that only submits keeps it.
//   - Memory whose address an SQE carries (buffers, command payloads) must stay alive and
//     unmoved until the CQE arrives; the caller keeps it referenced (Go's GC does not move
//     objects).
package uring

import (
	"errors"
	"fmt"
	"sync/atomic"
	"unsafe"

	"golang.org/x/sys/unix"
)

// ErrRingFull is returned when every SQ slot holds an unsubmitted SQE.
var ErrRingFull = errors.New("uring: submission queue full")

// Ring is one io_uring instance.
type Ring struct {
	fd     int
	params Params

	sqMap, cqMap, sqeMap []byte // cqMap aliases sqMap with FeatSingleMmap

	sqHead, sqTail *uint32
	sqMask         uint32
	sqEntries      uint32
	sqes           unsafe.Pointer
	sqeSize        uintptr
	localTail      uint32 // SQEs handed out; published to *sqTail by Submit

	waitKeepsP bool // SetWaitKeepsP

	cqHead, cqTail *uint32
	cqMask         uint32
	cqes           unsafe.Pointer
	cqeSize        uintptr
}

// New sets up a ring with at least entries SQ slots. flags are IORING_SETUP_* bits (Setup*).
// cqEntries, when non-zero, sizes the CQ (it is rounded up to a power of two by the kernel).
func New(entries, cqEntries, flags uint32) (*Ring, error) {
	p := Params{Flags: flags}
	if cqEntries != 0 {
		p.Flags |= SetupCQSize
		p.CQEntries = cqEntries
	}
	fd, _, errno := unix.Syscall(unix.SYS_IO_URING_SETUP, uintptr(entries), uintptr(unsafe.Pointer(&p)), 0)
	if errno != 0 {
		return nil, fmt.Errorf("io_uring_setup(%d entries, flags %#x): %w", entries, p.Flags, errno)
	}
	r := &Ring{fd: int(fd), params: p, sqeSize: 64, cqeSize: 16}
	if p.Flags&SetupSQE128 != 0 {
		r.sqeSize = 128
	}
	if p.Flags&SetupCQE32 != 0 {
		r.cqeSize = 32
	}
	if err := r.mapRings(); err != nil {
		r.Close()
		return nil, err
	}
	return r, nil
}

func (r *Ring) mapRings() error {
	p := &r.params
	sqSize := int(p.SQOff.Array) + int(p.SQEntries)*4
	cqSize := int(p.CQOff.CQEs) + int(p.CQEntries)*int(r.cqeSize)
	single := p.Features&FeatSingleMmap != 0
	if single && cqSize > sqSize {
		sqSize = cqSize
	}
	var err error
	r.sqMap, err = unix.Mmap(r.fd, offSQRing, sqSize, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED|unix.MAP_POPULATE)
	if err != nil {
		return fmt.Errorf("mmap io_uring SQ ring: %w", err)
	}
	if single {
		r.cqMap = r.sqMap
	} else {
		r.cqMap, err = unix.Mmap(r.fd, offCQRing, cqSize, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED|unix.MAP_POPULATE)
		if err != nil {
			return fmt.Errorf("mmap io_uring CQ ring: %w", err)
		}
	}
	r.sqeMap, err = unix.Mmap(r.fd, offSQEs, int(p.SQEntries)*int(r.sqeSize), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED|unix.MAP_POPULATE)
	if err != nil {
		return fmt.Errorf("mmap io_uring SQEs: %w", err)
	}
	sq := unsafe.Pointer(&r.sqMap[0])
	r.sqHead = (*uint32)(unsafe.Add(sq, p.SQOff.Head))
	r.sqTail = (*uint32)(unsafe.Add(sq, p.SQOff.Tail))
	r.sqMask = *(*uint32)(unsafe.Add(sq, p.SQOff.RingMask))
	r.sqEntries = *(*uint32)(unsafe.Add(sq, p.SQOff.RingEntries))
	array := unsafe.Slice((*uint32)(unsafe.Add(sq, p.SQOff.Array)), r.sqEntries)
	for i := range array {
		array[i] = uint32(i)
	}
	r.sqes = unsafe.Pointer(&r.sqeMap[0])
	r.localTail = atomic.LoadUint32(r.sqTail)

	cq := unsafe.Pointer(&r.cqMap[0])
	r.cqHead = (*uint32)(unsafe.Add(cq, p.CQOff.Head))
	r.cqTail = (*uint32)(unsafe.Add(cq, p.CQOff.Tail))
	r.cqMask = *(*uint32)(unsafe.Add(cq, p.CQOff.RingMask))
	r.cqes = unsafe.Add(cq, p.CQOff.CQEs)
	return nil
}

// Close unmaps the rings and closes the ring fd. The kernel cancels whatever is still in flight.
func (r *Ring) Close() error {
	if r.sqeMap != nil {
		_ = unix.Munmap(r.sqeMap)
		r.sqeMap = nil
	}
	if r.cqMap != nil && (len(r.sqMap) == 0 || &r.cqMap[0] != &r.sqMap[0]) {
		_ = unix.Munmap(r.cqMap)
	}
	r.cqMap = nil
	if r.sqMap != nil {
		_ = unix.Munmap(r.sqMap)
		r.sqMap = nil
	}
	if r.fd >= 0 {
		err := unix.Close(r.fd)
		r.fd = -1
		return err
	}
	return nil
}

// Fd is the ring's file descriptor.
func (r *Ring) Fd() int { return r.fd }

// Params reports what the kernel filled in at setup (entries, features, offsets).
func (r *Ring) Params() Params { return r.params }

// SQEntries is the number of SQ slots.
func (r *Ring) SQEntries() uint32 { return r.sqEntries }

// GetSQE returns the next free SQE, zeroed (all sqeSize bytes), or nil when the SQ is full of
// unsubmitted entries (call Submit first). The SQE is published by the next Submit.
func (r *Ring) GetSQE() *SQE {
	head := atomic.LoadUint32(r.sqHead)
	if r.localTail-head >= r.sqEntries {
		return nil
	}
	p := unsafe.Add(r.sqes, uintptr(r.localTail&r.sqMask)*r.sqeSize)
	clear(unsafe.Slice((*byte)(p), r.sqeSize))
	r.localTail++
	return (*SQE)(p)
}

// Cmd returns the 80-byte command area of an SQE from a SetupSQE128 ring (struct io_uring_sqe's
// cmd[]), or nil on a ring with 64-byte SQEs. sqe must come from this ring's GetSQE.
func (r *Ring) Cmd(sqe *SQE) *[CmdSize]byte {
	if r.sqeSize != 128 {
		return nil
	}
	return (*[CmdSize]byte)(unsafe.Add(unsafe.Pointer(sqe), cmdOffset))
}

// SetCmdOp stores the URING_CMD opcode (sqe->cmd_op, the first 32 bits of the off field).
func (s *SQE) SetCmdOp(op uint32) {
	*(*uint32)(unsafe.Pointer(&s.Off)) = op
}

// Pending is the number of SQEs handed out by GetSQE that the kernel has not consumed yet.
func (r *Ring) Pending() uint32 {
	return r.localTail - atomic.LoadUint32(r.sqHead)
}

// PendingSQE returns the i-th of the Pending SQEs, oldest first (nil when i ≥ Pending()), so
// that a caller can check what it queued before submitting it.
func (r *Ring) PendingSQE(i uint32) *SQE {
	head := atomic.LoadUint32(r.sqHead)
	if i >= r.localTail-head {
		return nil
	}
	return (*SQE)(unsafe.Add(r.sqes, uintptr((head+i)&r.sqMask)*r.sqeSize))
}

// Submit publishes every SQE obtained since the last call and enters the kernel to submit them
// without waiting. It returns how many the kernel consumed.
func (r *Ring) Submit() (int, error) {
	return r.SubmitAndWait(0)
}

// SetWaitKeepsP makes the waits of SubmitAndWait keep the thread's P (true) or hand it off
// (false, the default; enter.go).
func (r *Ring) SetWaitKeepsP(keep bool) { r.waitKeepsP = keep }

// enter is io_uring_enter; a call that may wait hands the thread's P off first (enter.go).
func (r *Ring) enter(toSubmit, wait uint32, flags uintptr) (uintptr, unix.Errno) {
	if wait > 0 && r.cqReady() >= wait { // only submits: a short call
		wait, flags = 0, 0
	}
	if wait > 0 && !r.waitKeepsP {
		return enterBlocking(uintptr(r.fd), uintptr(toSubmit), uintptr(wait), flags)
	}
	n, _, errno := unix.Syscall6(unix.SYS_IO_URING_ENTER, uintptr(r.fd), uintptr(toSubmit), uintptr(wait), flags, 0, 0)
	return n, errno
}

// SubmitAndWait publishes and submits pending SQEs and, when wait > 0, blocks until at least wait
// CQEs are available. Interrupted waits (EINTR: signals are routine in a Go process) are retried.
func (r *Ring) SubmitAndWait(wait uint32) (int, error) {
	atomic.StoreUint32(r.sqTail, r.localTail)
	var flags uintptr
	if wait > 0 {
		flags = EnterGetEvents
	}
	submitted := 0
	for {
		toSubmit := r.localTail - atomic.LoadUint32(r.sqHead)
		if toSubmit == 0 && wait == 0 {
			return submitted, nil
		}
		if wait > 0 && r.cqReady() >= wait && toSubmit == 0 {
			return submitted, nil
		}
		n, errno := r.enter(toSubmit, wait, flags)
		switch errno {
		case 0:
			submitted += int(n)
			if wait == 0 {
				return submitted, nil
			}
			// Having submitted something, io_uring_enter returns that count even when a
			// signal cut its wait short (the runtime's preemption signals do so routinely),
			// so success does not mean the CQEs are there: check and wait again. (ublk's
			// STOP_DEV, which waits for the I/O in flight, came back with "no completion".)
			continue
		case unix.EINTR:
			continue
		default:
			return 0, fmt.Errorf("io_uring_enter(submit %d, wait %d): %w", toSubmit, wait, errno)
		}
	}
}

func (r *Ring) cqReady() uint32 {
	return atomic.LoadUint32(r.cqTail) - atomic.LoadUint32(r.cqHead)
}

// PeekCQE returns the oldest unconsumed CQE, or nil when the CQ is empty. The CQE stays valid
// until SeenCQE; copy what you need before calling it.
func (r *Ring) PeekCQE() *CQE {
	head := atomic.LoadUint32(r.cqHead)
	if head == atomic.LoadUint32(r.cqTail) {
		return nil
	}
	return (*CQE)(unsafe.Add(r.cqes, uintptr(head&r.cqMask)*r.cqeSize))
}

// SeenCQE releases the CQE returned by PeekCQE to the kernel.
func (r *Ring) SeenCQE() {
	atomic.StoreUint32(r.cqHead, atomic.LoadUint32(r.cqHead)+1)
}

// PrepNop fills sqe as IORING_OP_NOP.
func PrepNop(sqe *SQE, userData uint64) {
	sqe.Opcode = OpNop
	sqe.UserData = userData
}

// PrepRead fills sqe as IORING_OP_READ of len(buf) bytes at off (-1: the file position, as
// read(2); required for pipes and eventfds). buf must stay alive until the CQE.
func PrepRead(sqe *SQE, fd int, buf []byte, off int64, userData uint64) {
	sqe.Opcode = OpRead
	sqe.Fd = int32(fd)
	sqe.Off = uint64(off)
	if len(buf) > 0 {
		sqe.Addr = uint64(uintptr(unsafe.Pointer(&buf[0])))
	}
	sqe.Len = uint32(len(buf))
	sqe.UserData = userData
}

// PrepPollAdd fills sqe as a one-shot IORING_OP_POLL_ADD for events (POLLIN, ...).
func PrepPollAdd(sqe *SQE, fd int, events uint32, userData uint64) {
	sqe.Opcode = OpPollAdd
	sqe.Fd = int32(fd)
	sqe.OpFlags = events // poll32_events
	sqe.UserData = userData
}

// PrepUringCmd fills sqe as IORING_OP_URING_CMD with command opcode op on fd. The caller writes
// the command payload into r.Cmd(sqe) (ring must be SetupSQE128 for payloads over 16 bytes).
func PrepUringCmd(sqe *SQE, fd int, op uint32, userData uint64) {
	sqe.Opcode = OpUringCmd
	sqe.Fd = int32(fd)
	sqe.SetCmdOp(op)
	sqe.UserData = userData
}
