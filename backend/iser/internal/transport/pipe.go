package transport

import (
	"errors"
	"fmt"

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
		moved, err := c.raw.SpliceIn(pipeW, left)
		left -= moved
		if err == rawio.ErrPipeFull {
			return c.discardAfterPipeFull(left, n)
		}
		if err != nil {
			return c.readErr(err)
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
