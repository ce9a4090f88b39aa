package main

import (
	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/iser-blk/iser-blk/internal/buildinfo"
	"github.com/iser-blk/iser-blk/internal/cli"
)

// newVersionCmd is `iser-blk version [--json]` (`iser-blk --version` prints the same line): the
// semantic version, VCS revision, modified flag, Go version and build features
// (internal/buildinfo says where each comes from).
func newVersionCmd() *cobra.Command {
	var asJSON bool
	cmd := cli.Leaf("version [--json]", "print the version",
		"Print iser-blk's version: the semantic version, the VCS revision it was built from (and\n"+
			"whether the tree was modified), the Go toolchain and the build's features (rdma: iser://\n"+
			"targets work; a build without it serves iscsi:// targets only).", 0,
		func(cmd *cobra.Command, _ []string) int {
			if err := buildinfo.Get().Write(cmd.OutOrStdout(), asJSON); err != nil {
				return fail("version", err)
			}
			return exitOK
		})
	cli.Group(cmd, groupOutput, func(fs *pflag.FlagSet) {
		fs.BoolVar(&asJSON, "json", false, "print JSON: version, revision, modified, go, features")
	})
	return cmd
}
