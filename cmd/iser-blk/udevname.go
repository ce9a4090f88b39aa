package main

// udev-name: the hidden helper of contrib/udev/60-iser-blk.rules. udev runs it for every nbd and
// ublk disk it sees (IMPORT{program}) and links /dev/iser-blk/NAME from what it prints.

import (
	"fmt"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/iser-blk/iser-blk/internal/cli"
	"github.com/iser-blk/iser-blk/internal/control"
	"github.com/iser-blk/iser-blk/internal/udevname"
)

// newUdevNameCmd is the hidden `iser-blk udev-name KERNEL`: stdout holds nothing but udev's
// KEY=VALUE lines (ISER_BLK_NAME, ISER_BLK_TARGET), and nothing at all, with exit 0, for a
// device no named gateway serves; anything it cannot answer goes to stderr (udev logs it)
// with exit 1. It never waits longer than udevname.DefaultBackendWait.
func newUdevNameCmd() *cobra.Command {
	var runDir string
	cmd := cli.Leaf("udev-name KERNEL", "print the gateway name of an nbd or ublk disk for udev",
		"Print ISER_BLK_NAME=NAME (and ISER_BLK_TARGET=URL) for the kernel disk KERNEL (nbd0, ublkb3)\n"+
			"when a gateway started with --name serves it, and nothing otherwise. udev runs it from\n"+
			"60-iser-blk.rules to link /dev/iser-blk/NAME.", 1,
		func(cmd *cobra.Command, pos []string) int {
			stderr := cmd.ErrOrStderr()
			d, ok, err := udevname.Lookup(pos[0], udevname.Options{
				RunDir: control.RunDir(runDir),
				Warn:   func(err error) { fmt.Fprintf(stderr, "iser-blk udev-name: skipped %v\n", err) },
			})
			if err != nil {
				fmt.Fprintf(stderr, "iser-blk udev-name: %v\n", err)
				return exitFailure
			}
			if ok {
				fmt.Fprint(cmd.OutOrStdout(), d.Env())
			}
			return exitOK
		})
	cli.Group(cmd, groupService, func(fs *pflag.FlagSet) {
		fs.StringVar(&runDir, "run-dir", "", "directory of the gateways' state files (default: $"+control.RunDirEnv+" or "+control.DefaultRunDir+")")
	})
	cmd.Hidden = true
	return cmd
}
