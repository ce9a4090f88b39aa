package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"

	"github.com/iser-blk/iser-blk/internal/buildinfo"
)

func init() {
	register(&command{name: "version", summary: "print the version", run: runVersion})
}

// runVersion is `iser-blk version [--json]` (and `iser-blk --version`): the semantic version,
// VCS revision, modified flag, Go version and build features (internal/buildinfo says where
// each comes from).
func runVersion(_ context.Context, args []string) int {
	var asJSON bool
	fs := newFlagSet("version", "[--json]",
		"Print iser-blk's version: the semantic version, the VCS revision it was built from (and\n"+
			"whether the tree was modified), the Go toolchain and the build's features (rdma: iser://\n"+
			"targets work; a build without it serves iscsi:// targets only).")
	fs.BoolVar(&asJSON, "json", false, "print JSON: version, revision, modified, go, features")
	if _, code, done := parseOrExit(fs, args, 0); done {
		return code
	}
	if err := writeVersion(os.Stdout, buildinfo.Get(), asJSON); err != nil {
		return fail("version", err)
	}
	return exitOK
}

func writeVersion(w io.Writer, info buildinfo.Info, asJSON bool) error {
	if asJSON {
		e := json.NewEncoder(w)
		e.SetIndent("", "  ")
		return e.Encode(info)
	}
	_, err := fmt.Fprintln(w, "iser-blk", info)
	return err
}

// buildVersion is the binary's semantic version (buildinfo.Version); status reports it as
// build_version and the metrics as their version label.
func buildVersion() string { return buildinfo.Version() }
