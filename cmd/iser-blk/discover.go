package main

import (
	"context"
	"fmt"
	"os"

	"github.com/iser-blk/iser-blk/backend/iser"
)

func init() {
	register(&command{name: "discover", summary: "list the targets and portals a portal offers (SendTargets)", run: runDiscover})
}

// discoveryPortal is iser.ParsePortal; every error is a usage error.
func discoveryPortal(arg string) (scheme, portal string, err error) {
	if scheme, portal, err = iser.ParsePortal(arg); err != nil {
		return "", "", usagef("%v", err)
	}
	return scheme, portal, nil
}

func runDiscover(ctx context.Context, args []string) int {
	var tf targetFlags
	fs := newFlagSet("discover", "[flags] HOST[:PORT]",
		"Run a SendTargets discovery session against the portal and print one line per target\n"+
			"portal: PORTAL,TPGT TARGET-NAME (the format of iscsiadm -m discovery).")
	tf.register(fs, false)
	pos, code, done := parseOrExit(fs, args, 1)
	if done {
		return code
	}
	scheme, portal, err := discoveryPortal(pos[0])
	if err != nil {
		return fail("discover", err)
	}
	log := commandLogger(tf.debug)
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
