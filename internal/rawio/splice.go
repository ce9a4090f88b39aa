package rawio

import (
	"errors"
	"io"

	"golang.org/x/sys/unix"
)

// Splicing between the socket and a pipe, through the runtime poller like Read and Writev: the
// spliced read path (iSCSI Data-In → pipe → NBD client) moves pages instead of copying them. The
// pipe belongs to the caller, is non-blocking, and nobody else writes to (SpliceIn) or reads from
// (SpliceOut) it meanwhile; that is what lets an EAGAIN be told apart (see spliceInFD).

// ErrPipeFull is SpliceIn's answer when the pipe has no free slot: nothing more can enter it
// until the caller drains it.
var ErrPipeFull = errors.New("rawio: pipe full")

// ErrPipeShort is SpliceOut's answer when the pipe ran dry before n bytes left it: the caller
// put fewer bytes in than it asked to send.
var ErrPipeShort = errors.New("rawio: pipe holds fewer bytes than asked for")

// errNotRaw: splicing needs the socket's fd.
var errNotRaw = errors.New("rawio: splice needs a socket with a raw fd")

// spliceState is one direction's scratch for its poller callback (a method value made once in
// New, so a splice allocates nothing).
type spliceState struct {
	pipe, n, moved int
	err            error
}

// SpliceIn moves up to limit bytes from the socket into the pipe whose write end is pipeW,
// waiting in the poller while the socket has nothing, so deadlines and Close interrupt it. It
// returns after the first splice that moved bytes, with their count; ErrPipeFull when the pipe
// has no room; io.EOF at the end of the stream. Read side: not concurrent with Read.
func (c *Conn) SpliceIn(pipeW, limit int) (int, error) {
	if c.rc == nil {
		return 0, errNotRaw
	}
	c.in = spliceState{pipe: pipeW, n: limit}
	if err := c.rc.Read(c.inF); err != nil {
		return 0, c.opError("splice", err)
	}
	return c.in.moved, c.in.err
}

func (c *Conn) spliceInFD(fd uintptr) bool {
	sp := &c.in
	for {
		k, err := splice(int(fd), sp.pipe, sp.n, unix.SPLICE_F_NONBLOCK|unix.SPLICE_F_MOVE)
		switch {
		case err == unix.EINTR:
			continue
		case err == unix.EAGAIN:
			// Either the socket has nothing or the pipe has no free slot; only the latter
			// leaves the pipe unwritable, as nobody drains it while the caller fills it.
			if !pollOut(sp.pipe) {
				sp.err = ErrPipeFull
				return true
			}
			return false // the poller waits for readability, then calls again
		case err != nil:
			sp.err = c.opError("splice", err)
		case k == 0:
			sp.err = io.EOF
		default:
			sp.moved = k
		}
		return true
	}
}

// SpliceOut moves n bytes from the pipe whose read end is pipeR into the socket, waiting in the
// poller while the socket is full. It returns the bytes moved; ErrPipeShort if the pipe ran dry
// first (it never waits for a socket that cannot help). Write side: not concurrent with Writev.
func (c *Conn) SpliceOut(pipeR, n int) (int, error) {
	if c.rc == nil {
		return 0, errNotRaw
	}
	c.out = spliceState{pipe: pipeR, n: n}
	if err := c.rc.Write(c.outF); err != nil {
		return c.out.moved, c.opError("splice", err)
	}
	return c.out.moved, c.out.err
}

func (c *Conn) spliceOutFD(fd uintptr) bool {
	sp := &c.out
	for sp.moved < sp.n {
		k, err := splice(sp.pipe, int(fd), sp.n-sp.moved, unix.SPLICE_F_MOVE|unix.SPLICE_F_NONBLOCK)
		switch {
		case err == unix.EINTR:
			continue
		case err == unix.EAGAIN:
			// The socket is full, unless the pipe is empty.
			if avail, ierr := unix.IoctlGetInt(sp.pipe, unix.TIOCINQ); ierr == nil && avail == 0 {
				sp.err = ErrPipeShort
				return true
			}
			return false // the poller waits for writability, then calls again
		case err != nil:
			sp.err = c.opError("splice", err)
			return true
		case k == 0:
			sp.err = ErrPipeShort
			return true
		}
		sp.moved += k
	}
	return true
}

// pollOut reports whether the pipe has room for at least one more buffer (POLLOUT).
func pollOut(pipeW int) bool {
	fds := [1]unix.PollFd{{Fd: int32(pipeW), Events: unix.POLLOUT}}
	for {
		n, err := unix.Poll(fds[:], 0)
		if err == unix.EINTR {
			continue
		}
		return err == nil && n == 1 && fds[0].Revents&unix.POLLOUT != 0
	}
}
