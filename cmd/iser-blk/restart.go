package main

import (
	"context"
	"fmt"
	"os"

	"github.com/iser-blk/iser-blk/internal/control"
)

func init() {
	register(&command{name: "restart", summary: "planned restart of a running gateway: write back, re-exec, keep the device", run: runRestart})
}

// runRestart asks gateway NAME for a planned restart through its control socket (OpRestart).
// Exit 0 once the old image has written back every dirty byte, recorded a clean state and is
// re-executing; 1 when it refused or its write-back failed (it then keeps serving); 4 when no
// gateway has that name.
func runRestart(ctx context.Context, args []string) int {
	var runDir string
	fs := newFlagSet("restart", "NAME [--run-dir DIR]",
		"Restart the gateway NAME in place: it stops taking requests, finishes those in flight, writes\n"+
			"back every dirty byte, records a clean state and re-executes its binary from its path on\n"+
			"disk with the same arguments and PID; the new image takes the device over. Installing a\n"+
			"new binary and running restart upgrades the gateway (systemd ExecReload may call it).")
	fs.StringVar(&runDir, "run-dir", "", "run directory (default $"+control.RunDirEnv+" or "+control.DefaultRunDir+")")
	pos, code, done := parseOrExit(fs, args, 1)
	if done {
		return code
	}
	c, err := control.Dial(ctx, control.RunDir(runDir), pos[0])
	if err == nil {
		var res control.DetachResult
		if res, err = c.Restart(ctx); err == nil {
			fmt.Printf("gateway %s (pid %d) is restarting\n", pos[0], res.PID)
			return exitOK
		}
	}
	fmt.Fprintf(os.Stderr, "iser-blk restart: %v\n", err)
	return control.ExitCode(err)
}
