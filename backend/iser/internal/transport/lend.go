package transport

// Lent sends: a large data segment goes to the socket by reference (vmsplice(2) of the caller's
// pages into a pipe, splice(2) from the pipe into the socket) instead of being copied by writev.
// The copy is what a 1 MiB write over TCP spends most of its CPU on; the kernel initiator sends
// the bio's pages by reference too.
//
// After splice returns, the kernel still references the pages: a NIC until the peer acknowledged
// the bytes, a target on the same kernel (loopback, a veth) until the target process has read
// them. So the sender must keep the data unchanged until the target cannot read it any more: see
// OutPDU.Lent for the contract, and the session's lend.go for how the session keeps it.

import (
	"errors"
	"fmt"
	"sync"
	"sync/atomic"

	"golang.org/x/sys/unix"

	"github.com/iser-blk/iser-blk/backend/iser/internal/pdu"
)

// LendMin is the smallest data segment sent by reference. Below it the copy costs less than the
// two extra system calls (vmsplice, splice); measured at 1 MiB writes with 256 KiB segments.
const LendMin = 64 << 10

// lentSegments counts the segments sent by reference, process-wide (LentSegments).
var lentSegments atomic.Uint64

// LentSegments is how many data segments TCP connections have sent by reference so far.
func LentSegments() uint64 { return lentSegments.Load() }

// lendPipeSize is the pipe's capacity: one vmsplice maps up to this much of a segment.
const lendPipeSize = 1 << 20

// lendPipe is the pipe a TCPConn splices lent segments through. The writer (serialised by the
// session) uses it; Close and Abort close it after the socket, which ends a writer blocked in
// the splice, so the descriptors are never closed under a system call. Closing the pipe drops
// whatever page references it still holds.
type lendPipe struct {
	mu     sync.Mutex // held by the writer for a whole segment, and by close
	r, w   int        // -1 until first use
	closed bool
	// off: the kernel refused the pipe or vmsplice (a seccomp filter, say) before any byte was
	// lent; the connection copies from then on. Written under mu by the writer, read by it.
	off bool
	// broken: a lent send failed part way, so the pipe may still hold that segment's bytes,
	// which must never go out as part of another PDU: every later lent send fails.
	broken bool
}

func newLendPipe() lendPipe { return lendPipe{r: -1, w: -1} }

var errLendClosed = errors.New("transport: connection closed")

// errLendRefused reports that nothing was lent and the segment must be copied (lendPipe.off).
var errLendRefused = errors.New("transport: the kernel refused a lent send")

// open returns the pipe, creating it on first use (p.mu held).
func (p *lendPipe) open() error {
	if p.closed || p.broken {
		return errLendClosed
	}
	if p.r >= 0 {
		return nil
	}
	var fds [2]int
	if err := unix.Pipe2(fds[:], unix.O_NONBLOCK|unix.O_CLOEXEC); err != nil {
		p.off = true // out of descriptors, say: the copy still works
		return errLendRefused
	}
	// A smaller pipe (the default 64 KiB, or a capped /proc/sys/fs/pipe-max-size) still works:
	// each vmsplice then maps less.
	unix.FcntlInt(uintptr(fds[1]), unix.F_SETPIPE_SZ, lendPipeSize) //nolint:errcheck // see above
	p.r, p.w = fds[0], fds[1]
	return nil
}

// close closes the pipe for good (after the socket: see lendPipe).
func (p *lendPipe) close() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.closed = true
	if p.r >= 0 {
		unix.Close(p.r)
		unix.Close(p.w)
		p.r, p.w = -1, -1
	}
}

// canLend reports whether data may go out by reference on c: the PDU offers it, the segment is
// large enough, no data digest is computed over it (pages that may still change under a CRC
// would be a needless risk) and no padding follows it (the pad goes by writev, one call more).
func (c *TCPConn) canLend(p *OutPDU, data []byte) bool {
	return p.Lent != nil && len(data) >= LendMin && !c.dataDigest && pdu.PadLen(len(data)) == 0 &&
		c.raw.Raw() && !c.lend.off
}

// sendLent sends data by reference (its header already written) and marks the PDU lent. It
// returns errLendRefused, having sent nothing, when the kernel refuses to lend: the caller then
// copies the segment. Any other error leaves the connection unusable: the caller fails it.
func (c *TCPConn) sendLent(p *OutPDU, data []byte) error {
	lp := &c.lend
	lp.mu.Lock()
	defer lp.mu.Unlock()
	if err := lp.open(); err != nil {
		return err
	}
	mapped := false // some of data went into the pipe: refusing is an error from then on
	for len(data) > 0 {
		iov := [1]unix.Iovec{{Base: &data[0]}}
		iov[0].SetLen(len(data))
		n, err := unix.Vmsplice(lp.w, iov[:], unix.SPLICE_F_NONBLOCK)
		if err == unix.EINTR {
			continue
		}
		if err != nil && !mapped {
			// Nothing of this segment is in the pipe: copying it is safe. A kernel that refuses
			// vmsplice outright will refuse it again: copy from now on.
			if err == unix.ENOSYS || err == unix.EPERM || err == unix.EACCES || err == unix.EINVAL {
				lp.off = true
			}
			return errLendRefused
		}
		if err != nil {
			// EAGAIN cannot happen: the pipe is empty here (every round drains it below).
			lp.broken = true
			return fmt.Errorf("transport: vmsplice: %w", err)
		}
		mapped, *p.Lent = true, true // the pipe, then the socket, reference the pages from here on
		if _, err := c.raw.SpliceOut(lp.r, n); err != nil {
			lp.broken = true
			return err
		}
		data = data[n:]
	}
	lentSegments.Add(1)
	return nil
}
