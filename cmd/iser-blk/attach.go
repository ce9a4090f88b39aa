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
	"time"

	"go.uber.org/zap"

	"github.com/iser-blk/iser-blk/frontend/nbd"
)

func init() {
	register(&command{name: "attach", summary: "attach the LUN as /dev/nbdX (or /dev/ublkbN with --ublk)", run: runAttach})
}

func runAttach(ctx context.Context, args []string) int {
	var tf targetFlags
	var ef exportFlags
	var (
		nbdDev          string
		connections     int
		timeout         time.Duration
		deadConnTimeout time.Duration
		forceIoctl      bool
		useUblk         bool
		uo              ublkOptions
	)
	fs := newFlagSet("attach", "--target URL (--nbd /dev/nbdN [--connections N] | --ublk) [flags]",
		"Attach the LUN as a kernel block device and serve it until SIGINT/SIGTERM. Prints the device\n"+
			"path on stdout once it exists. With --nbd the kernel's nbd driver gets N sockets\n"+
			"(generic netlink; the ioctl path is the fallback) and the write cache, FUA, discard and\n"+
			"write-zeroes capabilities of the LUN.")
	tf.register(fs, true)
	ef.register(fs)
	fs.StringVar(&nbdDev, "nbd", "", "nbd device node, e.g. /dev/nbd0 (\"auto\": the kernel picks a free one)")
	fs.IntVar(&connections, "connections", 4, "nbd: sockets between the kernel and the server")
	fs.DurationVar(&timeout, "timeout", 0, "nbd: kernel per-request timeout (0: none; the backend's own timeout fails stuck I/O)")
	fs.DurationVar(&deadConnTimeout, "dead-conn-timeout", 30*time.Second, "nbd: how long the kernel queues I/O while every connection is dead")
	fs.BoolVar(&forceIoctl, "nbd-ioctl", false, "nbd: configure with ioctls instead of netlink")
	fs.BoolVar(&useUblk, "ublk", false, "attach as a ublk device instead of nbd")
	fs.IntVar(&uo.Queues, "queues", 0, "ublk: hardware queues (0: CPUs, at most 4)")
	fs.IntVar(&uo.Depth, "depth", 0, "ublk: requests in flight per queue (0: 64)")
	fs.IntVar(&uo.MaxIO, "max-io", 0, "ublk: largest request in bytes (0: 512 KiB, capped by the device)")
	if _, code, done := parseOrExit(fs, args, 0); done {
		return code
	}
	if useUblk == (nbdDev != "") {
		return fail("attach", usagef("give exactly one of --nbd /dev/nbdN and --ublk"))
	}
	if connections < 1 || connections > 64 {
		return fail("attach", usagef("--connections must be 1..64"))
	}
	log := newLogger(tf.debug)
	defer log.Sync() //nolint:errcheck

	dev, p, mem, err := openStack(ctx, &tf, &ef, log)
	if err != nil {
		return fail("attach", err)
	}
	defer p.Close()
	if useUblk {
		uo.Pool = p // registered for RDMA before the target was opened: tag buffers need no bounce
		code := attachUblk(ctx, dev, uo, log)
		if c := closeDevice(dev, log); code == exitOK {
			code = c
		}
		return code
	}

	srv, err := newExportServer(dev, &ef, p, mem, log)
	if err != nil {
		dev.Close()
		return fail("attach", err)
	}
	if connections > 1 && srv.Flags()&nbd.FlagCanMultiConn == 0 {
		log.Warn("the device does not support multi-conn; using one connection")
		connections = 1
	}
	if nbdDev == "auto" {
		nbdDev = ""
	}
	a, err := nbd.Attach(srv, nbd.AttachOptions{
		Device:          nbdDev,
		Connections:     connections,
		Timeout:         timeout,
		DeadConnTimeout: deadConnTimeout,
		ForceIoctl:      forceIoctl,
		Logger:          log,
	})
	if err != nil {
		closeDevice(dev, log)
		if errors.Is(err, nbd.ErrNoKernelNBD) {
			fmt.Fprintf(os.Stderr, "iser-blk attach: %v\n", err)
			return exitNoKernel
		}
		return fail("attach", err)
	}
	fmt.Println(a.Path())

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
	if c := closeDevice(dev, log); c != exitOK {
		code = c
	}
	return code
}
