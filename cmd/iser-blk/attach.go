package main

// attach: bind the target to a kernel block device — /dev/nbdX through the kernel's nbd driver
// (generic netlink, several sockets; frontend/nbd) or /dev/ublkbN (--ublk, attach_ublk.go) — and
// serve it until SIGINT/SIGTERM. Shutdown: detach the kernel device (the kernel sends DISC on each
// socket; in-flight requests drain), flush the device, close it (log out). Exit 0.

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	"go.uber.org/zap"

	"github.com/iser-blk/iser-blk/block"
	"github.com/iser-blk/iser-blk/frontend/nbd"
	"github.com/iser-blk/iser-blk/frontend/ublk"
	"github.com/iser-blk/iser-blk/internal/cli"
	"github.com/iser-blk/iser-blk/internal/gateway"
	"github.com/iser-blk/iser-blk/internal/logging"
	"github.com/iser-blk/iser-blk/internal/modes"
	"github.com/iser-blk/iser-blk/internal/status"
	"github.com/iser-blk/iser-blk/internal/takeover"
	"github.com/iser-blk/iser-blk/pool"
)

// attachFlags are attach's own flags: the kernel device and how it is driven.
type attachFlags struct {
	nbdDev          string
	connections     int
	timeout         time.Duration
	deadConnTimeout time.Duration
	forceIoctl      bool
	useUblk         bool
	ublkID          int          // --ublk-id (-1: the driver picks)
	uo              ublk.Options // --queues, --depth, --max-io, --ublk-id
}

// registerNBD adds the kernel NBD frontend's flags.
func (af *attachFlags) registerNBD(fs *pflag.FlagSet) {
	fs.StringVar(&af.nbdDev, "nbd", "", "nbd device node, e.g. /dev/nbd0 (\"auto\": the kernel picks a free one)")
	fs.IntVar(&af.connections, "connections", 4, "nbd: sockets between the kernel and the server")
	fs.DurationVar(&af.timeout, "timeout", 0, "nbd: kernel per-request timeout (0: none; the backend's own timeout fails stuck I/O)")
	fs.DurationVar(&af.deadConnTimeout, "dead-conn-timeout", 30*time.Second, "nbd: how long the kernel queues I/O while every connection is dead")
	fs.BoolVar(&af.forceIoctl, "nbd-ioctl", false, "nbd: configure with ioctls instead of netlink")
}

// registerUblk adds the ublk frontend's flags.
func (af *attachFlags) registerUblk(fs *pflag.FlagSet) {
	fs.BoolVar(&af.useUblk, "ublk", false, "attach as a ublk device instead of nbd")
	fs.IntVar(&af.uo.Queues, "queues", 0, "ublk: hardware queues (0: CPUs, at most 4)")
	fs.IntVar(&af.uo.Depth, "depth", 0, "ublk: requests in flight per queue (0: 64)")
	fs.IntVar(&af.uo.MaxIO, "max-io", 0, "ublk: largest request in bytes (0: 512 KiB, capped by the device)")
	fs.IntVar(&af.ublkID, "ublk-id", -1, "ublk: create /dev/ublkbN with this N (-1: the lowest free one)")
}

// check rejects contradictory flags before anything is opened.
func (af *attachFlags) check() error {
	if af.useUblk == (af.nbdDev != "") {
		return usagef("give exactly one of --nbd /dev/nbdN and --ublk")
	}
	if af.connections < 1 || af.connections > 64 {
		return usagef("--connections must be 1..64")
	}
	switch {
	case af.ublkID == -1:
	case !af.useUblk:
		return usagef("--ublk-id needs --ublk")
	case af.ublkID < 0 || af.ublkID > ublk.MaxID:
		return usagef("--ublk-id must be 0..%d (or -1: the driver picks)", ublk.MaxID)
	default:
		id := uint32(af.ublkID)
		af.uo.ID = &id
	}
	return nil
}

// newAttachCmd is `iser-blk attach`.
func newAttachCmd() *cobra.Command {
	var tf targetFlags
	var ef exportFlags
	var af attachFlags
	var sf serviceFlags
	cmd := cli.Leaf("attach --target URL (--nbd /dev/nbdN [--connections N] | --ublk) [flags]",
		"attach the LUN as /dev/nbdX (or /dev/ublkbN with --ublk)",
		"Attach the LUN as a kernel block device and serve it until SIGINT/SIGTERM or `iser-blk detach`.\n"+
			"Prints the device path on stdout once it exists. With --nbd the kernel's nbd driver gets N sockets\n"+
			"(generic netlink; the ioctl path is the fallback) and the write cache, FUA, discard and\n"+
			"write-zeroes capabilities of the LUN.", 0,
		func(cmd *cobra.Command, _ []string) int { return runAttach(cmd.Context(), &tf, &ef, &af, &sf) })
	cli.Group(cmd, groupTarget, func(fs *pflag.FlagSet) {
		ef.registerTarget(fs)
		tf.register(fs, true)
	})
	cli.Group(cmd, groupReliability, tf.registerReliability)
	cli.Group(cmd, groupNBD, af.registerNBD)
	cli.Group(cmd, groupUblk, af.registerUblk)
	cli.Group(cmd, groupExport, ef.registerExport)
	cli.Group(cmd, groupCache, ef.cache.register)
	cli.Group(cmd, groupService, func(fs *pflag.FlagSet) { sf.register(fs, "the device's base name, e.g. nbd0 or ublkb3") })
	tf.registerDebug(cmd.Flags())
	cli.Hide(cmd, "export-name") // the kernel asks for no export by name (it only names the nbd backend id)
	cli.CompleteFiles(cmd, "chap-secret-file", "target-secret-file", "nbd")
	cli.CompleteDirs(cmd, "run-dir")
	ef.cache.complete(cmd)
	return cmd
}

func runAttach(ctx context.Context, tf *targetFlags, ef *exportFlags, af *attachFlags, sf *serviceFlags) int {
	if err := af.check(); err != nil {
		return fail("attach", err)
	}
	if !af.useUblk { // before logging in: a host without nbd costs no session
		if err := nbd.LoadModule(); err != nil {
			fmt.Fprintf(os.Stderr, "iser-blk attach: %v\n", err)
			return exitNoKernel
		}
	}
	log := logging.Process(tf.debug)
	defer log.Sync() //nolint:errcheck
	// The first SIGINT or SIGTERM (signals) stops the serving context through stopOnSignal,
	// which lets a hand-over in progress give up first.
	signals := ctx
	ctx, stop := context.WithCancel(context.WithoutCancel(signals))
	defer stop()
	at := &attachment{sf: sf, ef: ef, af: af, stop: stop, log: log, counters: new(status.IOCounters)}
	go at.stopOnSignal(signals, ctx.Done())
	// A name known before the device exists is claimed before logging in: a second gateway by
	// that name costs no session. Otherwise the kernel's device name is the gateway's.
	if name := af.earlyName(sf); name != "" {
		var err error
		g, err := startGateway(sf, identity(name, af.kind(), "", ef), at.counters, stop, log)
		if err != nil {
			return fail("attach", err)
		}
		at.setGateway(g)
	}
	dev, p, mem, err := openStack(ctx, tf, ef, log)
	if err != nil {
		at.abandon()
		return fail("attach", err)
	}
	defer p.Close()
	at.dev = dev
	code := exitOK
	if af.useUblk {
		af.uo.Counters, af.uo.Logger = at.counters, log
		if tk, err := prepareTakeover(sf, modes.Ublk, ef.target, ef.cache.Mode, dev, log); err != nil {
			code = failTakeover(err)
		} else {
			at.tk = tk
			at.takingOver()
			code = attachUblk(ctx, dev, af.uo, p, tk, at.announceUblk)
		}
	} else {
		code = attachNBD(ctx, at, p, mem)
	}
	if at.failed != nil {
		code = fail("attach", at.failed)
	}
	return at.shutdown(code)
}

// attachment is one attach's device and gateway, which exists once the device's name is known.
type attachment struct {
	sf     *serviceFlags
	ef     *exportFlags
	af     *attachFlags
	stop   context.CancelFunc
	log    *zap.Logger
	dev    block.Device
	tk     *takeover.Takeover // attach --name's takeover (nil without --name)
	failed error              // the gateway could not start once the device existed
	// counters is the frontend's I/O counters, the gateway's once it is named.
	counters *status.IOCounters
	// mu guards g and signalled, which the announce and stopOnSignal's goroutine share: a
	// signal either finds the gateway (and stops it through it) or the gateway, named after
	// the signal, is stopped at once, so a hand-over can never start after a stop signal.
	mu        sync.Mutex
	g         *gateway.Gateway // nil until named
	signalled bool
}

func (at *attachment) gateway() *gateway.Gateway {
	at.mu.Lock()
	defer at.mu.Unlock()
	return at.g
}

// setGateway names the attachment's gateway; one named after a stop signal stops at once.
func (at *attachment) setGateway(g *gateway.Gateway) {
	at.mu.Lock()
	at.g = g
	signalled := at.signalled
	at.mu.Unlock()
	if signalled {
		g.StopForSignal()
	}
}

// earlyName is the gateway name known before the device exists: --name, or nbdN for --nbd
// /dev/nbdN; "" when the kernel picks the device (--ublk, --nbd auto).
func (af *attachFlags) earlyName(sf *serviceFlags) string {
	if sf.name != "" {
		return sf.name
	}
	if af.nbdDev != "" && af.nbdDev != "auto" {
		return filepath.Base(af.nbdDev)
	}
	return ""
}

func (af *attachFlags) kind() modes.Frontend {
	if af.useUblk {
		return modes.Ublk
	}
	return modes.NBD
}

// announced prints the device path once the device accepts I/O, names the gateway after it if
// no name was given, and moves the lifecycle to ready (sd_notify READY=1).
func (at *attachment) announced(path string, fe status.Frontend) {
	fmt.Println(path)
	g := at.gateway()
	if g == nil {
		var err error
		if g, err = startGateway(at.sf, identity(filepath.Base(path), at.af.kind(), path, at.ef), at.counters, at.stop, at.log); err != nil {
			at.failed = err
			at.stop() // the device is taken down again: a gateway nobody can manage is not served
			return
		}
		at.setGateway(g)
	}
	g.Serving(at.dev, path, fe)
	g.Ready()
	if at.tk != nil {
		g.CanHandOver(at.tk)                       // false after a stop signal: the gateway is stopping already
		if why := at.tk.FenceReason(); why != "" { // status shows why every I/O fails
			g.Fenced(why)
		}
	}
}

// takingOver moves the lifecycle to recovering while the device a previous gateway left is
// taken over (status says so until the device is announced, or the attach fails).
func (at *attachment) takingOver() {
	g := at.gateway()
	if g == nil || at.tk == nil {
		return
	}
	if prev := at.tk.Previous(); prev != nil {
		g.Recovering(fmt.Sprintf("taking over the %s device a previous gateway (pid %d) left", prev.Kind, prev.PID))
	}
}

// stopOnSignal waits for the first SIGINT or SIGTERM (signals ends) and stops the attach:
// through the gateway once there is one (a hand-over in progress gives up first, a committed
// one is left alone), else at once. It returns when done closes (the attach ended).
func (at *attachment) stopOnSignal(signals context.Context, done <-chan struct{}) {
	select {
	case <-signals.Done():
	case <-done:
		return
	}
	at.mu.Lock()
	at.signalled = true
	g := at.g
	at.mu.Unlock()
	if g != nil {
		g.StopForSignal()
		return
	}
	at.stop()
}

func (at *attachment) announceUblk(path string) {
	q, d := at.af.uo.Queues, at.af.uo.Depth
	if q <= 0 {
		q = ublk.DefaultQueues()
	}
	if d <= 0 {
		d = ublk.DefaultDepth
	}
	at.announced(path, status.Frontend{Kind: "ublk", Queues: q, QueueDepth: d})
}

// abandon gives the name up when attach fails before serving.
func (at *attachment) abandon() {
	if g := at.gateway(); g != nil {
		g.Abandon()
	}
}

// shutdown flushes and closes the device, through the gateway's lifecycle when there is one.
func (at *attachment) shutdown(code int) int {
	g := at.gateway()
	if g == nil {
		if c := gateway.CloseDevice(at.dev, at.log, nil); code == exitOK {
			code = c
		}
		return code
	}
	// A gateway named before login (--name, --nbd /dev/nbdN) learns its device only when the
	// kernel device is announced; a failure before that (takeover refused, nbd busy or absent,
	// ublk ADD_DEV) must still flush and close — and log out of — the device openStack opened.
	g.Adopt(at.dev)
	var flushed func()
	if at.tk != nil {
		flushed = at.tk.RecordFlushed
	}
	return g.Shutdown(code, flushed)
}

// attachNBD serves the device through the kernel's nbd driver until ctx ends (SIGINT/SIGTERM, a
// detach) or the kernel drops every connection, then detaches the kernel device and drains. With
// --name it takes over the device a previous gateway by that name left (takeover.go). It returns
// the exit code so far; the caller flushes and closes the device.
func attachNBD(ctx context.Context, at *attachment, p *pool.Pool, mem int64) int {
	log := at.log
	tk, err := prepareTakeover(at.sf, modes.NBD, at.ef.target, at.ef.cache.Mode, at.dev, log)
	if err != nil {
		return failTakeover(err)
	}
	at.tk = tk
	at.takingOver()
	srv, err := newExportServer(at.served(), at.ef, p, mem, at.counters, log)
	if err != nil {
		return fail("attach", err)
	}
	connections := at.af.connections
	if connections > 1 && srv.Flags()&nbd.FlagCanMultiConn == 0 {
		log.Warn("the device does not support multi-conn; using one connection")
		connections = 1
	}
	nbdDev := at.af.nbdDev
	if nbdDev == "auto" {
		nbdDev = ""
	}
	opts := nbd.AttachOptions{
		Device:          nbdDev,
		Connections:     connections,
		Timeout:         at.af.timeout,
		DeadConnTimeout: at.af.deadConnTimeout,
		ForceIoctl:      at.af.forceIoctl,
		Logger:          log,
	}
	a, err := at.attachOrReattach(srv, opts)
	if errors.Is(err, takeover.ErrUnfenced) {
		takeover.AbandonServer(srv)
		if srv, err = newExportServer(at.served(), at.ef, p, mem, at.counters, log); err != nil {
			return fail("attach", err)
		}
		a, err = at.attachOrReattach(srv, opts)
	}
	if err != nil {
		if errors.Is(err, nbd.ErrNoKernelNBD) {
			fmt.Fprintf(os.Stderr, "iser-blk attach: %v\n", err)
			return exitNoKernel
		}
		return failTakeover(err)
	}
	at.announced(a.Path(), status.Frontend{Kind: "nbd", Queues: connections, QueueDepth: at.ef.maxInflight})
	if err := a.ServeUntil(ctx); err != nil { // logged
		return exitFailure
	}
	if tk != nil {
		tk.Forget()
	}
	return exitOK
}

// served is what the frontend serves: the stack, behind attach --name's gate (and fence).
func (at *attachment) served() block.Device {
	if at.tk == nil {
		return at.dev
	}
	return at.tk.Serving(at.dev)
}

// attachOrReattach is nbd.Attach, through the takeover with --name.
func (at *attachment) attachOrReattach(srv *nbd.Server, opts nbd.AttachOptions) (*nbd.Attachment, error) {
	if at.tk == nil {
		return nbd.Attach(srv, opts)
	}
	return at.tk.AttachNBD(takeover.KernelNBD, srv, opts)
}
