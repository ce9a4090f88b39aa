package main

import (
	"context"
	"fmt"
	"time"

	"github.com/dustin/go-humanize"

	"github.com/iser-blk/iser-blk/internal/control"
)

func init() {
	register(&command{name: "restart", summary: "planned restart of a running gateway: write back, re-exec, keep the device", run: runRestart})
}

// restartTimeout is restart's default --timeout: long enough for a large write-back cache to
// drain to a slow target, short enough that a stuck one does not hang an ExecReload for ever.
const restartTimeout = 5 * time.Minute

// runRestart asks gateway NAME for a planned restart through its control socket (OpRestart).
// Exit 0 once the old image has written back every dirty byte, recorded a clean state and is
// re-executing; 1 when it refused, timed out or its write-back failed (it then keeps serving); 4
// when no gateway has that name.
func runRestart(ctx context.Context, args []string) int {
	var runDir string
	var opts control.RestartOptions
	fs := newFlagSet("restart", "NAME [--timeout D] [--run-dir DIR]",
		"Restart the attach gateway NAME in place: it stops taking requests, finishes those in flight,\n"+
			"writes back every dirty byte (progress is shown here), records a clean state and re-executes\n"+
			"its binary from its path on disk with the same arguments and PID; the new image takes the\n"+
			"device over, which stays (same node, mounts stay). Installing a new binary and running\n"+
			"restart upgrades the gateway (systemd ExecReload may call it). Needs attach --name.")
	registerRunDir(fs, &runDir)
	fs.DurationVar(&opts.Timeout, "timeout", restartTimeout, "give up after this long, leaving the gateway serving (0: wait however long the write-back takes)")
	pos, code, done := parseOrExit(fs, args, 1)
	if done {
		return code
	}
	c, err := control.Dial(ctx, control.RunDir(runDir), pos[0])
	if err != nil {
		return manageFail("restart", err)
	}
	var written uint64
	res, err := c.Restart(ctx, opts, func(p control.Progress) {
		written = max(written, p.WrittenBackBytes)
		printProgress(p)
	})
	if err != nil {
		return manageFail("restart", err)
	}
	fmt.Printf("gateway %s (PID %d) is re-executing: %s dirty written back\n", c.Name, res.PID, humanize.IBytes(written))
	return exitOK
}
