// Command iser-blk makes a remote iSCSI LUN (over iSER or TCP) a local block device: an NBD export
// on a socket, a kernel /dev/nbdX, or a ublk /dev/ublkbN.
//
// This package is wiring: flags to options, options to the packages that do the work. Each
// subcommand registers itself from init() (related ones share a file: manage.go, handover.go);
// main only dispatches and turns SIGINT/SIGTERM into context cancellation. Shared pieces:
// target.go (the target flags and their iser.Options), flagset.go (parsing, usage), exitcodes.go
// (the error-to-exit-code mapping), exportflags.go and stack.go (the device stack serve and attach
// build), gateway.go (the flags of internal/gateway and internal/takeover). How a serving process
// ends — detach, restart, stop --keep, a signal, the final flush — is internal/gateway's.
//
// Invariants: secrets never come from argv or a URL and are never logged; every command returns
// one of the documented exit codes; a serving command exits 0 only when everything acknowledged
// was flushed to the target (gateway.CloseDevice), or handed over clean to a successor.
package main

import (
	"context"
	"fmt"
	"os"
	"sort"

	"github.com/iser-blk/iser-blk/internal/profiling"
)

// command is one subcommand. run returns the process exit code (see exitcodes.go).
type command struct {
	name    string
	summary string
	run     func(ctx context.Context, args []string) int
}

var commands = map[string]*command{}

func register(c *command) {
	if _, dup := commands[c.name]; dup {
		panic("iser-blk: duplicate subcommand " + c.name)
	}
	commands[c.name] = c
}

func usage() {
	fmt.Fprintf(os.Stderr, "usage: iser-blk <command> [flags]\n\ncommands:\n")
	names := make([]string, 0, len(commands))
	for n := range commands {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		fmt.Fprintf(os.Stderr, "  %-10s %s\n", n, commands[n].summary)
	}
	fmt.Fprintf(os.Stderr, "\nRun 'iser-blk <command> --help' for a command's flags.\n")
}

func main() {
	if len(os.Args) < 2 {
		usage()
		os.Exit(exitUsage)
	}
	name := os.Args[1]
	if name == "--version" {
		name = "version"
	}
	if name == "-h" || name == "--help" || name == "help" {
		usage()
		os.Exit(exitOK)
	}
	c, ok := commands[name]
	if !ok {
		fmt.Fprintf(os.Stderr, "iser-blk: unknown command %q\n", name)
		usage()
		os.Exit(exitUsage)
	}
	smallHostProcs()
	profiling.FromEnv(os.Stderr)
	ctx, stop := signalContext()
	defer stop()
	os.Exit(c.run(ctx, os.Args[2:]))
}
