//go:build linux

package nbd

// A planned restart of a kernel device's server keeps the device's sockets: the old image stops
// reading requests at a boundary (PauseIntake, intake.go), answers what it read, and hands the
// server's ends of the socket pairs to the next image across exec (ExecSockets: descriptors
// without close-on-exec, named in InheritedSocketsEnv). When every connection is alive and the
// hand-down succeeds, the kernel never sees one die, so nothing it sent waits for its request
// timer: the next image reads the requests queued in the sockets meanwhile. Reattach takes the
// inherited sockets when they are this device's; otherwise (a crash, a stop --keep, an exec
// that lost them) it gives the kernel new sockets with NBD_CMD_RECONFIGURE as before (the
// requests in the sockets it closes then wait for the kernel's timer, as they all did before).

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"strconv"
	"strings"
	"syscall"

	"go.uber.org/zap"
	"golang.org/x/sys/unix"
)

// InheritedSocketsEnv names the environment entry through which an image hands its kernel
// device's sockets to the next: "INDEX:FD,FD,..." (the device's index, then the descriptors in
// connection order).
const InheritedSocketsEnv = "ISERBLK_NBD_SOCKETS"

// track records a connection the attachment serves (serveTransmission's started).
func (a *Attachment) track(c *conn) {
	a.servedMu.Lock()
	a.served = append(a.served, c)
	a.servedMu.Unlock()
}

func (a *Attachment) connections() []*conn {
	a.servedMu.Lock()
	defer a.servedMu.Unlock()
	return append([]*conn(nil), a.served...)
}

// PauseIntake stops every connection's reader at a request boundary, with nothing of the next
// request read, and waits (bounded by ctx) until every request read has been answered. What the
// kernel sends meanwhile stays in the sockets. On an error some readers may be paused:
// ResumeIntake undoes it either way.
func (a *Attachment) PauseIntake(ctx context.Context) error {
	conns := a.connections()
	if len(conns) == 0 {
		return errors.New("nbd: the device has no connection to pause")
	}
	parked := make([]<-chan struct{}, len(conns))
	for i, c := range conns {
		parked[i] = c.pauseIntake()
	}
	for i, p := range parked {
		select {
		case <-p:
		case <-conns[i].intake.ended: // the kernel closed it: nothing to pause, nothing to hand down
		case <-a.done:
			return fmt.Errorf("nbd: %s: the kernel dropped its connections during the pause", a.Path())
		case <-ctx.Done():
			return fmt.Errorf("nbd: %s: requests still in flight: %w", a.Path(), ctx.Err())
		}
	}
	return nil
}

// ResumeIntake lets the readers PauseIntake stopped go on.
func (a *Attachment) ResumeIntake() {
	for _, c := range a.connections() {
		c.resumeIntake()
	}
}

// ExecSockets makes the device's sockets survive an exec: it duplicates the server's end of
// each connection without close-on-exec and returns the InheritedSocketsEnv entry that names
// them ("NAME=VALUE"). Call it after PauseIntake succeeded, just before the exec; if the exec
// fails the process exits, and the descriptors with it.
func (a *Attachment) ExecSockets() (string, error) {
	conns := a.connections()
	var fds []int
	fail := func(err error) (string, error) {
		for _, fd := range fds {
			unix.Close(fd) // not one left open for an image that does not know it
		}
		return "", fmt.Errorf("nbd: keeping %s's sockets across exec: %w", a.Path(), err)
	}
	for _, c := range conns {
		select {
		case <-c.intake.ended:
			// The kernel closed it. The next image, given fewer sockets than connections,
			// closes the others too and gives the device new sockets for all of them
			// (NBD_CMD_RECONFIGURE replaces dead connections only): their requests then wait
			// for the kernel's timer, as before the hand-down existed.
			continue
		default:
		}
		fd, err := dupForExec(c.nc)
		if err != nil {
			return fail(err)
		}
		fds = append(fds, fd)
	}
	if len(fds) == 0 {
		return fail(errors.New("no connection is left"))
	}
	list := make([]string, len(fds))
	for i, fd := range fds {
		list[i] = strconv.Itoa(fd)
	}
	return fmt.Sprintf("%s=%d:%s", InheritedSocketsEnv, a.index, strings.Join(list, ",")), nil
}

// dupForExec duplicates nc's descriptor; dup(2) leaves close-on-exec clear on the copy.
func dupForExec(nc net.Conn) (int, error) {
	sc, ok := nc.(interface {
		SyscallConn() (syscall.RawConn, error)
	})
	if !ok {
		return -1, errors.New("the connection has no descriptor")
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return -1, err
	}
	fd := -1
	var dupErr error
	if err := rc.Control(func(s uintptr) { fd, dupErr = unix.Dup(int(s)) }); err != nil {
		return -1, err
	}
	return fd, dupErr
}

// inheritedSockets takes the sockets a previous image of this process handed down for device
// index (InheritedSocketsEnv), and unsets the entry either way. It returns nil when there are
// none, or when they are not n unix stream sockets this process made (a socket pair's peer
// credentials name the process that made it, which an exec keeps) for this device: a stranger's
// descriptors are never served or closed, ours are closed so that the kernel sees those
// connections die and takes the new sockets the caller then gives it.
func inheritedSockets(index, n int, log *zap.Logger) []net.Conn {
	v, ok := os.LookupEnv(InheritedSocketsEnv)
	if !ok {
		return nil
	}
	os.Unsetenv(InheritedSocketsEnv)
	dev, fds, err := parseInherited(v)
	var ours []int
	for _, fd := range fds {
		if cerr := checkInherited(fd); cerr != nil {
			err = errors.Join(err, cerr)
		} else {
			ours = append(ours, fd)
		}
	}
	switch {
	case err != nil:
	case dev != index:
		err = fmt.Errorf("they are for /dev/nbd%d, not /dev/nbd%d", dev, index)
	case len(ours) != n:
		err = fmt.Errorf("%d sockets for %d connections", len(ours), n)
	default:
		err = checkKernelKept(ours)
	}
	var conns []net.Conn
	for _, fd := range ours {
		f := os.NewFile(uintptr(fd), "nbd-server")
		if err == nil {
			var c net.Conn
			c, err = net.FileConn(f) // a duplicate, close-on-exec
			conns = append(conns, c)
		}
		f.Close()
	}
	if err != nil {
		for _, c := range conns {
			if c != nil {
				c.Close()
			}
		}
		log.Warn("not using the sockets the previous image handed down: the device gets new ones",
			zap.String("handed_down", v), zap.Error(err))
		return nil
	}
	return conns
}

// dropInheritedSockets closes the sockets a previous image handed down when a new device is made
// instead of the old one taken over (Attach): the old device then sees its connections die and
// waits for a successor as after a crash, rather than for sockets nobody reads.
func dropInheritedSockets(log *zap.Logger) {
	v, ok := os.LookupEnv(InheritedSocketsEnv)
	if !ok {
		return
	}
	os.Unsetenv(InheritedSocketsEnv)
	_, fds, _ := parseInherited(v)
	for _, fd := range fds {
		if checkInherited(fd) == nil {
			unix.Close(fd)
		}
	}
	log.Warn("closed the sockets a previous image handed down: a new device is made instead", zap.String("handed_down", v))
}

// checkKernelKept refuses sockets the kernel shut down meanwhile: a request that outlived the
// kernel's timer during the restart made it close that connection (nbd_xmit_timeout marks it
// dead and shuts its socket down), which only NBD_CMD_RECONFIGURE gives back.
func checkKernelKept(fds []int) error {
	pfds := make([]unix.PollFd, len(fds))
	for i, fd := range fds {
		pfds[i] = unix.PollFd{Fd: int32(fd), Events: unix.POLLRDHUP}
	}
	if _, err := unix.Poll(pfds, 0); err != nil {
		return fmt.Errorf("poll: %w", err)
	}
	for i, p := range pfds {
		if p.Revents&(unix.POLLRDHUP|unix.POLLHUP|unix.POLLERR) != 0 {
			return fmt.Errorf("the kernel closed connection %d during the restart", i)
		}
	}
	return nil
}

// parseInherited parses "INDEX:FD,FD,...". It returns every well-formed descriptor even when
// something else is malformed, so that the caller can close ours among them.
func parseInherited(v string) (index int, fds []int, err error) {
	dev, list, ok := strings.Cut(v, ":")
	if index, err = strconv.Atoi(dev); !ok || err != nil || index < 0 {
		index, err = -1, fmt.Errorf("malformed device index in %q", v)
	}
	for _, f := range strings.Split(list, ",") {
		fd, ferr := strconv.Atoi(f)
		if ferr != nil || fd < 3 {
			err = errors.Join(err, fmt.Errorf("malformed descriptor %q", f))
			continue
		}
		fds = append(fds, fd)
	}
	return index, fds, err
}

// checkInherited requires fd to be a unix stream socket whose peer is this process.
func checkInherited(fd int) error {
	typ, err := unix.GetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_TYPE)
	if err != nil {
		return fmt.Errorf("descriptor %d: %w", fd, err)
	}
	dom, err := unix.GetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_DOMAIN)
	if err != nil {
		return fmt.Errorf("descriptor %d: %w", fd, err)
	}
	if typ != unix.SOCK_STREAM || dom != unix.AF_UNIX {
		return fmt.Errorf("descriptor %d is not a unix stream socket", fd)
	}
	cred, err := unix.GetsockoptUcred(fd, unix.SOL_SOCKET, unix.SO_PEERCRED)
	if err != nil {
		return fmt.Errorf("descriptor %d: %w", fd, err)
	}
	if int(cred.Pid) != os.Getpid() {
		return fmt.Errorf("descriptor %d's peer is process %d, not this one", fd, cred.Pid)
	}
	return nil
}
