package nbd

// Reattach: a kernel nbd device configured through netlink outlives the process that served it.
// When that process dies its sockets close, the kernel marks every connection dead and queues the
// device's I/O for up to the dead-connection timeout (NBD_ATTR_DEAD_CONN_TIMEOUT); requests that
// were in flight are requeued when their request timeout fires. A successor gives the device new
// sockets with NBD_CMD_RECONFIGURE (include/uapi/linux/nbd-netlink.h), which the kernel accepts
// only for a configured device whose backend identifier matches and only in place of dead
// connections.

import (
	"errors"
	"fmt"
	"net"
	"os"
	"strings"
	"syscall"
	"time"

	"go.uber.org/zap"
)

// Errors of Reattach.
var (
	// ErrNoDevice: the device is not configured (its backend file is absent).
	ErrNoDevice = errors.New("nbd: the device is not configured")
	// ErrNotWaiting: the device serves another backend, or its connections are alive.
	ErrNotWaiting = errors.New("nbd: the device is not waiting for this gateway")
)

// backendID is the identifier the device is configured with.
func backendID(srv *Server, opts AttachOptions) string {
	if opts.BackendID != "" {
		return opts.BackendID
	}
	return "iser-blk:" + srv.opts.ExportName
}

// Reattach gives opts.Device, whose server died, fresh connections to srv: the same checks and
// socket handling as Attach, NBD_CMD_RECONFIGURE in place of NBD_CMD_CONNECT. After a planned
// restart it serves the connections the previous image handed down instead (handover_linux.go).
func Reattach(srv *Server, opts AttachOptions) (*Attachment, error) {
	defer closeStored(opts.Stored, nil) // those takeHandedDown did not take (a second Close is a no-op)
	opts, err := checkAttachOptions(srv, opts)
	if err != nil {
		return nil, err
	}
	index, err := parseDeviceIndex(opts.Device)
	if err != nil || index < 0 {
		return nil, fmt.Errorf("nbd: reattach needs a device node (%q): %v", opts.Device, err)
	}
	if err := checkBackend(index, backendID(srv, opts)); err != nil {
		return nil, err
	}
	a := &Attachment{srv: srv, index: index, viaNetlink: true, log: opts.Logger, done: make(chan struct{})}
	if locals, from := takeHandedDown(index, opts, a.log); locals != nil {
		// A planned restart or a stop --keep under systemd kept the connections
		// (handover_linux.go): the kernel never saw them die, and what it sent meanwhile
		// waits in them.
		a.serveHeld(locals)
		a.log.Info("nbd device reattached: the previous gateway's connections go on", zap.String("device", a.Path()),
			zap.Int("connections", opts.Connections), zap.String("handed_down_by", from))
		return a, nil
	}
	if err := a.reconnect(opts.Connections, func(remotes []*os.File) error { return netlinkReconfigure(srv, index, remotes, opts) }); err != nil {
		return nil, err
	}
	a.log.Info("nbd device reattached: the kernel has new connections", zap.String("device", a.Path()), zap.Int("connections", opts.Connections))
	return a, nil
}

// checkBackend reads /sys/block/nbdN/backend, which exists while the device is configured.
func checkBackend(index int, want string) error {
	b, err := os.ReadFile(fmt.Sprintf("/sys/block/nbd%d/backend", index))
	if errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("%w: /dev/nbd%d", ErrNoDevice, index)
	}
	if err != nil {
		return fmt.Errorf("nbd: %w", err)
	}
	if got := strings.TrimSpace(string(b)); got != want {
		return fmt.Errorf("%w: /dev/nbd%d serves %q, not %q", ErrNotWaiting, index, got, want)
	}
	return nil
}

// reconnectFor bounds reconnect's rounds (a variable for tests).
var reconnectFor = 5 * time.Second

// reconnect gives the kernel n new sockets in place of the device's dead connections, and serves
// those it took. NBD_CMD_RECONFIGURE places a socket only while a connection is dead, and a
// kernel that finds none answers success without taking it (drivers/block/nbd.c:
// nbd_genl_reconfigure turns nbd_reconnect_socket's -ENOSPC into 0; some kernels return
// ENOSPC). A connection is dead only once the kernel's receive worker saw its socket end, which
// can come a moment after the last copy of the predecessor's end closed (and systemd's copy in
// its descriptor store goes when systemd reads our FDSTOREREMOVE=1). So each round hands the
// kernel the sockets still to place and tells from our ends which it took: the kernel holds a
// reference to the ones it took; one it did not is gone as soon as our copy of its end is
// closed, and our end then reads end of stream at once (no waiting involved). Rounds repeat,
// 50 ms apart, for up to 5 s.
func (a *Attachment) reconnect(n int, reconfigure func(remotes []*os.File) error) error {
	deadline := time.Now().Add(reconnectFor)
	var taken []net.Conn
	fail := func(err error) error {
		closeConns(taken)
		return err
	}
	for {
		locals, remotes, err := socketPairs(n - len(taken))
		if err != nil {
			return fail(err)
		}
		err = reconfigure(remotes)
		for _, f := range remotes {
			f.Close()
		}
		if err != nil {
			closeConns(locals)
			return fail(err)
		}
		for _, c := range locals {
			if kernelHolds(c) {
				taken = append(taken, c)
			} else {
				c.Close()
			}
		}
		if len(taken) == n {
			break
		}
		if time.Now().After(deadline) {
			return fail(fmt.Errorf("%w: /dev/nbd%d took %d of %d sockets: it has no dead connection to replace (is another gateway serving it?)", ErrNotWaiting, a.index, len(taken), n))
		}
		time.Sleep(50 * time.Millisecond)
	}
	a.serveHeld(taken)
	return nil
}

// serveHeld serves connections whose other ends the kernel already holds. Unlike start, which
// must serve before NBD_CMD_CONNECT returns, nothing here waits on our ends: what the kernel sends
// meanwhile waits in the sockets.
func (a *Attachment) serveHeld(locals []net.Conn) {
	a.serve(locals)
	a.connected.Store(true)
}

// kernelHolds reports whether the other end of c's socket pair is still open: the kernel took it.
func kernelHolds(c net.Conn) bool {
	sc, ok := c.(syscall.Conn)
	if !ok {
		return false
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return false
	}
	held := false
	_ = rc.Control(func(fd uintptr) { held = checkKernelKept([]int{int(fd)}) == nil })
	return held
}

func closeConns(cs []net.Conn) {
	for _, c := range cs {
		c.Close()
	}
}

// netlinkReconfigure sends NBD_CMD_RECONFIGURE with the kernel's ends of the socket pairs (see
// reconnect for which it takes). ENOSPC, no dead connection on kernels that say so, is not an
// error here: reconnect finds those sockets not taken.
func netlinkReconfigure(srv *Server, index int, remotes []*os.File, opts AttachOptions) error {
	g, fam, err := openNBDFamily()
	if err != nil {
		return err
	}
	defer g.close()
	fds := make([]int, len(remotes))
	for i, f := range remotes {
		fds[i] = int(f.Fd())
	}
	e := reconfigureAttrs(srv, index, fds, opts)
	_, err = g.request(fam, nbdCmdReconfigure, nbdGenlVersion, e.b)
	switch {
	case err == nil, errors.Is(err, syscall.ENOSPC):
		return nil
	case errors.Is(err, syscall.EINVAL):
		return fmt.Errorf("%w: the kernel refused NBD_CMD_RECONFIGURE for /dev/nbd%d (not configured, or another backend)", ErrNotWaiting, index)
	default:
		return fmt.Errorf("nbd: NBD_CMD_RECONFIGURE: %w", err)
	}
}

// reconfigureAttrs builds the NBD_CMD_RECONFIGURE attributes: the device and what a connect
// gives a connection, so that a reattached device keeps the timeouts it was attached with.
func reconfigureAttrs(srv *Server, index int, fds []int, opts AttachOptions) attrEncoder {
	var e attrEncoder
	e.u32(nbdAttrIndex, uint32(index))
	connectionAttrs(&e, srv, fds, opts)
	return e
}

// openNBDFamily opens a generic netlink socket and resolves the nbd family's id.
func openNBDFamily() (*genlConn, uint16, error) {
	g, err := openGenl()
	if err != nil {
		return nil, 0, err
	}
	fam, err := g.familyID(nbdGenlName)
	if err != nil {
		g.close()
		return nil, 0, err
	}
	return g, fam, nil
}

// Reconfigurable reports whether a successor can give the device new sockets: only a device
// configured through netlink outlives the process serving it.
func (a *Attachment) Reconfigurable() bool { return a.viaNetlink }
