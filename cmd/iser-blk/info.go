package main

import (
	"context"
	"os"

	"go.uber.org/zap"

	"github.com/iser-blk/iser-blk/backend/iser"
)

func init() {
	register(&command{name: "info", summary: "show a LUN's identity, capacity and limits", run: runInfo})
}

func runInfo(ctx context.Context, args []string) int {
	var tf targetFlags
	var asJSON bool
	fs := newFlagSet("info", "[flags] iscsi://[user@]host[:port]/IQN/LUN",
		"Log in to the target, probe the LUN (INQUIRY and VPD pages, READ CAPACITY, MODE SENSE)\n"+
			"and print its identity, capacity and limits. iser:// URLs use the RDMA transport.")
	tf.register(fs, false)
	fs.BoolVar(&asJSON, "json", false, "print JSON instead of a table")
	pos, code, done := parseOrExit(fs, args, 1)
	if done {
		return code
	}
	t, err := iser.ParseURL(pos[0])
	if err != nil {
		return fail("info", err)
	}
	log := commandLogger(tf.debug)
	defer log.Sync() //nolint:errcheck
	opts, err := tf.options(t.User, log)
	if err != nil {
		return fail("info", err)
	}
	opts.ReadOnly = true // info never writes
	d, err := iser.Open(ctx, pos[0], opts)
	if err != nil {
		return fail("info", err)
	}
	info := d.Info()
	if err := d.Close(); err != nil {
		// The LUN's description is complete; a failed logout only leaves the target to time
		// the session out, so it is reported (stderr), not made the command's failure.
		log.Warn("logout failed", zap.Error(err))
	}
	if asJSON {
		err = info.WriteJSON(os.Stdout)
	} else {
		err = info.WriteText(os.Stdout)
	}
	if err != nil {
		return fail("info", err)
	}
	return exitOK
}
