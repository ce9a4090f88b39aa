package transport

import (
	"errors"
	"fmt"
	"io"

	"golang.org/x/sys/unix"

	"github.com/iser-blk/iser-blk/internal/rawio"
)

// ErrPipeFull is returned by PipeReader.ReadDataToPipe when the pipe could not take the whole
// data segment (no free pipe slot: the socket's data arrived in more, smaller fragments than the
// pipe has slots for). The rest of the segment was consumed from the stream, which stays in
// sync, so it is not a connection error: only the task whose data it was has to be served again.
var ErrPipeFull = errors.New("transport: pipe full before the data segment was moved")

// PipeReader is an optional interface of a Conn that can move a Data-In segment into a pipe
// without copying it through user memory: TCP splices the socket's pages into the pipe
// (splice(2)), and a consumer splices them on into another socket, so the bytes are never copied
// by the gateway. Only connections that can (a raw socket fd, no data digest, whose CRC would
// need the bytes) report true from CanReadToPipe; the session checks it before it sends a
// command whose data is to land in a pipe.
type PipeReader interface {
	// CanReadToPipe reports whether ReadDataToPipe may be used on this connection. It does not
	// change after Start.
	CanReadToPipe() bool
	// ReadDataToPipe moves the whole data segment of the last header into the pipe whose write
	// end is pipeW (opened O_NONBLOCK), then consumes the padding. It is the ReadData of the
	// reader goroutine for this segment. It returns ErrPipeFull (the segment was consumed and
	// the stream is in sync; part of it may be in the pipe) or a connection error.
	ReadDataToPipe(pipeW int) error
}

var _ PipeReader = (*TCPConn)(nil)

// CanReadToPipe implements PipeReader: a socket with a raw fd and no data digest.
func (c *TCPConn) CanReadToPipe() bool { return c.raw.Raw() && !c.dataDigest }

// ReadDataToPipe implements PipeReader. The bytes bufio already read from the socket go into the
// pipe with write(2) (one copy, at most readBufferSize bytes, usually just the start of the
// segment that arrived with its header); the rest is spliced from the socket.
func (c *TCPConn) ReadDataToPipe(pipeW int) error {
	if !c.CanReadToPipe() {
		return fmt.Errorf("transport: ReadDataToPipe on a connection that cannot splice")
	}
	if !c.hasData {
		return nil
	}
	c.hasData = false
	c.exact = true
	n := c.remaining
	left := n
	if b := c.br.Buffered(); b > 0 {
		k := min(b, left)
		head, _ := c.br.Peek(k) // cannot fail: k bytes are buffered
		w, full, err := writePipe(pipeW, head)
		if err != nil {
			return fmt.Errorf("transport: write to pipe: %w", err)
		}
		c.br.Discard(w) //nolint:errcheck // w <= buffered
		left -= w
		if full {
			return c.discardAfterPipeFull(left, n)
		}
	}
	for left > 0 {
		moved, full, err := c.spliceIn(pipeW, left)
		left -= moved
		if err != nil {
			return c.readErr(err)
		}
		if full {
			return c.discardAfterPipeFull(left, n)
		}
	}
	return c.finishData(0, n)
}

// discardAfterPipeFull consumes the left bytes of the n-byte segment the pipe could not take,
// and its padding, and reports ErrPipeFull.
func (c *TCPConn) discardAfterPipeFull(left, n int) error {
	if _, err := c.br.Discard(left); err != nil {
		return c.readErr(err)
	}
	if err := c.finishData(0, n); err != nil {
		return err
	}
	return ErrPipeFull
}

// writePipe writes b into the non-blocking pipe; full reports that the pipe took only w bytes.
func writePipe(pipeW int, b []byte) (w int, full bool, err error) {
	w, err = rawio.WriteAll(pipeW, b)
	if err == unix.EAGAIN {
		return w, true, nil
	}
	return w, false, err
}

// spliceIn splices up to limit bytes from the socket into the pipe, waiting for the socket to be
// readable through the runtime poller (so deadlines and Close interrupt it). It returns after
// the first successful splice; full reports that the pipe has no free slot.
func (c *TCPConn) spliceIn(pipeW int, limit int) (moved int, full bool, err error) {
	if c.sfn == nil {
		c.sfn = c.spliceInFD // once: a method value allocates
	}
	c.sp = spliceState{pipeW: pipeW, limit: limit}
	if err := c.raw.RawConn().Read(c.sfn); err != nil {
		return c.sp.moved, false, err
	}
	return c.sp.moved, c.sp.full, c.sp.err
}

// spliceState is spliceIn's scratch for spliceInFD (no closure, so no allocation per call).
type spliceState struct {
	pipeW, limit, moved int
	full                bool
	err                 error
}

// spliceInFD runs inside RawConn.Read: one splice, or false on EAGAIN from the socket so the
// poller waits for readability.
func (c *TCPConn) spliceInFD(fd uintptr) bool {
	sp := &c.sp
	for {
		k, err := rawio.Splice(int(fd), sp.pipeW, sp.limit, unix.SPLICE_F_NONBLOCK|unix.SPLICE_F_MOVE)
		switch {
		case err == unix.EINTR:
			continue
		case err == unix.EAGAIN:
			// Either the socket has nothing or the pipe has no free slot: only the latter
			// leaves the pipe unwritable (nobody reads it while we fill it).
			if !pipeWritable(sp.pipeW) {
				sp.full = true
				return true
			}
			return false // wait for the socket
		case err != nil:
			sp.err = err
		case k == 0:
			sp.err = io.EOF
		default:
			sp.moved = int(k)
		}
		return true
	}
}

// pipeWritable reports whether the pipe has room for at least one more buffer (POLLOUT).
func pipeWritable(pipeW int) bool {
	fds := [1]unix.PollFd{{Fd: int32(pipeW), Events: unix.POLLOUT}}
	for {
		n, err := unix.Poll(fds[:], 0)
		if err == unix.EINTR {
			continue
		}
		return err == nil && n == 1 && fds[0].Revents&unix.POLLOUT != 0
	}
}
