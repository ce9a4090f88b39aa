// Package rdma is iser-blk's RDMA layer: a small cgo binding over rdma-core (librdmacm for
// connection management, libibverbs for queue pairs, completion queues and memory registration)
// and, on top of it, the iSER transport (RFC 7145) that carries iSCSI PDUs over a reliable-connected
// queue pair while the target moves SCSI data with RDMA Read/Write straight into pool buffers.
//
// Invariants:
//   - Memory handed to the device (receive/send descriptors, registered pool regions) never lives in
//     the Go heap: it comes from mmap. Work requests and completions are marshalled through C memory
//     owned by the connection; no Go pointer is retained by C.
//   - No goroutine spins: the completion channel and the CM event channel are non-blocking file
//     descriptors parked on Go's netpoller; completions are drained with ibv_poll_cq in batches and
//     the CQ is re-armed (ibv_req_notify_cq) only when it is empty. While a connection is busy the
//     poller also re-polls after a second without an event (a dropped event must not stall it);
//     idle, it parks without a timer.
//   - Sends are posted by the sender whose push found no post in progress (sendq.go), one
//     poster at a time, in push order; a batch being posted is owned by the poster alone, and
//     senders append to the other buffer.
//   - Every C resource a Conn or Listener owns (cm_id, event channel, PD, CQ, completion channel,
//     QP, MRs) is released by Close and on every error path of Dial/Accept, in dependency order.
//   - Pool regions are registered once per region per connection (ibv_reg_mr), never per I/O.
//
// Without cgo (or with the nordma tag) the package builds but Dial fails with ErrNoRDMA.
package rdma

import (
	"errors"
	"fmt"
)

// ErrNoRDMA is returned by every entry point of a build without rdma-core.
var ErrNoRDMA = errors.New("built without RDMA support (rebuild with cgo and rdma-core, without the nordma tag)")

// ErrNoDevice: this host has no RDMA device (or rdma_ucm is not loaded): creating an rdma_cm
// event channel, the first step of a dial, failed with ENODEV, which the error also wraps.
var ErrNoDevice = errors.New("no RDMA device")

// Sentinel errors of the connection layer; CMError values wrap them.
var (
	ErrUnreachable  = errors.New("RDMA address or route unreachable")
	ErrRefused      = errors.New("RDMA connection refused")
	ErrDisconnected = errors.New("RDMA connection lost")
	ErrClosed       = errors.New("RDMA connection closed")
)

// CMError is a failed rdma_cm step: the event that arrived instead of the expected one.
type CMError struct {
	Step   string // "resolve address", "resolve route", "connect", ...
	Event  string // rdma_cm event name
	Status int    // event status (negative errno, or the IB CM reject reason for REJECTED)
	Kind   error  // ErrUnreachable, ErrRefused or ErrDisconnected
}

func (e *CMError) Error() string {
	return fmt.Sprintf("rdma_cm %s: %s (status %d): %v", e.Step, e.Event, e.Status, e.Kind)
}

func (e *CMError) Unwrap() error { return e.Kind }

// Access flags for memory registration (ibv_access_flags).
type Access uint32

const (
	AccessLocalWrite  Access = 1 << 0 // the local HCA may write (receives, RDMA Read responses)
	AccessRemoteWrite Access = 1 << 1 // the peer may RDMA Write into it
	AccessRemoteRead  Access = 1 << 2 // the peer may RDMA Read from it
)

// Op is a send-queue work request opcode.
type Op uint8

const (
	OpSend Op = iota
	OpRDMAWrite
	OpRDMARead
)

// SGE is a scatter/gather element: an address inside registered memory and its local key.
type SGE struct {
	Addr uint64
	Len  uint32
	LKey uint32
}

// SendWR is one send-queue work request. Up to two SGEs (header slot + payload).
type SendWR struct {
	ID         uint64
	Op         Op
	Signaled   bool
	RemoteAddr uint64 // RDMA Read/Write only
	RKey       uint32 // RDMA Read/Write only
	NSGE       int
	SGE        [2]SGE
}

// RecvWR is one receive-queue work request.
type RecvWR struct {
	ID  uint64
	SGE SGE
}

// CompletionOp says which kind of work request completed.
type CompletionOp uint8

const (
	CompSend CompletionOp = iota
	CompRDMAWrite
	CompRDMARead
	CompRecv
	CompOther
)

// Completion is one work completion, copied out of the CQ.
type Completion struct {
	ID        uint64
	Status    int // 0 = success (IBV_WC_SUCCESS); see statusString
	Op        CompletionOp
	ByteLen   uint32
	VendorErr uint32
}

// OK reports a successful completion.
func (c *Completion) OK() bool { return c.Status == 0 }

// Flushed reports a work request flushed because the queue pair went to the error state (the
// connection is going away), as opposed to a request that failed on its own.
func (c *Completion) Flushed() bool { return c.Status == wcWRFlushErr }

// ibv_wc_status values we name (verbs.h).
const wcWRFlushErr = 5

var wcStatusNames = [...]string{
	"success", "local length error", "local QP operation error", "local EE context operation error",
	"local protection error", "WR flush error", "memory window bind error", "bad response error",
	"local access error", "remote invalid request error", "remote access error",
	"remote operation error", "transport retry counter exceeded", "RNR retry counter exceeded",
	"local RDD violation error", "remote invalid RD request", "remote aborted error",
	"invalid EE context number", "invalid EE context state", "fatal error", "response timeout error",
	"general error", "tag matching error", "tag matching rendezvous",
}

// statusString names an ibv_wc_status.
func statusString(s int) string {
	if s >= 0 && s < len(wcStatusNames) {
		return wcStatusNames[s]
	}
	return fmt.Sprintf("wc status %d", s)
}

// CompletionError is a failed work completion.
type CompletionError struct {
	Op        CompletionOp
	Status    int
	VendorErr uint32
}

func (e *CompletionError) Error() string {
	return fmt.Sprintf("work completion (op %d) failed: %s (vendor error %#x)", e.Op, statusString(e.Status), e.VendorErr)
}

// Unwrap makes every failed completion an ErrDisconnected: an RC queue pair that reports an error
// is in the error state and carries nothing more.
func (e *CompletionError) Unwrap() error { return ErrDisconnected }
