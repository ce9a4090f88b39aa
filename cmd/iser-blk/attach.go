package main

// attach: bind the target to a kernel block device — /dev/nbdX through the kernel's nbd driver
// (generic netlink, several sockets; frontend/nbd) or /dev/ublkbN (--ublk, attach_ublk.go) — and
// serve it until SIGINT/SIGTERM. Shutdown: detach the kernel device (the kernel sends DISC on each
// socket; in-flight requests drain), flush the device, close it (log out). Exit 0.

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"time"

	"go.uber.org/zap"

	"github.com/iser-blk/iser-blk/block"
	"github.com/iser-blk/iser-blk/frontend/nbd"
	"github.com/iser-blk/iser-blk/internal/statefile"
	"github.com/iser-blk/iser-blk/pool"
)

func init() {
	register(&command{name: "attach", summary: "attach the LUN as /dev/nbdX (or /dev/ublkbN with --ublk)", run: runAttach})
}

// attachFlags are attach's own flags: the kernel device and how it is driven.
type attachFlags struct {
	nbdDev          string
	connections     int
	timeout         time.Duration
	deadConnTimeout time.Duration
	forceIoctl      bool
	useUblk         bool
	uo              ublkOptions
	takeover        takeoverFlags
}

func (af *attachFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&af.nbdDev, "nbd", "", "nbd device node, e.g. /dev/nbd0 (\"auto\": the kernel picks a free one)")
	fs.IntVar(&af.connections, "connections", 4, "nbd: sockets between the kernel and the server")
	fs.DurationVar(&af.timeout, "timeout", 0, "nbd: kernel per-request timeout (0: none; the backend's own timeout fails stuck I/O)")
	fs.DurationVar(&af.deadConnTimeout, "dead-conn-timeout", 30*time.Second, "nbd: how long the kernel queues I/O while every connection is dead")
	fs.BoolVar(&af.forceIoctl, "nbd-ioctl", false, "nbd: configure with ioctls instead of netlink")
	fs.BoolVar(&af.useUblk, "ublk", false, "attach as a ublk device instead of nbd")
	fs.IntVar(&af.uo.Queues, "queues", 0, "ublk: hardware queues (0: CPUs, at most 4)")
	fs.IntVar(&af.uo.Depth, "depth", 0, "ublk: requests in flight per queue (0: 64)")
	fs.IntVar(&af.uo.MaxIO, "max-io", 0, "ublk: largest request in bytes (0: 512 KiB, capped by the device)")
	af.takeover.register(fs)
}

// check rejects contradictory flags before anything is opened.
func (af *attachFlags) check() error {
	if af.useUblk == (af.nbdDev != "") {
		return usagef("give exactly one of --nbd /dev/nbdN and --ublk")
	}
	if af.connections < 1 || af.connections > 64 {
		return usagef("--connections must be 1..64")
	}
	return nil
}

func runAttach(ctx context.Context, args []string) int {
	var tf targetFlags
	var ef exportFlags
	var af attachFlags
	fs := newFlagSet("attach", "--target URL (--nbd /dev/nbdN [--connections N] | --ublk) [flags]",
		"Attach the LUN as a kernel block device and serve it until SIGINT/SIGTERM. Prints the device\n"+
			"path on stdout once it exists. With --nbd the kernel's nbd driver gets N sockets\n"+
			"(generic netlink; the ioctl path is the fallback) and the write cache, FUA, discard and\n"+
			"write-zeroes capabilities of the LUN.")
	tf.register(fs, true)
	ef.register(fs)
	af.register(fs)
	if _, code, done := parseOrExit(fs, args, 0); done {
		return code
	}
	if err := af.check(); err != nil {
		return fail("attach", err)
	}
	log := newLogger(tf.debug)
	defer log.Sync() //nolint:errcheck

	dev, p, mem, err := openStack(ctx, &tf, &ef, log)
	if err != nil {
		return fail("attach", err)
	}
	defer p.Close()
	if af.useUblk {
		af.uo.Pool = p // registered for RDMA before the target was opened: tag buffers need no bounce
		if af.uo.Takeover, err = prepareTakeover(&af.takeover, statefile.KindUblk, ef.target, ef.cache.mode, dev, log); err != nil {
			closeDevice(dev, log)
			return failTakeover(err)
		}
		code := attachUblk(ctx, dev, af.uo, log)
		if c := closeDevice(dev, log); code == exitOK {
			code = c
		}
		return code
	}
	return attachNBD(ctx, dev, &ef, &af, p, mem, log)
}

// attachNBD serves dev through the kernel's nbd driver until ctx ends (SIGINT/SIGTERM) or the
// kernel drops every connection, then detaches, drains and closes dev (closeDevice). It returns
// the exit code.
func attachNBD(ctx context.Context, dev block.Device, ef *exportFlags, af *attachFlags, p *pool.Pool, mem int64, log *zap.Logger) int {
	tk, err := prepareTakeover(&af.takeover, statefile.KindNBD, ef.target, ef.cache.mode, dev, log)
	if err != nil {
		closeDevice(dev, log)
		return failTakeover(err)
	}
	srv, err := newExportServer(tk.serving(dev), ef, p, mem, log)
	if err != nil {
		dev.Close()
		return fail("attach", err)
	}
	connections := af.connections
	if connections > 1 && srv.Flags()&nbd.FlagCanMultiConn == 0 {
		log.Warn("the device does not support multi-conn; using one connection")
		connections = 1
	}
	nbdDev := af.nbdDev
	if nbdDev == "auto" {
		nbdDev = ""
	}
	a, err := attachOrReattach(srv, nbd.AttachOptions{
		Device:          nbdDev,
		Connections:     connections,
		Timeout:         af.timeout,
		DeadConnTimeout: af.deadConnTimeout,
		ForceIoctl:      af.forceIoctl,
		Logger:          log,
	}, tk)
	if err != nil {
		closeDevice(dev, log)
		if errors.Is(err, nbd.ErrNoKernelNBD) {
			fmt.Fprintf(os.Stderr, "iser-blk attach: %v\n", err)
			return exitNoKernel
		}
		return failTakeover(err)
	}
	fmt.Println(a.Path())
	code := waitAndDetach(ctx, a, srv, log)
	if code == exitOK {
		tk.forgetIfSet()
	}
	if c := closeDevice(dev, log); c != exitOK {
		code = c
	}
	return code
}

// waitAndDetach waits for ctx to end or for the kernel to drop every connection, then detaches
// the nbd device and lets the server's requests drain. It returns the exit code so far.
func waitAndDetach(ctx context.Context, a *nbd.Attachment, srv *nbd.Server, log *zap.Logger) int {
	code := exitOK
	select {
	case <-ctx.Done():
		log.Info("detaching", zap.String("device", a.Path()))
	case <-a.Done():
		log.Error("the kernel dropped every connection", zap.String("device", a.Path()))
		code = exitFailure
	}
	dctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	if err := a.Detach(dctx); err != nil {
		log.Error("detach failed", zap.Error(err))
		code = exitFailure
	}
	cancel()
	sctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	if err := srv.Shutdown(sctx); err != nil {
		log.Warn("connections cut before their requests finished", zap.Error(err))
	}
	cancel()
	return code
}
