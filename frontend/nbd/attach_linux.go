//go:build linux

package nbd

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
	"unsafe"

	"go.uber.org/zap"
	"golang.org/x/sys/unix"
)

// Kernel attach: the server serves one end of N socketpairs and the kernel's nbd driver gets the
// other ends, so /dev/nbdX becomes a block device backed by the server. Generic netlink
// (NBD_CMD_CONNECT, include/uapi/linux/nbd-netlink.h) is preferred: it takes several sockets at
// once, the server flags, a dead-connection timeout, and can pick a free device. The ioctl path
// (include/uapi/linux/nbd.h) is the fallback for kernels without the nbd netlink family.
//
// Either way the transmission flags (SEND_FLUSH, SEND_FUA, SEND_TRIM, SEND_WRITE_ZEROES,
// CAN_MULTI_CONN, ...) are handed to the kernel: without SEND_FLUSH the kernel treats the device as
// having no volatile cache and never sends FLUSH, so fsync on the mounted filesystem would be a
// silent no-op.

// ioctl numbers: _IO(0xab, n).
const (
	nbdSetSock       = 0xab00
	nbdSetBlksize    = 0xab01
	nbdDoIt          = 0xab03
	nbdClearSock     = 0xab04
	nbdSetSizeBlocks = 0xab07
	nbdDisconnect    = 0xab08
	nbdSetTimeout    = 0xab09
	nbdSetFlags      = 0xab0a
)

// ErrNoKernelNBD reports that the kernel has neither the nbd netlink family nor the device node.
var ErrNoKernelNBD = errors.New("nbd: the kernel has no nbd driver (modprobe nbd)")

// AttachOptions configure Attach.
type AttachOptions struct {
	// Device is the node to bind ("/dev/nbd0"); empty lets the kernel choose (netlink only).
	Device string
	// Connections is the number of sockets (default 1). More than one needs the device's
	// MultiConn, which the server advertises as CAN_MULTI_CONN.
	Connections int
	// Timeout is the kernel's per-request timeout (0: requests never time out in the kernel; the
	// backend's own replacement timeout fails them with EIO instead of the kernel declaring the
	// socket dead).
	Timeout time.Duration
	// DeadConnTimeout is how long the kernel queues I/O when every connection is dead, waiting
	// for a reconfigure, before failing it.
	DeadConnTimeout time.Duration
	// BackendID names what the device serves (NBD_ATTR_BACKEND_IDENTIFIER, shown in
	// /sys/block/nbdN/backend); Reattach finds the device by it. Default "iser-blk:EXPORT".
	BackendID string
	// ForceIoctl skips netlink (tests of the fallback path).
	ForceIoctl bool
	// Stored are the device's sockets a previous server process left in a supervisor's
	// descriptor store (systemd's, by a stop --keep: StoreSockets), as the store passed them to
	// this one. Reattach serves them when they are Connections live unix stream sockets;
	// Attach and Reattach close every one of them in any case.
	Stored []*os.File
	Logger *zap.Logger
}

// Attachment is a kernel nbd device bound to a Server.
type Attachment struct {
	srv        *Server
	index      int
	viaNetlink bool
	log        *zap.Logger

	conns     sync.WaitGroup
	done      chan struct{} // closed when every connection has ended
	servedMu  sync.Mutex    // guards served
	served    []*conn       // the connections, for a planned restart's pause (handover_linux.go)
	detached  atomic.Bool
	connected atomic.Bool // the kernel took the sockets (a failed connect closes ours itself)

	// ioctl path
	devFile *os.File
	doItErr chan error
	doItTID atomic.Int32 // the thread blocked in NBD_DO_IT, for the signal test
}

// Path returns the device node.
func (a *Attachment) Path() string { return fmt.Sprintf("/dev/nbd%d", a.index) }

// Done is closed when every connection to the kernel has ended (after Detach, or when the kernel
// dropped the device).
func (a *Attachment) Done() <-chan struct{} { return a.done }

func parseDeviceIndex(dev string) (int, error) {
	if dev == "" {
		return -1, nil
	}
	s := strings.TrimPrefix(dev, "/dev/nbd")
	i, err := strconv.Atoi(s)
	if err != nil || i < 0 || s == dev {
		return 0, fmt.Errorf("nbd: %q is not an nbd device node (/dev/nbdN)", dev)
	}
	return i, nil
}

// Attach binds srv's export to a kernel nbd device and serves it until Detach: one socket pair
// per connection, the server serving its ends before the kernel gets the others (through netlink,
// or the ioctl path when the kernel has no nbd netlink family or opts.ForceIoctl says so).
func Attach(srv *Server, opts AttachOptions) (*Attachment, error) {
	closeStored(opts.Stored, opts.Logger)
	opts, err := checkAttachOptions(srv, opts)
	if err != nil {
		return nil, err
	}
	index, err := parseDeviceIndex(opts.Device)
	if err != nil {
		return nil, err
	}
	dropInheritedSockets(opts.Logger)
	a := &Attachment{srv: srv, index: index, log: opts.Logger, done: make(chan struct{})}
	if err := a.start(opts.Connections, func(remotes []*os.File) error { return a.connect(remotes, opts) }); err != nil {
		return nil, err
	}
	a.log.Info("nbd device attached", zap.String("device", a.Path()), zap.Bool("netlink", a.viaNetlink),
		zap.Int("connections", opts.Connections), zap.Uint16("flags", srv.Flags()))
	return a, nil
}

// checkAttachOptions applies the defaults and refuses more than one connection to a device that
// does not support multi-conn (Attach and Reattach alike).
func checkAttachOptions(srv *Server, opts AttachOptions) (AttachOptions, error) {
	if opts.Connections <= 0 {
		opts.Connections = 1
	}
	if opts.Connections > 1 && srv.Flags()&FlagCanMultiConn == 0 {
		return opts, fmt.Errorf("nbd: %d connections need a device that supports multi-conn", opts.Connections)
	}
	if opts.Logger == nil {
		opts.Logger = zap.NewNop()
	}
	return opts, nil
}

// start makes n socket pairs, serves the server's ends and hands the kernel's ends to connect;
// the kernel keeps its own references, so ours are closed either way. If connect fails the
// server's ends are closed and their connections have ended when start returns.
//
// It is not one round of Reattach's reconnect: NBD_CMD_CONNECT and NBD_DO_IT start the device,
// and the kernel may read the partition table before connect returns, so our ends are served
// first; and CONNECT takes every socket or fails, so there is nothing to sort out afterwards.
func (a *Attachment) start(n int, connect func(remotes []*os.File) error) error {
	locals, remotes, err := socketPairs(n)
	if err != nil {
		return err
	}
	a.serve(locals)
	err = connect(remotes)
	for _, f := range remotes {
		f.Close()
	}
	if err == nil {
		a.connected.Store(true) // after connect set index: serve's goroutines read it only after this
	} else {
		for _, c := range locals {
			c.Close()
		}
		<-a.done
	}
	return err
}

// socketPairs makes n socket pairs: the server's ends and the kernel's.
func socketPairs(n int) (locals []net.Conn, remotes []*os.File, err error) {
	for range n {
		l, r, err := socketPair()
		if err != nil {
			for _, c := range locals {
				c.Close()
			}
			for _, f := range remotes {
				f.Close()
			}
			return nil, nil, err
		}
		locals = append(locals, l)
		remotes = append(remotes, r)
	}
	return locals, remotes, nil
}

// serve serves the server's ends of the socket pairs; a.done closes when all have ended. The
// server side must be serving before the kernel starts sending (it may probe the partition
// table as soon as the device is started).
//
// A connection that ends while the others serve on, once the kernel took the sockets and with no
// detach or shutdown of ours, was ended by the kernel: its request timer fires even with no
// timeout configured (30 s, the block layer's default, with --timeout 0), and with more than one
// connection it then requeues the request on another and closes the socket it was on
// (drivers/block/nbd.c, nbd_xmit_timeout; a target outage longer than that does it). The device
// serves on with one connection fewer, which is logged; when the last one ends, the attachment
// is done (Done) as after a disconnect.
func (a *Attachment) serve(locals []net.Conn) {
	var live atomic.Int32
	live.Store(int32(len(locals)))
	for _, l := range locals {
		a.conns.Add(1)
		go func() {
			defer a.conns.Done()
			a.srv.serveTransmission(l, a.track)
			left := live.Add(-1)
			if left > 0 && a.connected.Load() && !a.detached.Load() && !a.srv.shutting.Load() {
				a.log.Warn("the kernel closed one of the device's nbd connections (a request outlived the kernel's request timer, or the device is being disconnected); the device serves on the others",
					zap.String("device", a.Path()), zap.Int32("connections_left", left))
			}
		}()
	}
	go func() { a.conns.Wait(); close(a.done) }()
}

// connect hands the kernel its ends of the socket pairs: through netlink unless forced to the
// ioctl path or the kernel lacks the nbd netlink family.
func (a *Attachment) connect(remotes []*os.File, opts AttachOptions) error {
	if !opts.ForceIoctl {
		idx, err := netlinkConnect(a.srv, a.index, remotes, opts)
		switch {
		case err == nil:
			a.index = idx
			a.viaNetlink = true
			return nil
		case errors.Is(err, errNoNetlinkFamily):
			a.log.Info("nbd netlink family missing, using the ioctl path", zap.Error(err))
		default:
			return err
		}
	}
	if a.index < 0 {
		return errors.New("nbd: the ioctl path needs an explicit device (--nbd /dev/nbdN)")
	}
	return a.ioctlConnect(remotes, opts)
}

// Detach disconnects the kernel device: the kernel sends NBD_CMD_DISC on every socket and shuts
// them down; the server drains what it has in flight. It waits (bounded by ctx) for every
// connection to end.
func (a *Attachment) Detach(ctx context.Context) error {
	if a.detached.Swap(true) {
		<-a.done
		return nil
	}
	var err error
	if a.viaNetlink {
		err = netlinkDisconnect(a.index)
	} else {
		err = a.ioctlDisconnect()
	}
	select {
	case <-a.done:
	case <-ctx.Done():
		return fmt.Errorf("nbd: detaching %s: connections still open: %w", a.Path(), ctx.Err())
	}
	if !a.viaNetlink {
		select {
		case e := <-a.doItErr:
			if e != nil && !errors.Is(e, syscall.EBADR) {
				a.log.Debug("NBD_DO_IT returned", zap.Error(e))
			}
		case <-ctx.Done():
		}
		_ = unix.IoctlSetInt(int(a.devFile.Fd()), nbdClearSock, 0)
		a.devFile.Close()
	}
	if err != nil {
		return fmt.Errorf("nbd: detaching %s: %w", a.Path(), err)
	}
	a.log.Info("nbd device detached", zap.String("device", a.Path()))
	return nil
}

// ---- generic netlink ----

var errNoNetlinkFamily = errors.New("nbd: no \"nbd\" generic netlink family")

type genlConn struct {
	fd  int
	seq uint32
}

func openGenl() (*genlConn, error) {
	fd, err := unix.Socket(unix.AF_NETLINK, unix.SOCK_RAW|unix.SOCK_CLOEXEC, unix.NETLINK_GENERIC)
	if err != nil {
		return nil, fmt.Errorf("nbd: netlink socket: %w", err)
	}
	if err := unix.Bind(fd, &unix.SockaddrNetlink{Family: unix.AF_NETLINK}); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("nbd: netlink bind: %w", err)
	}
	// A bounded wait: the kernel answers at once, but never let a lost reply hang attach.
	tv := unix.Timeval{Sec: 30}
	_ = unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &tv)
	return &genlConn{fd: fd}, nil
}

func (g *genlConn) close() { unix.Close(g.fd) }

// request sends one message with NLM_F_ACK and returns the data messages received before the
// acknowledgement, or the kernel's error.
func (g *genlConn) request(family uint16, cmd, version uint8, attrs []byte) ([]nlMessage, error) {
	g.seq++
	seq := g.seq
	msg := genlMessage(family, nlmFRequest|nlmFAck, seq, cmd, version, attrs)
	if err := unix.Sendto(g.fd, msg, 0, &unix.SockaddrNetlink{Family: unix.AF_NETLINK}); err != nil {
		return nil, fmt.Errorf("nbd: netlink send: %w", err)
	}
	var out []nlMessage
	buf := make([]byte, 64<<10)
	for {
		n, _, err := unix.Recvfrom(g.fd, buf, 0)
		if err != nil {
			return nil, fmt.Errorf("nbd: netlink receive: %w", err)
		}
		msgs, err := parseMessages(buf[:n])
		if err != nil {
			return nil, err
		}
		for _, m := range msgs {
			if m.seq != seq {
				continue
			}
			switch m.typ {
			case nlmsgError:
				errno, err := nlError(m.payload)
				if err != nil {
					return nil, err
				}
				if errno != 0 {
					return out, errno
				}
				return out, nil
			case nlmsgDone:
				return out, nil
			default:
				m.payload = append([]byte(nil), m.payload...)
				out = append(out, m)
			}
		}
	}
}

func (g *genlConn) familyID(name string) (uint16, error) {
	var e attrEncoder
	e.str(ctrlAttrName, name)
	msgs, err := g.request(genlIDCtrl, ctrlCmdGetFa, 1, e.b)
	if errors.Is(err, syscall.ENOENT) {
		return 0, errNoNetlinkFamily
	}
	if err != nil {
		return 0, fmt.Errorf("nbd: resolving netlink family %q: %w", name, err)
	}
	for _, m := range msgs {
		_, attrs, err := genlAttrs(m.payload)
		if err != nil {
			return 0, err
		}
		for _, a := range attrs {
			if a.typ == ctrlAttrID {
				if id, ok := a.u16(); ok {
					return id, nil
				}
			}
		}
	}
	return 0, fmt.Errorf("nbd: netlink family %q: no id in the reply", name)
}

// connectAttrs builds the NBD_CMD_CONNECT attributes.
func connectAttrs(srv *Server, index int, fds []int, opts AttachOptions) []byte {
	var e attrEncoder
	if index >= 0 {
		e.u32(nbdAttrIndex, uint32(index))
	}
	e.u64(nbdAttrSizeBytes, uint64(srv.dev.Size()))
	e.u64(nbdAttrBlockSizeBytes, uint64(srv.dev.BlockSize()))
	e.u64(nbdAttrServerFlags, uint64(srv.Flags()))
	connectionAttrs(&e, srv, fds, opts)
	return e.b
}

// connectionAttrs adds what NBD_CMD_CONNECT and NBD_CMD_RECONFIGURE both carry: the timeouts,
// the sockets and the backend identifier (include/uapi/linux/nbd-netlink.h).
func connectionAttrs(e *attrEncoder, srv *Server, fds []int, opts AttachOptions) {
	e.u64(nbdAttrTimeout, uint64(opts.Timeout/time.Second))
	e.u64(nbdAttrDeadConnTimeout, uint64(opts.DeadConnTimeout/time.Second))
	e.nested(nbdAttrSockets, func(s *attrEncoder) {
		for _, fd := range fds {
			s.nested(nbdSockItem, func(it *attrEncoder) { it.u32(nbdSockFD, uint32(fd)) })
		}
	})
	e.str(nbdAttrBackendID, backendID(srv, opts))
}

func netlinkConnect(srv *Server, index int, remotes []*os.File, opts AttachOptions) (int, error) {
	g, err := openGenl()
	if err != nil {
		return 0, err
	}
	defer g.close()
	fam, err := g.familyID(nbdGenlName)
	if err != nil {
		return 0, err
	}
	fds := make([]int, len(remotes))
	for i, f := range remotes {
		fds[i] = int(f.Fd())
	}
	msgs, err := g.request(fam, nbdCmdConnect, nbdGenlVersion, connectAttrs(srv, index, fds, opts))
	if err != nil {
		return 0, fmt.Errorf("nbd: NBD_CMD_CONNECT: %w", err)
	}
	for _, m := range msgs {
		_, attrs, err := genlAttrs(m.payload)
		if err != nil {
			return 0, err
		}
		for _, a := range attrs {
			if a.typ == nbdAttrIndex {
				if v, ok := a.u32(); ok {
					return int(v), nil
				}
			}
		}
	}
	if index >= 0 {
		return index, nil
	}
	return 0, errors.New("nbd: NBD_CMD_CONNECT reply carried no device index")
}

func netlinkDisconnect(index int) error {
	g, fam, err := openNBDFamily()
	if err != nil {
		return err
	}
	defer g.close()
	var e attrEncoder
	e.u32(nbdAttrIndex, uint32(index))
	if _, err := g.request(fam, nbdCmdDisconnect, nbdGenlVersion, e.b); err != nil {
		return fmt.Errorf("NBD_CMD_DISCONNECT: %w", err)
	}
	return nil
}

// ---- ioctl fallback ----

// ioctlConnect configures the device with ioctls and starts NBD_DO_IT on a dedicated, locked OS
// thread: the kernel ties the setup to the calling task, and DO_IT blocks until disconnect.
func (a *Attachment) ioctlConnect(remotes []*os.File, opts AttachOptions) error {
	path := a.Path()
	if _, err := os.Stat(path); errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("%w: %s does not exist", ErrNoKernelNBD, path)
	}
	setup := make(chan error, 1)
	a.doItErr = make(chan error, 1)
	go func() {
		runtime.LockOSThread() // never unlocked: the thread exits with the goroutine
		f, err := os.OpenFile(path, os.O_RDWR, 0)
		if err != nil {
			setup <- fmt.Errorf("nbd: %w", err)
			return
		}
		fd := int(f.Fd())
		dev := a.srv.dev
		steps := []struct {
			name string
			req  uint
			val  int
		}{
			{"NBD_SET_BLKSIZE", nbdSetBlksize, dev.BlockSize()},
			{"NBD_SET_SIZE_BLOCKS", nbdSetSizeBlocks, int(dev.Size() / int64(dev.BlockSize()))},
			{"NBD_SET_FLAGS", nbdSetFlags, int(a.srv.Flags())},
			{"NBD_SET_TIMEOUT", nbdSetTimeout, int(opts.Timeout / time.Second)},
		}
		for _, r := range remotes {
			steps = append(steps, struct {
				name string
				req  uint
				val  int
			}{"NBD_SET_SOCK", nbdSetSock, int(r.Fd())})
		}
		for _, s := range steps {
			if err := unix.IoctlSetInt(fd, s.req, s.val); err != nil {
				_ = unix.IoctlSetInt(fd, nbdClearSock, 0)
				f.Close()
				setup <- fmt.Errorf("nbd: %s on %s: %w", s.name, path, err)
				return
			}
		}
		a.devFile = f
		// NBD_DO_IT waits interruptibly (nbd_start_device_ioctl in drivers/block/nbd.c): a signal
		// delivered to this thread — a SIGCHLD or SIGTERM the kernel routes here, the runtime's
		// SIGURG — ends the wait, shuts the sockets and zeroes the capacity, and the restarted
		// ioctl then answers EBUSY. Block every asynchronous signal on this thread (it runs
		// nothing else and exits with the goroutine) so the other threads take them.
		if err := blockAsyncSignals(); err != nil {
			_ = unix.IoctlSetInt(fd, nbdClearSock, 0)
			f.Close()
			setup <- fmt.Errorf("nbd: blocking signals on the NBD_DO_IT thread: %w", err)
			return
		}
		a.doItTID.Store(int32(unix.Gettid()))
		setup <- nil
		a.doItErr <- unix.IoctlSetInt(fd, nbdDoIt, 0)
	}()
	if err := <-setup; err != nil {
		return err
	}
	return a.waitStarted(path)
}

// waitStarted waits until NBD_DO_IT has started the device or failed. The kernel applies the
// queue limits (write cache, FUA, discard) and then the capacity when NBD_DO_IT starts the
// device: once the capacity shows, the device is fully configured.
func (a *Attachment) waitStarted(path string) error {
	sizeFile := fmt.Sprintf("/sys/block/nbd%d/size", a.index)
	deadline := time.Now().Add(30 * time.Second)
	for {
		if b, err := os.ReadFile(sizeFile); err == nil && strings.TrimSpace(string(b)) != "0" {
			return nil
		}
		select {
		case err := <-a.doItErr:
			_ = unix.IoctlSetInt(int(a.devFile.Fd()), nbdClearSock, 0)
			a.devFile.Close()
			return fmt.Errorf("nbd: NBD_DO_IT on %s: %w", path, err)
		case <-time.After(10 * time.Millisecond): // polling sysfs: the kernel offers no event for it
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("nbd: %s did not start within 30 s", path)
		}
	}
}

// blockAsyncSignals blocks, on the calling (locked) thread, every signal except those the kernel
// raises synchronously for a fault, which must stay deliverable for the runtime to turn them into
// panics.
func blockAsyncSignals() error {
	var set unix.Sigset_t
	for i := range set.Val {
		set.Val[i] = ^set.Val[i] // all ones, whatever the word size of this architecture
	}
	bits := uint(unsafe.Sizeof(set.Val[0])) * 8
	for _, sig := range []unix.Signal{unix.SIGSEGV, unix.SIGBUS, unix.SIGFPE, unix.SIGILL, unix.SIGTRAP} {
		n := uint(sig) - 1
		set.Val[n/bits] &^= 1 << (n % bits)
	}
	return unix.PthreadSigmask(unix.SIG_BLOCK, &set, nil)
}

func (a *Attachment) ioctlDisconnect() error {
	f, err := os.OpenFile(a.Path(), os.O_RDWR, 0)
	if err != nil {
		return err
	}
	defer f.Close()
	return unix.IoctlSetInt(int(f.Fd()), nbdDisconnect, 0)
}
