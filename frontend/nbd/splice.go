package nbd

import (
	"fmt"

	"go.uber.org/zap"
	"golang.org/x/sys/unix"

	"github.com/iser-blk/iser-blk/block"
)

// Spliced reads (block.PipeSubmitter). A READ of at least minSpliceRead bytes and at most one
// segment, on a connection whose socket has a file descriptor (unix or TCP; not TLS, not a test
// net.Pipe), can have its data put into a pipe by the device (the iSCSI backend splices it from
// its TCP socket) and spliced from the pipe into the client's socket by the reply writer: the
// payload is never copied through this process. The reply bytes on the wire are exactly those of
// the buffered path; only who copies them differs.
//
// Each connection keeps its own pipes, created on first use (non-blocking, close-on-exec, sized
// to a segment with F_SETPIPE_SZ; if that fails for the first pipe, splicing is off for the
// connection) and closed when the connection ends. A request holds its pipe from submission until
// its reply is written; a pipe that may hold stray bytes (a failed request, a broken client) is
// closed instead of reused, so a reused pipe is always empty.

// minSpliceRead is the smallest READ worth a pipe: below it the two copies cost less than the
// extra syscalls (reply header and payload go out separately).
const minSpliceRead = 64 << 10

// maxPipes bounds a connection's pipes. Every pipe page counts against the user's pipe quota
// (fs.pipe-user-pages-soft, 64 MiB by default), so a few deep-queue connections must not exhaust
// it; reads beyond this many in flight take the buffered path.
const maxPipes = 16

// spipe is one pipe of a connection: r and w are its ends.
type spipe struct {
	r, w int
}

// initSplice enables spliced reads on c when the device, the pool and the socket allow them.
func (c *conn) initSplice() {
	if c.sub == nil || c.s.seg < minSpliceRead || !c.s.opts.Splice {
		return
	}
	ps, ok := c.s.dev.(block.PipeSubmitter)
	if !ok {
		return
	}
	if !c.raw.Raw() {
		return // no fd to splice into (net.Pipe, TLS)
	}
	c.psub = ps
	c.pipeCap = min(c.s.opts.MaxInflight, maxPipes)
	c.pipes = make([]*spipe, 0, c.pipeCap)
}

// takePipe returns an empty pipe without waiting, or nil when none is free (or none can be made).
// Reader goroutine only (it alone creates pipes); the writer returns them with putPipe.
func (c *conn) takePipe() *spipe {
	c.pipeMu.Lock()
	if k := len(c.pipes); k > 0 {
		p := c.pipes[k-1]
		c.pipes[k-1] = nil
		c.pipes = c.pipes[:k-1]
		c.pipeMu.Unlock()
		return p
	}
	if c.npipes >= c.pipeCap {
		c.pipeMu.Unlock()
		return nil
	}
	c.npipes++ // reserve the slot; given back below if the pipe cannot be made
	c.pipeMu.Unlock()
	p, err := newPipe(c.s.seg)
	if err != nil {
		c.pipeMu.Lock()
		c.npipes--
		c.pipeCap = c.npipes // make no more; with none at all, splicing is off
		c.pipeMu.Unlock()
		c.log.Debug("nbd: no pipe for spliced reads", zap.Int("pipes", c.npipes), zap.Error(err))
		return nil
	}
	return p
}

// putPipe gives p back; a pipe that may not be empty is closed instead.
func (c *conn) putPipe(p *spipe, empty bool) {
	c.pipeMu.Lock()
	defer c.pipeMu.Unlock()
	if !empty {
		p.close()
		c.npipes--
		return
	}
	c.pipes = append(c.pipes, p)
}

// closePipes closes the free pipes when the connection ends (all requests have given theirs back).
func (c *conn) closePipes() {
	c.pipeMu.Lock()
	defer c.pipeMu.Unlock()
	for i, p := range c.pipes {
		p.close()
		c.pipes[i] = nil
	}
	c.npipes -= len(c.pipes)
	c.pipes = c.pipes[:0]
}

func newPipe(size int) (*spipe, error) {
	var fds [2]int
	if err := unix.Pipe2(fds[:], unix.O_NONBLOCK|unix.O_CLOEXEC); err != nil {
		return nil, fmt.Errorf("pipe2: %w", err)
	}
	p := &spipe{r: fds[0], w: fds[1]}
	got, err := unix.FcntlInt(uintptr(p.w), unix.F_SETPIPE_SZ, size)
	if err == nil && got < size {
		err = fmt.Errorf("got %d bytes", got)
	}
	if err != nil {
		p.close()
		return nil, fmt.Errorf("F_SETPIPE_SZ %d: %w", size, err)
	}
	return p, nil
}

func (p *spipe) close() {
	unix.Close(p.r)
	unix.Close(p.w)
}

// submitReadToPipe starts r (a one-segment READ) with its data going into a pipe. Like
// submitRead it takes budget and a pipe only if they are free now, and reports false, with r as
// it was, when r must take another path.
func (c *conn) submitReadToPipe(r *request) bool {
	if r.Length < minSpliceRead || int(r.Length) > c.s.seg {
		return false
	}
	n, ok := c.s.budget.tryAcquire(int64(r.Length))
	if !ok {
		return false
	}
	p := c.takePipe()
	if p == nil {
		c.s.budget.release(n)
		return false
	}
	r.reserved, r.pipe = n, p
	if !c.psub.SubmitReadToPipe(c.s.ioCtx, block.Pipe{R: p.r, W: p.w}, int(r.Length), int64(r.Offset), r) {
		r.pipe = nil
		c.putPipe(p, true)
		c.s.budget.release(n)
		r.reserved = 0
		return false
	}
	return true
}

// spliceOut moves r's payload from its pipe into the client socket (the reply header is already
// written). A pipe that holds less than the read's length (rawio.ErrPipeShort) means a device
// broke the PipeSubmitter contract: the connection ends rather than wait for bytes that will not
// come. Reply writer only.
func (c *conn) spliceOut(r *request) error {
	_, err := c.raw.SpliceOut(r.pipe.r, int(r.Length))
	return err
}
