//go:build linux

package nbd

// A planned restart of a kernel device's server keeps the device's sockets: the old image stops
// reading requests at a boundary (PauseIntake, intake.go), answers what it read, and hands the
// server's ends of the socket pairs to the next image across exec (ExecSockets: descriptors
// without close-on-exec, named in InheritedSocketsEnv). When every connection is alive and the
// hand-down succeeds, the kernel never sees one die, so nothing it sent waits for its request
// timer: the next image reads the requests queued in the sockets meanwhile. A stop --keep under
// a supervisor with a descriptor store (systemd's) hands them to the store instead
// (StoreSockets), and the successor process gets them back (AttachOptions.Stored). Reattach
// takes the handed-down sockets when they are this device's; otherwise (a crash, a stop --keep
// without a store, a hand-down that lost them) it gives the kernel new sockets with
// NBD_CMD_RECONFIGURE as before (the requests in the sockets it closes then wait for the
// kernel's timer, as they all did before).

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
// device's sockets to the next: "INDEX:FD,FD,...:MAKER" (the device's index, the descriptors in
// connection order, the process that made the socket pairs).
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
		case <-conns[i].ended: // the kernel closed it: nothing to pause, nothing to hand down
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
	fds, maker, err := a.handDownFDs(dupForExec)
	if err != nil {
		return "", fmt.Errorf("nbd: keeping %s's sockets across exec: %w", a.Path(), err)
	}
	list := make([]string, len(fds))
	for i, fd := range fds {
		list[i] = strconv.Itoa(fd)
	}
	return fmt.Sprintf("%s=%d:%s:%d", InheritedSocketsEnv, a.index, strings.Join(list, ","), maker), nil
}

// StoredSocketsName is the name under which server process pid leaves device index's sockets in
// a supervisor's descriptor store. The successor takes only the entry named after the process
// that recorded the device's state last: an entry left from an earlier process (a successor
// that could not remove it, then died) is never served, as its streams may stop mid-request.
func StoredSocketsName(index, pid int) string { return fmt.Sprintf("nbd%d-pid%d", index, pid) }

// StoreSockets gives the server's end of each live connection to a supervisor's descriptor
// store (systemd's FDSTORE=1, through store) under StoredSocketsName(index, this process), for
// a successor started with the same command (Reattach with AttachOptions.Stored). Call it after
// PauseIntake succeeded, just before the process exits: the kernel then never sees the
// connections die, and what it sends meanwhile waits in them for the successor. The store keeps
// copies; this process's own descriptors end with it.
func (a *Attachment) StoreSockets(store func(name string, fds []int) error) error {
	fds, _, err := a.handDownFDs(dupCloexec)
	if err != nil {
		return fmt.Errorf("nbd: storing %s's sockets: %w", a.Path(), err)
	}
	defer closeFDs(fds)
	if err := store(StoredSocketsName(a.index, os.Getpid()), fds); err != nil {
		return fmt.Errorf("nbd: storing %s's sockets: %w", a.Path(), err)
	}
	return nil
}

// handDownFDs duplicates the server's end of each live connection with dup, and returns the
// process that made the socket pairs (their peer credentials name it: this process, or the one a
// previous gateway took them from).
func (a *Attachment) handDownFDs(dup func(net.Conn) (int, error)) (fds []int, maker int, err error) {
	fail := func(err error) ([]int, int, error) {
		closeFDs(fds) // not one left open for an image that does not know it
		return nil, 0, err
	}
	for _, c := range a.connections() {
		select {
		case <-c.ended:
			// The kernel closed it. The next image, given fewer sockets than connections,
			// closes the others too and gives the device new sockets for all of them
			// (NBD_CMD_RECONFIGURE replaces dead connections only): their requests then wait
			// for the kernel's timer, as before the hand-down existed.
			continue
		default:
		}
		fd, err := dup(c.nc)
		if err != nil {
			return fail(err)
		}
		fds = append(fds, fd)
		cred, err := unix.GetsockoptUcred(fd, unix.SOL_SOCKET, unix.SO_PEERCRED)
		switch {
		case err != nil:
			return fail(fmt.Errorf("peer credentials: %w", err))
		case maker != 0 && int(cred.Pid) != maker:
			return fail(fmt.Errorf("the sockets were made by processes %d and %d", maker, cred.Pid))
		}
		maker = int(cred.Pid)
	}
	if len(fds) == 0 {
		return fail(errors.New("no connection is left"))
	}
	return fds, maker, nil
}

func closeFDs(fds []int) {
	for _, fd := range fds {
		unix.Close(fd)
	}
}

// dupForExec duplicates nc's descriptor; dup(2) leaves close-on-exec clear on the copy.
func dupForExec(nc net.Conn) (int, error) {
	return dupConn(nc, func(fd int) (int, error) { return unix.Dup(fd) })
}

// dupCloexec duplicates nc's descriptor close-on-exec (a copy for a descriptor store must not
// leak into a child another goroutine starts meanwhile).
func dupCloexec(nc net.Conn) (int, error) {
	return dupConn(nc, func(fd int) (int, error) { return unix.FcntlInt(uintptr(fd), unix.F_DUPFD_CLOEXEC, 3) })
}

func dupConn(nc net.Conn, dup func(int) (int, error)) (int, error) {
	sc, ok := nc.(syscall.Conn)
	if !ok {
		return -1, errors.New("the connection has no descriptor")
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return -1, err
	}
	fd := -1
	var dupErr error
	if err := rc.Control(func(s uintptr) { fd, dupErr = dup(int(s)) }); err != nil {
		return -1, err
	}
	return fd, dupErr
}

// takeHandedDown takes the device's sockets a previous gateway handed down: across the exec of a
// planned restart (InheritedSocketsEnv), or through a supervisor's descriptor store after a
// stop --keep (opts.Stored). It returns nil when there are none it can serve, having closed
// ours among them; from says which way they came.
func takeHandedDown(index int, opts AttachOptions, log *zap.Logger) (conns []net.Conn, from string) {
	if conns := inheritedSockets(index, opts.Connections, log); conns != nil {
		closeStored(opts.Stored, log)
		return conns, "exec"
	}
	if conns := storedSockets(opts.Stored, opts.Connections, log); conns != nil {
		return conns, "descriptor store"
	}
	return nil, ""
}

// closeStored closes the descriptors a store passed that are not served (log: nil when they
// need no word).
func closeStored(files []*os.File, log *zap.Logger) {
	for _, f := range files {
		f.Close()
	}
	if len(files) > 0 && log != nil {
		log.Warn("closed the sockets the previous gateway left in the descriptor store: not used", zap.Int("sockets", len(files)))
	}
}

// inheritedSockets takes the sockets a previous image of this process handed down for device
// index (InheritedSocketsEnv), and unsets the entry either way. It returns nil when there are
// none, or when they are not n unix stream sockets made by the process the entry names (this
// one when it names none; a socket pair's peer credentials name the process that made it, which
// an exec keeps) for this device: a stranger's descriptors are never served or closed, ours are
// closed so that the kernel sees those connections die and takes the new sockets the caller
// then gives it.
func inheritedSockets(index, n int, log *zap.Logger) []net.Conn {
	v, ok := os.LookupEnv(InheritedSocketsEnv)
	if !ok {
		return nil
	}
	os.Unsetenv(InheritedSocketsEnv)
	dev, fds, maker, err := parseInherited(v)
	var ours []int
	for _, fd := range fds {
		if cerr := checkInherited(fd, maker); cerr != nil {
			err = errors.Join(err, cerr)
		} else {
			ours = append(ours, fd)
		}
	}
	if err == nil && dev != index {
		err = fmt.Errorf("they are for /dev/nbd%d, not /dev/nbd%d", dev, index)
	}
	conns, err := serveSockets(ours, n, err)
	if err != nil {
		log.Warn("not using the sockets the previous image handed down: the device gets new ones",
			zap.String("handed_down", v), zap.Error(err))
		return nil
	}
	return conns
}

// storedSockets takes the sockets a previous server process left in a supervisor's descriptor
// store for this device (AttachOptions.Stored: the caller picked them by StoredSocketsName, the
// store holds only what this service's own main process put there). It closes every file, and
// returns nil unless they are n unix stream sockets the kernel still keeps: the caller then
// gives the device new sockets, which it takes once the store's copies are gone too.
func storedSockets(files []*os.File, n int, log *zap.Logger) []net.Conn {
	if len(files) == 0 {
		return nil
	}
	var fds []int
	var err error
	for _, f := range files {
		fd, derr := unix.FcntlInt(f.Fd(), unix.F_DUPFD_CLOEXEC, 3)
		f.Close()
		if derr != nil {
			err = errors.Join(err, fmt.Errorf("%s: %w", f.Name(), derr))
			continue
		}
		fds = append(fds, fd)
		if serr := checkStream(fd); serr != nil {
			err = errors.Join(err, serr)
		}
	}
	conns, err := serveSockets(fds, n, err)
	if err != nil {
		log.Warn("not using the sockets the previous gateway left in the descriptor store: the device gets new ones", zap.Error(err))
		return nil
	}
	return conns
}

// serveSockets makes connections of fds, n unix stream sockets of this device's that passed the
// caller's checks (err nil), unless one was shut down by the kernel meanwhile. It closes every
// descriptor in fds either way; on an error it shuts them down first, so that the kernel sees
// those connections die (Reattach's reconnect then gives it new ones).
func serveSockets(fds []int, n int, err error) ([]net.Conn, error) {
	switch {
	case err != nil:
	case len(fds) != n:
		err = fmt.Errorf("%d sockets for %d connections", len(fds), n)
	default:
		err = checkKernelKept(fds)
	}
	var conns []net.Conn
	for _, fd := range fds {
		if err != nil {
			// End the stream for every holder (a descriptor store's copy may outlive ours
			// for a moment): the kernel sees the connection die at once.
			_ = unix.Shutdown(fd, unix.SHUT_RDWR)
		}
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
		return nil, err
	}
	return conns, nil
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
	_, fds, maker, _ := parseInherited(v)
	for _, fd := range fds {
		if checkInherited(fd, maker) == nil {
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

// parseInherited parses "INDEX:FD,FD,...:MAKER" (MAKER, the process that made the sockets, is
// this one when the entry does not name it). It returns every well-formed descriptor even when
// something else is malformed, so that the caller can close ours among them.
func parseInherited(v string) (index int, fds []int, maker int, err error) {
	dev, rest, ok := strings.Cut(v, ":")
	if index, err = strconv.Atoi(dev); !ok || err != nil || index < 0 {
		index, err = -1, fmt.Errorf("malformed device index in %q", v)
	}
	list, makerField, named := strings.Cut(rest, ":")
	maker = os.Getpid()
	if named {
		if m, merr := strconv.Atoi(makerField); merr != nil || m <= 0 {
			err = errors.Join(err, fmt.Errorf("malformed process %q", makerField))
		} else {
			maker = m
		}
	}
	for _, f := range strings.Split(list, ",") {
		fd, ferr := strconv.Atoi(f)
		if ferr != nil || fd < 3 {
			err = errors.Join(err, fmt.Errorf("malformed descriptor %q", f))
			continue
		}
		fds = append(fds, fd)
	}
	return index, fds, maker, err
}

// checkInherited requires fd to be a unix stream socket made by process maker.
func checkInherited(fd, maker int) error {
	if err := checkStream(fd); err != nil {
		return err
	}
	cred, err := unix.GetsockoptUcred(fd, unix.SOL_SOCKET, unix.SO_PEERCRED)
	if err != nil {
		return fmt.Errorf("descriptor %d: %w", fd, err)
	}
	if int(cred.Pid) != maker {
		return fmt.Errorf("descriptor %d's peer is process %d, not %d", fd, cred.Pid, maker)
	}
	return nil
}

// checkStream requires fd to be a unix stream socket.
func checkStream(fd int) error {
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
	return nil
}
