package main

import (
	"context"
	"fmt"
	"time"

	"github.com/dustin/go-humanize"
	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/iser-blk/iser-blk/internal/cli"
	"github.com/iser-blk/iser-blk/internal/control"
)

// restart and stop --keep: the operator's side of a hand-over (internal/gateway), where the
// kernel device outlives the gateway process.

// restartTimeout is restart's default --timeout: long enough for a large write-back cache to
// drain to a slow target, short enough that a stuck one does not hang an ExecReload for ever.
const restartTimeout = 5 * time.Minute

// newRestartCmd is `iser-blk restart NAME`: it asks gateway NAME for a planned restart through
// its control socket (OpRestart). Exit 0 once the old image has written back every dirty byte,
// recorded a clean state and is re-executing; 1 when it refused, timed out or its write-back
// failed (it then keeps serving); 4 when no gateway has that name.
func newRestartCmd() *cobra.Command {
	var runDir string
	var opts control.RestartOptions
	cmd := cli.Leaf("restart NAME [--timeout D] [--run-dir DIR]",
		"planned restart of a running gateway: write back, re-exec, keep the device",
		"Restart the attach gateway NAME in place: it stops taking requests, finishes those in flight,\n"+
			"writes back every dirty byte held in RAM (progress is shown here; a --cache-dev log is kept, not\n"+
			"written back), records a clean state and re-executes\n"+
			"its binary from its path on disk with the same arguments and PID; the new image takes the\n"+
			"device over, which stays (same node, mounts stay). Installing a new binary and running\n"+
			"restart upgrades the gateway (systemd ExecReload may call it). Needs attach --name.", 1,
		func(cmd *cobra.Command, pos []string) int {
			ctx := cmd.Context()
			return handOver(ctx, "restart", runDir, pos[0], func(c *control.Client, progress func(control.Progress)) (control.DetachResult, error) {
				return c.Restart(ctx, opts, progress)
			}, "gateway %s (PID %d) is re-executing: %s dirty written back")
		})
	addRunDir(cmd, &runDir)
	cli.Group(cmd, groupService, func(fs *pflag.FlagSet) {
		fs.DurationVar(&opts.Timeout, "timeout", restartTimeout, "give up after this long, leaving the gateway serving (0: wait however long the write-back takes)")
	})
	return cmd
}

// newStopCmd is `iser-blk stop --keep NAME`: it asks gateway NAME to stop and keep its device
// (OpStop, keep). Exit 0 once it has written back every dirty byte, recorded a clean state and
// exited, the device waiting for a successor started with the same command (ublk: user
// recovery; NBD: within --dead-conn-timeout); 1 when it refused, timed out or its write-back
// failed (it then keeps serving); 2 without --keep; 4 when no gateway has that name.
func newStopCmd() *cobra.Command {
	var runDir string
	var keep bool
	var opts control.RestartOptions
	cmd := cli.Leaf("stop --keep NAME [--timeout D] [--run-dir DIR]",
		"stop a gateway and keep its device for a successor (--keep)",
		"Stop the attach gateway NAME and keep its kernel device: it stops taking requests, finishes\n"+
			"those in flight, writes back every dirty byte held in RAM (progress is shown here; a --cache-dev\n"+
			"log is kept for the successor, not written back), records a clean state\n"+
			"and exits 0. The device stays (same node, mounts stay, I/O waits) until the same attach command\n"+
			"is run again (ublk: within any time; nbd: within --dead-conn-timeout). To remove the device,\n"+
			"use detach. Needs attach --name. systemd's restart of iser-blk@NAME runs this.", 1,
		func(cmd *cobra.Command, pos []string) int {
			if !keep {
				return fail("stop", usagef("stop needs --keep; to stop a gateway and remove its device, run: iser-blk detach %s", pos[0]))
			}
			ctx := cmd.Context()
			return handOver(ctx, "stop", runDir, pos[0], func(c *control.Client, progress func(control.Progress)) (control.DetachResult, error) {
				return c.StopKeep(ctx, opts, progress)
			}, "gateway %s (PID %d) stopped, its device kept for a successor: %s dirty written back")
		})
	addRunDir(cmd, &runDir)
	cli.Group(cmd, groupService, func(fs *pflag.FlagSet) {
		fs.BoolVar(&keep, "keep", false, "keep the kernel device for a successor (required: stop without it is detach)")
		fs.DurationVar(&opts.Timeout, "timeout", restartTimeout, "give up after this long, leaving the gateway serving (0: wait however long the write-back takes)")
	})
	return cmd
}

// handOver runs a request that ends gateway name's process image (detach, restart, stop --keep;
// call sends it, with its progress shown on stderr) and prints what became of the gateway:
// report is a format of its name, PID and the bytes it wrote back.
func handOver(ctx context.Context, cmd, runDir, name string, call func(*control.Client, func(control.Progress)) (control.DetachResult, error), report string) int {
	c, err := control.Dial(ctx, control.RunDir(runDir), name)
	if err != nil {
		return manageFail(cmd, err)
	}
	res, err := call(c, printProgress)
	if err != nil {
		return manageFail(cmd, err)
	}
	fmt.Printf(report+"\n", c.Name, res.PID, humanize.IBytes(res.WrittenBackBytes))
	return exitOK
}
