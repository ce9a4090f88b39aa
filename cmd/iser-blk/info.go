package main

import (
	"context"
	"os"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	"go.uber.org/zap"

	"github.com/iser-blk/iser-blk/backend/iser"
	"github.com/iser-blk/iser-blk/internal/cli"
	"github.com/iser-blk/iser-blk/internal/logging"
)

// newInfoCmd is `iser-blk info URL`.
func newInfoCmd() *cobra.Command {
	var tf targetFlags
	var asJSON bool
	cmd := cli.Leaf("info [flags] iscsi://[user@]host[:port]/IQN/LUN", "show a LUN's identity, capacity and limits",
		"Log in to the target, probe the LUN (INQUIRY and VPD pages, READ CAPACITY, MODE SENSE)\n"+
			"and print its identity, capacity and limits. iser:// URLs use the RDMA transport.", 1,
		func(cmd *cobra.Command, pos []string) int { return runInfo(cmd.Context(), &tf, asJSON, pos[0]) })
	tf.addTo(cmd)
	cli.Group(cmd, groupOutput, func(fs *pflag.FlagSet) {
		fs.BoolVar(&asJSON, "json", false, "print JSON instead of a table")
	})
	return cmd
}

func runInfo(ctx context.Context, tf *targetFlags, asJSON bool, url string) int {
	t, err := iser.ParseURL(url)
	if err != nil {
		return fail("info", err)
	}
	log := logging.Command(tf.debug)
	defer log.Sync() //nolint:errcheck
	opts, err := tf.options(t.User, log)
	if err != nil {
		return fail("info", err)
	}
	opts.ReadOnly = true // info never writes
	d, err := iser.Open(ctx, url, opts)
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
