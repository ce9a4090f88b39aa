// Command iser-blk makes a remote iSCSI LUN (over iSER or TCP) a local block device: an NBD export
// on a socket, a kernel /dev/nbdX, or a ublk /dev/ublkbN.
//
// This package is wiring: flags to options, options to the packages that do the work. The CLI is
// spf13/cobra: newRootCmd builds the root and every subcommand from its constructor (newAttachCmd,
// newServeCmd, ...; related ones share a file: manage.go, handover.go); cli.Execute runs it and
// maps its outcome to the exit code; main only turns SIGINT/SIGTERM into context cancellation. Shared
// pieces: target.go (the target flags and their iser.Options), flagset.go (the flag groups of
// help; the conventions are internal/cli's), exitcodes.go (the error-to-exit-code mapping), exportflags.go and
// stack.go (the device stack serve and attach build), gateway.go (the flags of internal/gateway
// and internal/takeover), docs.go (man pages). How a serving process ends — detach, restart,
// stop --keep, a signal, the final flush — is internal/gateway's.
//
// Invariants: secrets never come from argv or a URL and are never logged; every command returns
// one of the documented exit codes; a serving command exits 0 only when everything acknowledged
// was flushed to the target (gateway.CloseDevice), or handed over clean to a successor.
package main

import (
	"context"
	"io"
	"os"

	"github.com/spf13/cobra"

	"github.com/iser-blk/iser-blk/internal/buildinfo"
	"github.com/iser-blk/iser-blk/internal/cli"
	"github.com/iser-blk/iser-blk/internal/procs"
	"github.com/iser-blk/iser-blk/internal/profiling"
)

// newRootCmd is `iser-blk` with every subcommand, writing its results to stdout and its errors
// and usage to stderr (the completion scripts go to stdout).
func newRootCmd(stdout, stderr io.Writer) *cobra.Command {
	root := &cobra.Command{
		Use:   "iser-blk COMMAND [flags]",
		Short: "a remote iSCSI LUN (iSCSI/TCP or iSER) as a local disk: NBD socket, /dev/nbdX or ublk",
		Long: "iser-blk makes a remote iSCSI LUN (over iSER or TCP) a local block device: an NBD export\n" +
			"on a socket (serve), a kernel /dev/nbdX or a ublk /dev/ublkbN (attach).",
		Args: func(_ *cobra.Command, args []string) error {
			if len(args) == 0 {
				return usagef("no command given")
			}
			return usagef("unknown command %q", args[0])
		},
		RunE:          func(*cobra.Command, []string) error { return nil }, // Args refuses every call
		Version:       buildinfo.Get().String(),
		SilenceErrors: true,
		SilenceUsage:  true,
		// The root's completion is the subcommands only.
		ValidArgsFunction: cobra.NoFileCompletions,
	}
	root.SetOut(stdout)
	root.SetErr(stderr)
	root.SetVersionTemplate("iser-blk {{.Version}}\n")
	cli.SetUsage(root, usageFooter)
	root.SetFlagErrorFunc(func(_ *cobra.Command, err error) error { return usagef("%v", err) })
	root.Flags().Bool("version", false, "print the version and exit (as the version command does)") // no -v
	root.Flags().BoolP("help", "h", false, "print this help")
	root.AddCommand(
		newAttachCmd(),
		newServeCmd(),
		newInfoCmd(),
		newDiscoverCmd(),
		newListCmd(),
		newStatusCmd(),
		newDetachCmd(),
		newRestartCmd(),
		newStopCmd(),
		newCSICmd(),
		newVersionCmd(),
		newGenManCmd(),
		newUdevNameCmd(),
	)
	root.InitDefaultHelpCmd()
	root.InitDefaultCompletionCmd()
	for _, c := range root.Commands() {
		switch c.Name() {
		case "help":
			c.Short = "print a command's help: iser-blk help COMMAND"
		case "completion":
			c.Short = "print a shell completion script: iser-blk completion bash|zsh|fish"
			c.Args = cobra.ArbitraryArgs
			c.RunE = func(_ *cobra.Command, args []string) error { // no shell or an unknown one: exit 2
				if len(args) == 0 {
					return usagef("name a shell: bash, zsh, fish or powershell")
				}
				return usagef("unknown shell %q: bash, zsh, fish or powershell", args[0])
			}
		}
	}
	return root
}

// run runs the CLI (cli.Execute: the command's exit code, 2 with the usage for a usage error)
// with the root's output on stdout and errors (and usage) on stderr.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	return cli.Execute(ctx, newRootCmd(stdout, stderr), args)
}

func main() {
	procs.SmallHost()
	profiling.FromEnv(os.Stderr)
	ctx, stop := signalContext()
	code := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}
