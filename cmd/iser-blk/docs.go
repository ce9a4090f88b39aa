package main

// Man pages (section 8) generated from the commands' own definitions, so that they cannot drift
// from --help: `iser-blk gen-man DIR` (hidden; make man writes bin/man8). Shell completion is
// cobra's `iser-blk completion bash|zsh|fish` (make completions writes bin/completions).

import (
	"github.com/spf13/cobra"
	"github.com/spf13/cobra/doc"

	"github.com/iser-blk/iser-blk/internal/buildinfo"
	"github.com/iser-blk/iser-blk/internal/cli"
)

// manSection is the man pages' section: system administration (the commands need root).
const manSection = "8"

// newGenManCmd is the hidden `iser-blk gen-man DIR`: one page per command, iser-blk.8 and
// iser-blk-COMMAND.8. The date is $SOURCE_DATE_EPOCH's when set (reproducible builds).
func newGenManCmd() *cobra.Command {
	cmd := cli.Leaf("gen-man DIR", "write the man pages (section 8) into DIR",
		"Write one man page per command into DIR (created if need be): iser-blk.8 and\n"+
			"iser-blk-COMMAND.8. make man runs it.", 1,
		func(cmd *cobra.Command, pos []string) int {
			header := &doc.GenManHeader{Section: manSection, Source: "iser-blk " + buildinfo.Version(), Manual: "iser-blk manual"}
			if err := cli.GenMan(cmd.Root(), pos[0], header); err != nil {
				return fail("gen-man", err)
			}
			return exitOK
		})
	cmd.Hidden = true
	cmd.ValidArgsFunction = nil // DIR completes as a file name
	return cmd
}
