package gateway

// The attach side of a gateway: the kernel device (NBD or ublk) and the gateway that manages it,
// which may be named only once the kernel has named the device.

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"sync"

	"go.uber.org/zap"

	"github.com/iser-blk/iser-blk/block"
	"github.com/iser-blk/iser-blk/frontend/nbd"
	"github.com/iser-blk/iser-blk/frontend/ublk"
	"github.com/iser-blk/iser-blk/internal/status"
	"github.com/iser-blk/iser-blk/internal/takeover"
)

// ErrServing marks an NBD attachment whose serving loop failed once the device existed (the
// failure is logged where it happened).
var ErrServing = errors.New("serving the nbd device failed")

// AttachOptions configure NewAttachment.
type AttachOptions struct {
	// Start claims name and starts the gateway (Start with the command's options). path is the
	// kernel device's path, "" when the gateway is named before the device exists.
	Start func(name, path string) (*Gateway, error)
	// StopFrontend ends the context the frontend serves under: a stop signal before the gateway
	// exists, and a gateway that cannot start once the device exists, call it (the gateway's own
	// Options.StopFrontend should be the same function).
	StopFrontend context.CancelFunc
	Log          *zap.Logger
	// Announce tells the user the device path once the device accepts I/O (nil: nothing).
	Announce func(path string)
}

// Attachment is one attach's device and the gateway that manages it, which exists once its name
// is known: before login when the name is given, else when the kernel names the device.
//
// Lock order: Attachment.mu is a leaf; it is never held while the Gateway is called.
type Attachment struct {
	opts AttachOptions

	// dev, tk are set by the command's goroutine before the frontend starts.
	dev block.Device
	tk  *takeover.Takeover // attach --name's takeover (nil without --name)

	// mu guards g, signalled and failed, which the announce (a frontend goroutine) and
	// StopOnSignal's goroutine share: a signal either finds the gateway (and stops it through it)
	// or the gateway, named after the signal, is stopped at once, so a hand-over can never start
	// after a stop signal.
	mu        sync.Mutex
	g         *Gateway // nil until named
	signalled bool
	failed    error // the gateway could not start once the device existed
}

// NewAttachment is an attachment without a gateway or device yet.
func NewAttachment(opts AttachOptions) *Attachment {
	if opts.Log == nil {
		opts.Log = zap.NewNop()
	}
	if opts.StopFrontend == nil {
		opts.StopFrontend = func() {}
	}
	if opts.Announce == nil {
		opts.Announce = func(string) {}
	}
	return &Attachment{opts: opts}
}

// Name starts the gateway under a name known before the device exists (--name, or nbdN for
// --nbd /dev/nbdN): a second gateway by that name costs no session.
func (a *Attachment) Name(name string) error {
	g, err := a.opts.Start(name, "")
	if err != nil {
		return err
	}
	a.setGateway(g)
	return nil
}

// Gateway is the attachment's gateway, nil until it is named.
func (a *Attachment) Gateway() *Gateway {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.g
}

// setGateway names the attachment's gateway; one named after a stop signal stops at once.
func (a *Attachment) setGateway(g *Gateway) {
	a.mu.Lock()
	a.g = g
	signalled := a.signalled
	a.mu.Unlock()
	if signalled {
		g.StopForSignal()
	}
}

// StopOnSignal waits for the first SIGINT or SIGTERM (signals ends) and stops the attach:
// through the gateway once there is one (a hand-over in progress gives up first, a committed
// one is left alone), else at once. It returns when done closes (the attach ended).
func (a *Attachment) StopOnSignal(signals context.Context, done <-chan struct{}) {
	select {
	case <-signals.Done():
	case <-done:
		return
	}
	a.mu.Lock()
	a.signalled = true
	g := a.g
	a.mu.Unlock()
	if g != nil {
		g.StopForSignal()
		return
	}
	a.opts.StopFrontend()
}

// Opened hands the attachment the device stack the command opened.
func (a *Attachment) Opened(dev block.Device) { a.dev = dev }

// Abandon gives the name up when the attach fails before it opened the stack.
func (a *Attachment) Abandon() {
	if g := a.Gateway(); g != nil {
		g.Abandon()
	}
}

// TakeOver sets attach --name's takeover (nil without --name) and, when it found a device a
// previous gateway left, moves the lifecycle to recovering (status says so until the device is
// announced, or the attach fails).
func (a *Attachment) TakeOver(tk *takeover.Takeover) {
	a.tk = tk
	g := a.Gateway()
	if g == nil || tk == nil {
		return
	}
	if prev := tk.Previous(); prev != nil {
		g.Recovering(fmt.Sprintf("taking over the %s device a previous gateway (pid %d) left", prev.Kind, prev.PID))
	}
}

// PrepareTakeover reads the state file attach --name's predecessor left (takeover.Prepare) and
// sets the takeover (TakeOver). It needs the gateway named before login and the device the
// command opened (Opened): the run directory and the name are the gateway's claim, and the LUN's
// size and block size the device's; opts gives the rest (the target, redacted; the cache).
//
// The LUN's VPD 0x83 name (statefile.Identity.DeviceID) is left empty: tgtd derives it from the
// target id and LUN number, so it would refuse a legitimate successor when targets come back in
// another order and still not tell two LUNs behind one IQN and number apart.
func (a *Attachment) PrepareTakeover(opts takeover.Options) error {
	g := a.Gateway()
	if g == nil || a.dev == nil {
		return errors.New("gateway: a takeover needs the gateway named before login and the device opened")
	}
	opts.Dir, opts.Name = g.svc.Claim()
	opts.LUN.Size, opts.LUN.BlockSize = a.dev.Size(), a.dev.BlockSize()
	if opts.Log == nil {
		opts.Log = a.opts.Log
	}
	tk, err := takeover.Prepare(opts)
	if err != nil {
		return err
	}
	a.TakeOver(tk)
	return nil
}

// Announced is the frontend's news that the device accepts I/O at path: it tells the user,
// names the gateway after the device if no name was given, and moves the lifecycle to ready
// (sd_notify READY=1). A gateway that cannot start stops the frontend (a device nobody can
// manage is not served); Err reports why.
func (a *Attachment) Announced(path string, fe status.Frontend) {
	a.opts.Announce(path)
	g := a.Gateway()
	if g == nil {
		var err error
		if g, err = a.opts.Start(filepath.Base(path), path); err != nil {
			a.mu.Lock()
			a.failed = err
			a.mu.Unlock()
			a.opts.StopFrontend()
			return
		}
		a.setGateway(g)
	}
	g.Serving(a.dev, path, fe)
	g.Ready()
	if a.tk != nil {
		g.CanHandOver(a.tk)                       // false after a stop signal: the gateway is stopping already
		if why := a.tk.FenceReason(); why != "" { // status shows why every I/O fails
			g.Fenced(why)
		}
	}
}

// Err is why the gateway could not start once the device existed (nil: it did, or was named
// before).
func (a *Attachment) Err() error {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.failed
}

// Shutdown flushes and closes the device, through the gateway's lifecycle when there is one.
// code is the exit code so far; the result is the process's.
func (a *Attachment) Shutdown(code int) int {
	g := a.Gateway()
	if g == nil {
		if c := CloseDevice(a.dev, a.opts.Log, nil); code == ExitOK {
			code = c
		}
		return code
	}
	// A gateway named before login (--name, --nbd /dev/nbdN) learns its device only when the
	// kernel device is announced; a failure before that (takeover refused, nbd busy or absent,
	// ublk ADD_DEV) must still flush and close — and log out of — the device the command opened.
	g.Adopt(a.dev)
	var flushed func()
	if a.tk != nil {
		flushed = a.tk.RecordFlushed
	}
	return g.Shutdown(code, flushed)
}

// served is what the frontend serves: the stack, behind attach --name's gate (and fence).
func (a *Attachment) served() block.Device {
	if a.tk == nil {
		return a.dev
	}
	return a.tk.Serving(a.dev)
}

// NBDOptions are how ServeNBD builds and attaches the kernel's NBD device.
type NBDOptions struct {
	// NewServer builds the NBD server for the served device. It is called again when a fenced
	// device a predecessor left is gone: the new device is served unfenced.
	NewServer func(dev block.Device) (*nbd.Server, error)
	Attach    nbd.AttachOptions
	// QueueDepth is what status shows as the requests in flight per connection.
	QueueDepth int
}

// ServeNBD serves the device through the kernel's nbd driver until ctx ends (a stop signal, a
// detach) or the kernel drops every connection, then detaches the kernel device and drains.
// With attach --name it takes over the device a previous gateway by that name left. It neither
// flushes nor closes the device (Shutdown does). Errors: NewServer's, nbd.ErrNoKernelNBD, the
// takeover's (takeover.ErrNoResume), or ErrServing.
func (a *Attachment) ServeNBD(ctx context.Context, o NBDOptions) error {
	srv, err := o.NewServer(a.served())
	if err != nil {
		return err
	}
	opts := o.Attach
	if opts.Connections > 1 && srv.Flags()&nbd.FlagCanMultiConn == 0 {
		a.opts.Log.Warn("the device does not support multi-conn; using one connection")
		opts.Connections = 1
	}
	att, err := a.attachNBD(srv, opts)
	if errors.Is(err, takeover.ErrUnfenced) {
		takeover.AbandonServer(srv)
		if srv, err = o.NewServer(a.served()); err != nil {
			return err
		}
		att, err = a.attachNBD(srv, opts)
	}
	if err != nil {
		return err
	}
	a.Announced(att.Path(), status.Frontend{Kind: "nbd", Queues: opts.Connections, QueueDepth: o.QueueDepth})
	if err := att.ServeUntil(ctx); err != nil { // logged
		return fmt.Errorf("%w: %w", ErrServing, err)
	}
	if a.tk != nil {
		a.tk.Forget()
	}
	return nil
}

// attachNBD is nbd.Attach, through the takeover with --name.
func (a *Attachment) attachNBD(srv *nbd.Server, opts nbd.AttachOptions) (*nbd.Attachment, error) {
	if a.tk == nil {
		return nbd.Attach(srv, opts)
	}
	return a.tk.AttachNBD(takeover.KernelNBD, srv, opts)
}

// RunUblk serves the device as /dev/ublkbN (uopts: the frontend's options, MaxIO already
// fitted to the pool) until ctx ends (a stop signal, a detach), through attach --name's
// takeover; then it stops the disk (in-flight requests drain) and deletes the device. It
// neither flushes nor closes the device (Shutdown does).
func (a *Attachment) RunUblk(ctx context.Context, uopts ublk.Options) error {
	q, d := uopts.Queues, uopts.Depth
	if q <= 0 {
		q = ublk.DefaultQueues()
	}
	if d <= 0 {
		d = ublk.DefaultDepth
	}
	announce := func(path string) { a.Announced(path, status.Frontend{Kind: "ublk", Queues: q, QueueDepth: d}) }
	if a.tk == nil {
		return ublk.Run(ctx, a.dev, uopts, announce)
	}
	return a.tk.RunUblk(ctx, takeover.KernelUblk, a.dev, uopts, announce)
}
