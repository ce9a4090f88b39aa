package main

import (
	"context"
	"fmt"
	"net"
	"os"
	"strconv"
	"strings"

	"github.com/iser-blk/iser-blk/backend/iser"
)

func init() {
	register(&command{name: "discover", summary: "list the targets and portals a portal offers (SendTargets)", run: runDiscover})
}

// discoveryPortal turns HOST[:PORT] (IPv6 in brackets, or an iscsi:// / iser:// prefix) into
// a transport scheme and a host:port.
func discoveryPortal(arg string) (scheme, portal string, err error) {
	scheme = "iscsi"
	if i := strings.Index(arg, "://"); i >= 0 {
		scheme, arg = strings.ToLower(arg[:i]), strings.TrimSuffix(arg[i+3:], "/")
		if scheme != "iscsi" && scheme != "iser" {
			return "", "", usagef("unknown scheme %q (want iscsi:// or iser://)", scheme)
		}
	}
	if arg == "" || strings.ContainsAny(arg, "/@ ") {
		return "", "", usagef("bad portal %q: want HOST[:PORT]", arg)
	}
	host, port := arg, strconv.Itoa(iser.DefaultPort)
	if h, p, err := net.SplitHostPort(arg); err == nil {
		host, port = h, p
	} else if strings.HasPrefix(arg, "[") && strings.HasSuffix(arg, "]") {
		host = arg[1 : len(arg)-1]
	} else if strings.Count(arg, ":") == 1 {
		return "", "", usagef("bad portal %q: %v", arg, err)
	}
	if n, err := strconv.Atoi(port); err != nil || n < 1 || n > 65535 {
		return "", "", usagef("bad port %q", port)
	}
	if host == "" {
		return "", "", usagef("bad portal %q: no host", arg)
	}
	return scheme, net.JoinHostPort(host, port), nil
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
