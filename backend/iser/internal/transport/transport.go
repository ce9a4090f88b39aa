// Package transport is the boundary between an iSCSI session (package session) and the wire.
// A Conn carries iSCSI PDUs (RFC 7143 §11) for exactly one connection: TCP (this package, RFC 7143)
// or iSER (package backend/iser/rdma, RFC 7145). The session never knows which.
//
// Contract:
//   - Writes (WritePDU, WriteCommand) are serialised by the caller: the session holds its send
//     lock while calling them, so a transport needs no lock of its own for writing.
//   - Reads (ReadHeader, then ReadData or DiscardData) are called by exactly one goroutine, the
//     session's reader. After ReadHeader returns a header with DataSegmentLength n > 0, the reader
//     calls ReadData with a slice of exactly n bytes, or DiscardData, before the next ReadHeader.
//     This lets the session choose where a Data-In segment lands (the task's own buffer): TCP
//     reads it from the socket straight there, without an intermediate copy.
//   - Login PDUs travel over the same Conn with WritePDU/ReadHeader/ReadData before Start; Start
//     switches to the full-feature phase with the negotiated Params (digests, segment sizes).
//   - A transport whose MovesData reports true (iSER) moves SCSI data itself: the target reads and
//     writes the task buffer given to WriteCommand by RDMA, so the session sends no solicited
//     Data-Out PDUs, expects no R2T and no Data-In payload for it, and calls TaskDone when the task's
//     response arrived (or the task was reaped) so the transport can invalidate what it advertised
//     before the buffer goes back to its owner.
//   - A transport may offer PipeReader (TCP without data digest): ReadDataToPipe splices a
//     Data-In segment from the socket into a pipe, so that it never passes through user memory.
//   - Any error returned is a connection error: the session tears the connection down. The one
//     exception is ErrPipeFull from ReadDataToPipe (the segment was consumed, the stream is in
//     sync; only that task's data is incomplete).
package transport

import (
	"context"
	"fmt"
	"sort"
	"sync"
	"time"

	"github.com/iser-blk/iser-blk/backend/iser/internal/login"
	"github.com/iser-blk/iser-blk/backend/iser/internal/pdu"
	"github.com/iser-blk/iser-blk/backend/iser/scsi"
)

// Task describes the data buffer of a SCSI command at the moment its Command PDU is sent.
type Task struct {
	ITT uint32
	Dir scsi.Direction
	// Buf is the whole data buffer: data-in destination or data-out source.
	Buf []byte
	// Immediate is the number of leading bytes of Buf carried as immediate data in the SCSI
	// Command PDU itself (RFC 7143 §13.11); 0 when ImmediateData=No or for reads.
	Immediate int
	// Unsolicited is the number of leading bytes of Buf (including Immediate) the session sends
	// without an R2T, as immediate data and unsolicited Data-Out PDUs (§13.10, §13.14). The rest is
	// solicited: over TCP by R2T, over iSER by the target's RDMA Read.
	Unsolicited int
}

// Conn is one iSCSI connection. See the package comment for the rules on concurrency and order.
type Conn interface {
	// WritePDU sends one PDU: the BHS, the AHS (a multiple of 4 bytes, may be nil) and the data
	// segment (may be nil). The transport adds padding and, after Start, digests.
	WritePDU(bhs *pdu.BHS, ahs, data []byte) error
	// WriteCommand sends a SCSI Command PDU whose data segment is t.Buf[:t.Immediate].
	// A data-moving transport also advertises t.Buf to the target (iSER: STag and VA).
	WriteCommand(bhs *pdu.BHS, ahs []byte, t *Task) error
	// ReadHeader reads the next PDU's BHS into bhs and returns its AHS (valid until the next
	// ReadHeader). It verifies the header digest and bhs.Validate.
	ReadHeader(bhs *pdu.BHS) (ahs []byte, err error)
	// ReadData reads the whole data segment of the last header into dst (len(dst) must equal its
	// DataSegmentLength), consumes padding and verifies the data digest. dst is written even when
	// the digest then fails; the caller treats that as a connection error.
	ReadData(dst []byte) error
	// DiscardData consumes the data segment of the last header without keeping it (still
	// verifying the data digest).
	DiscardData() error
	// LoginHook returns the transport's own login keys (nil if it has none).
	LoginHook() login.Hook
	// Start enters the full-feature phase with the negotiated parameters.
	Start(p *login.Params) error
	// MovesData reports whether the transport moves solicited SCSI data itself (iSER).
	MovesData() bool
	// TaskDone tells the transport that the task is finished and its buffer is no longer used.
	// It is called once per SCSI task slot release, from the task's goroutine or the reader, and
	// also for a task whose command never got sent (window wait cancelled): ignore unknown ITTs.
	TaskDone(itt uint32)
	// SetDeadline bounds the current and future reads and writes (zero: no deadline). Used during
	// login and logout; the full-feature phase relies on NOP-Out pings instead.
	SetDeadline(t time.Time) error
	// RemoteAddr names the portal for logs and errors.
	RemoteAddr() string
	// Close closes the connection; a blocked ReadHeader or write returns an error.
	Close() error
}

// DialOptions are the transport-independent dial settings.
type DialOptions struct {
	// Timeout bounds connection establishment (in addition to ctx).
	Timeout time.Duration
	// Source, if set, is the local address to bind.
	Source string
}

// Dialer opens a Conn to a portal ("host:port"; IPv6 hosts in brackets).
type Dialer interface {
	Dial(ctx context.Context, portal string, opts DialOptions) (Conn, error)
	// DefaultPort is the port used when a portal has none (3260 for iSCSI and iSER).
	DefaultPort() int
}

var (
	regMu    sync.RWMutex
	registry = map[string]Dialer{}
)

// Register makes a Dialer available for a URL scheme ("iscsi", "iser"). A transport registers
// itself from init(); the iSER transport does so only when built with RDMA support.
func Register(scheme string, d Dialer) {
	regMu.Lock()
	defer regMu.Unlock()
	registry[scheme] = d
}

// Lookup returns the Dialer for a URL scheme.
func Lookup(scheme string) (Dialer, error) {
	regMu.RLock()
	defer regMu.RUnlock()
	if d, ok := registry[scheme]; ok {
		return d, nil
	}
	return nil, fmt.Errorf("transport: no transport for scheme %q (have %v)", scheme, schemesLocked())
}

func schemesLocked() []string {
	s := make([]string, 0, len(registry))
	for k := range registry {
		s = append(s, k)
	}
	sort.Strings(s)
	return s
}

// OutPDU is one PDU of a batch for BatchWriter.
type OutPDU struct {
	BHS  *pdu.BHS
	AHS  []byte
	Data []byte // the data segment (for a command: Task.Buf[:Task.Immediate])
	// Task is set for a SCSI Command PDU: the PDU is sent with WriteCommand semantics.
	Task *Task
	// Lent, when not nil, lets the transport send Data by reference instead of copying it (TCP:
	// segments of LendMin bytes or more, see lend.go); it sets *Lent to true when it did,
	// before the write returns. From then on the sender must keep Data unchanged until the
	// target can no longer read it: it answered the task on this connection (a response, or a
	// task management response, since a connection is read in order), or the session was
	// reinstated (RFC 7143 §6.3.5). A transport that moves data itself ignores it.
	Lent *bool
}

// DirectMemory is implemented by a transport that moves data itself (iSER): Direct reports
// whether the target can reach buf where it is (registered memory), so that sending a command
// for it costs no bounce through the transport's own buffers, which may have to wait for one.
// It does not allocate. A command submitted without an owner (session.Submit) must not wait, so
// one whose buffer is not direct takes the owning path.
type DirectMemory interface {
	Direct(buf []byte) bool
}

// Aborter is implemented by a transport whose Close lets bytes already queued still reach the
// target (TCP: a graceful close keeps sending the socket's send queue, then a FIN). Abort closes
// the connection discarding what has not left the initiator yet (TCP: SO_LINGER 0, a reset), so a
// connection the initiator gave up on sends nothing more after its tasks were re-issued
// elsewhere. What the target's side already received it may still read.
type Aborter interface {
	Abort() error
}

// BatchWriter is implemented by transports that can send several PDUs at once (TCP: one writev
// for the whole batch; iSER: one chained post). The session combines the PDUs of concurrent
// senders into batches when it finds one. Same serialisation rule as WritePDU.
type BatchWriter interface {
	WritePDUs(batch []OutPDU) error
}
