// Package rawio reads and writes non-blocking sockets with raw system calls, for the per-I/O
// socket traffic of the gateway (NBD requests and replies, iSCSI PDUs over TCP).
//
// Why: net.Conn's Read and Write enter the scheduler's syscall state (entersyscall), which exists
// so that another thread can take over the P while this one is blocked in the kernel. A socket in
// the runtime poller is non-blocking, so its read and write never block, and that state buys
// nothing; it costs a great deal in a gateway that goes idle between every few I/Os. When every
// P is idle the runtime's sysmon thread sleeps, and the first entersyscall after the process
// wakes up wakes sysmon again (a futex wake on the I/O path) and resets sysmon's poll interval to
// 20 µs. Under fio 4 KiB QD32 through the NBD server that was ~11,000 sysmon wake-ups a second
// and 4–7 µs of the gateway's ~20 µs CPU per I/O. RawSyscall skips the syscall state.
//
// Invariants: a read or write that would block (EAGAIN) still parks the goroutine in the runtime
// poller through syscall.RawConn, so deadlines, Close and wake-ups behave as with net.Conn, and
// errors are returned as *net.OpError wrapping the same causes (net.ErrClosed,
// os.ErrDeadlineExceeded, a syscall.Errno). A conn that offers no raw fd (net.Pipe in tests, a TLS
// conn) is used through its own Read and Write.
package rawio

import (
	"io"
	"net"
	"os"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"
)

// iovMax is IOV_MAX on Linux: a writev takes at most this many buffers.
const iovMax = 1024

// Conn reads and writes one socket. One goroutine may read while another writes; neither side
// is safe for concurrent use by itself (like bufio around a net.Conn).
type Conn struct {
	nc net.Conn
	rc syscall.RawConn // nil: use nc

	// read side
	rbuf  []byte
	rn    int
	rerr  syscall.Errno
	readF func(fd uintptr) bool

	// write side
	pending [][]byte
	iov     []unix.Iovec
	wn      int64
	werr    syscall.Errno
	writeF  func(fd uintptr) bool

	// splicing (splice.go): in on the read side, out on the write side
	in, out   spliceState
	inF, outF func(fd uintptr) bool
}

// New wraps nc. It never fails: without a raw fd the Conn passes calls through to nc.
func New(nc net.Conn) *Conn {
	c := &Conn{nc: nc}
	if sc, ok := nc.(syscall.Conn); ok {
		if rc, err := sc.SyscallConn(); err == nil {
			c.rc = rc
			c.readF = c.readFD
			c.writeF = c.writevFD
			c.inF, c.outF = c.spliceInFD, c.spliceOutFD
			c.iov = make([]unix.Iovec, 0, 64)
		}
	}
	return c
}

// Raw reports whether the Conn bypasses nc (a raw fd was available).
func (c *Conn) Raw() bool { return c.rc != nil }

// Read implements io.Reader with one read(2) (io.EOF at end of stream).
func (c *Conn) Read(p []byte) (int, error) {
	if c.rc == nil {
		return c.nc.Read(p)
	}
	if len(p) == 0 {
		return 0, nil
	}
	c.rbuf, c.rn, c.rerr = p, 0, 0
	err := c.rc.Read(c.readF)
	c.rbuf = nil
	if err != nil {
		return 0, c.opError("read", err)
	}
	if c.rerr != 0 {
		return 0, c.opError("read", os.NewSyscallError("read", c.rerr))
	}
	if c.rn == 0 {
		return 0, io.EOF
	}
	return c.rn, nil
}

func (c *Conn) readFD(fd uintptr) bool {
	for {
		n, _, e := unix.RawSyscall(unix.SYS_READ, fd, uintptr(unsafe.Pointer(&c.rbuf[0])), uintptr(len(c.rbuf)))
		switch e {
		case 0:
			c.rn = int(n)
			return true
		case unix.EINTR:
			continue
		case unix.EAGAIN:
			return false // the poller waits for readability, then calls again
		default:
			c.rerr = e
			return true
		}
	}
}

// Writev writes all of bufs (empty ones are skipped) with writev(2), looping over short writes
// and waiting in the poller while the socket is full. bufs is consumed (its elements are
// resliced); it returns the bytes written.
func (c *Conn) Writev(bufs [][]byte) (int64, error) {
	if c.rc == nil {
		nb := net.Buffers(bufs)
		return nb.WriteTo(c.nc)
	}
	c.pending, c.wn, c.werr = bufs, 0, 0
	err := c.rc.Write(c.writeF)
	n := c.wn
	c.pending = nil
	if err != nil {
		return n, c.opError("write", err)
	}
	if c.werr != 0 {
		return n, c.opError("write", os.NewSyscallError("writev", c.werr))
	}
	return n, nil
}

func (c *Conn) writevFD(fd uintptr) bool {
	for {
		// Skip empty buffers so a zero-length tail never loops.
		for len(c.pending) > 0 && len(c.pending[0]) == 0 {
			c.pending = c.pending[1:]
		}
		if len(c.pending) == 0 {
			return true
		}
		iov := c.iov[:0]
		for _, b := range c.pending {
			if len(iov) == iovMax {
				break
			}
			if len(b) == 0 {
				continue
			}
			var v unix.Iovec
			v.Base = &b[0]
			v.SetLen(len(b))
			iov = append(iov, v)
		}
		r, _, e := unix.RawSyscall(unix.SYS_WRITEV, fd, uintptr(unsafe.Pointer(&iov[0])), uintptr(len(iov)))
		clear(iov) // do not keep the callers' buffers reachable
		c.iov = iov[:0]
		switch e {
		case 0:
		case unix.EINTR:
			continue
		case unix.EAGAIN:
			return false // the poller waits for writability, then calls again
		default:
			c.werr = e
			return true
		}
		n := int(r)
		c.wn += int64(n)
		for n > 0 && len(c.pending) > 0 {
			if n >= len(c.pending[0]) {
				n -= len(c.pending[0])
				c.pending = c.pending[1:]
			} else {
				c.pending[0] = c.pending[0][n:]
				n = 0
			}
		}
	}
}

func (c *Conn) opError(op string, err error) error {
	return &net.OpError{Op: op, Net: c.nc.LocalAddr().Network(), Source: c.nc.LocalAddr(), Addr: c.nc.RemoteAddr(), Err: err}
}

// splice is splice(2) of up to n bytes from fd in to fd out (no offsets), without the
// scheduler's syscall state: both ends must be non-blocking (a socket in the runtime poller, a
// pipe opened O_NONBLOCK, or SPLICE_F_NONBLOCK in flags). Errors are the bare syscall.Errno
// (EAGAIN and EINTR included), so callers keep their own retry and poller logic.
func splice(in, out, n, flags int) (int, error) {
	r, _, e := unix.RawSyscall6(unix.SYS_SPLICE, uintptr(in), 0, uintptr(out), 0, uintptr(n), uintptr(flags))
	if e != 0 {
		return 0, e
	}
	return int(r), nil
}

// WriteAll writes b to the non-blocking fd (a pipe) with write(2) until all of it is written,
// retrying EINTR. On an error, EAGAIN included (the fd is full), n says how much was written.
func WriteAll(fd int, b []byte) (n int, err error) {
	for n < len(b) {
		k, err := write(fd, b[n:])
		switch {
		case err == unix.EINTR:
			continue
		case err != nil:
			return n, err
		}
		n += k
	}
	return n, nil
}

// write is write(2) to a non-blocking fd, on the same terms as splice.
func write(fd int, b []byte) (int, error) {
	if len(b) == 0 {
		return 0, nil
	}
	r, _, e := unix.RawSyscall(unix.SYS_WRITE, uintptr(fd), uintptr(unsafe.Pointer(&b[0])), uintptr(len(b)))
	if e != 0 {
		return 0, e
	}
	return int(r), nil
}
