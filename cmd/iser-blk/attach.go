package main

// attach: bind the target to a kernel block device — /dev/nbdX through the kernel's nbd driver
// (generic netlink, several sockets; frontend/nbd) or /dev/ublkbN (--ublk, attach_ublk.go) — and
// serve it until SIGINT/SIGTERM. Shutdown: detach the kernel device (the kernel sends DISC on each
// socket; in-flight requests drain), flush the device, close it (log out). Exit 0. The lifecycle
// (naming, takeover, the stop signal, the shutdown) is internal/gateway's Attachment; this file
// turns flags into its options and its errors into exit codes.

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	"go.uber.org/zap"

	"github.com/iser-blk/iser-blk/backend/iser"
	"github.com/iser-blk/iser-blk/frontend/nbd"
	"github.com/iser-blk/iser-blk/frontend/ublk"
	"github.com/iser-blk/iser-blk/internal/cli"
	"github.com/iser-blk/iser-blk/internal/gateway"
	"github.com/iser-blk/iser-blk/internal/logging"
	"github.com/iser-blk/iser-blk/internal/modes"
	"github.com/iser-blk/iser-blk/internal/sdnotify"
	"github.com/iser-blk/iser-blk/internal/statefile"
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
	fs.DurationVar(&af.timeout, "timeout", 0, "nbd: kernel per-request timeout (0: none set, the backend's own timeout fails stuck I/O; with more than one connection the kernel still closes a connection whose request outlives 30 s, see docs/reliability.md)")
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
	fs.BoolVar(&af.uo.NoRingPath, "ublk-workers-only", false, "ublk: serve every request on a worker goroutine, never on the queue's ring thread (for A/B measurements)")
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
	// The first SIGINT or SIGTERM (signals) stops the serving context through StopOnSignal,
	// which lets a hand-over in progress give up first.
	signals := ctx
	ctx, stop := context.WithCancel(context.WithoutCancel(signals))
	defer stop()
	counters := new(status.IOCounters)
	at := gateway.NewAttachment(gateway.AttachOptions{
		Start: func(name, path string) (*gateway.Gateway, error) {
			return startGateway(sf, identity(name, af.kind(), path, ef), counters, stop, log)
		},
		StopFrontend: stop,
		Log:          log,
		Announce:     func(path string) { fmt.Println(path) },
	})
	go at.StopOnSignal(signals, ctx.Done())
	// A name known before the device exists is claimed before logging in: a second gateway by
	// that name costs no session. Otherwise the kernel's device name is the gateway's.
	if name := af.earlyName(sf); name != "" {
		if err := at.Name(name); err != nil {
			return fail("attach", err)
		}
	}
	dev, p, err := openStack(ctx, tf, ef, log)
	if err != nil {
		at.Abandon()
		return fail("attach", err)
	}
	defer p.Close()
	at.Opened(dev)
	code := exitOK
	if err := prepareTakeover(at, sf, af.kind(), ef, log); err != nil {
		code = fail("attach", err) // a corrupt, foreign or other-kind state file: exit 7
	} else if af.useUblk {
		af.uo.Counters, af.uo.Logger = counters, log
		code = attachUblk(ctx, at, af.uo, p)
	} else {
		code = attachNBD(ctx, at, af, ef, p, counters, log)
	}
	if err := at.Err(); err != nil {
		code = fail("attach", err)
	}
	return at.Shutdown(code)
}

// prepareTakeover reads attach --name's state file (gateway.Attachment.PrepareTakeover) with
// what the flags say of the device kind, the LUN's target and the cache; without --name there
// is none.
func prepareTakeover(at *gateway.Attachment, sf *serviceFlags, kind modes.Frontend, ef *exportFlags, log *zap.Logger) error {
	if sf.name == "" {
		return nil
	}
	mode, _ := modes.ParseCache(ef.cache.Mode) // a bad --cache stops openStack before anything serves
	cacheDev, err := ef.cache.dev.absPath()
	if err != nil {
		return err
	}
	return at.PrepareTakeover(takeover.Options{Kind: kind, CacheMode: mode, CacheDev: cacheDev, Log: log,
		LUN: statefile.Identity{Target: iser.RedactURL(ef.target)}, FDStore: sdnotify.FDStore{}})
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

// attachNBD serves the device through the kernel's nbd driver (gateway.Attachment.ServeNBD)
// and returns the exit code so far; the caller flushes and closes the device.
func attachNBD(ctx context.Context, at *gateway.Attachment, af *attachFlags, ef *exportFlags, p *pool.Pool, counters *status.IOCounters, log *zap.Logger) int {
	nbdDev := af.nbdDev
	if nbdDev == "auto" {
		nbdDev = ""
	}
	err := at.ServeNBD(ctx, gateway.NBDOptions{
		NewServer: ef.nbdExport(p, counters, log).Server,
		Attach: nbd.AttachOptions{
			Device:          nbdDev,
			Connections:     af.connections,
			Timeout:         af.timeout,
			DeadConnTimeout: af.deadConnTimeout,
			ForceIoctl:      af.forceIoctl,
			Logger:          log,
		},
		QueueDepth: ef.maxInflight,
	})
	switch {
	case err == nil:
		return exitOK
	case errors.Is(err, gateway.ErrServing): // logged
		return exitFailure
	}
	return fail("attach", err)
}
