package main

import (
	"context"
	"fmt"
	"os"

	"github.com/spf13/cobra"

	"github.com/iser-blk/iser-blk/backend/iser"
	"github.com/iser-blk/iser-blk/internal/cli"
	"github.com/iser-blk/iser-blk/internal/logging"
)

// discoveryPortal is iser.ParsePortal; every error is a usage error.
func discoveryPortal(arg string) (scheme, portal string, err error) {
	if scheme, portal, err = iser.ParsePortal(arg); err != nil {
		return "", "", usagef("%v", err)
	}
	return scheme, portal, nil
}

// newDiscoverCmd is `iser-blk discover PORTAL`.
func newDiscoverCmd() *cobra.Command {
	var tf targetFlags
	cmd := cli.Leaf("discover [flags] HOST[:PORT]", "list the targets and portals a portal offers (SendTargets)",
		"Run a SendTargets discovery session against the portal and print one line per target\n"+
			"portal: PORTAL,TPGT TARGET-NAME (the format of iscsiadm -m discovery).", 1,
		func(cmd *cobra.Command, pos []string) int { return runDiscover(cmd.Context(), &tf, pos[0]) })
	tf.addTo(cmd)
	return cmd
}

func runDiscover(ctx context.Context, tf *targetFlags, arg string) int {
	scheme, portal, err := discoveryPortal(arg)
	if err != nil {
		return fail("discover", err)
	}
	log := logging.Command(tf.debug)
	defer log.Sync() //nolint:errcheck
	opts, err := tf.options("", log)
	if err != nil {
		return fail("discover", err)
	}
	targets, err := iser.Discover(ctx, scheme, portal, opts)
	if err != nil {
		return fail("discover", err)
	}
	for _, t := range targets {
		if len(t.Portals) == 0 {
			fmt.Fprintf(os.Stdout, "%s %s\n", portal, t.Name)
		}
		for _, p := range t.Portals {
			fmt.Fprintf(os.Stdout, "%s,%d %s\n", p.Address, p.TPGT, t.Name)
		}
	}
	return exitOK
}
