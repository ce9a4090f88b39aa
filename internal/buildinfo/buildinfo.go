// Package buildinfo says which iser-blk this binary is: its semantic version, the VCS revision it
// was built from, whether the tree had local changes, the Go toolchain and the optional features
// compiled in. `iser-blk version [--json]`, the status schema's build_version and the metrics'
// version labels all read it.
//
// Where the version comes from, first match wins:
//  1. -ldflags "-X github.com/iser-blk/iser-blk/internal/buildinfo.version=X": what `make build`
//     and `make dist` set from the VERSION file at the module root (the one place the release
//     version is kept);
//  2. the main module's version in the binary's build info: a `go install
//     github.com/iser-blk/iser-blk/cmd/iser-blk@v0.9.0` build says 0.9.0, and a `go build` in a
//     git checkout with VCS stamping on gets Go's pseudo-version (0.0.0-2026…-abcdef…+dirty);
//  3. DevVersion, "0.0.0-dev": a plain `go build` without VCS stamping. It sorts before every
//     release, so nothing mistakes it for one.
//
// The revision and modified flag come from -ldflags likewise (revision, modified="true"|"false";
// the Makefile sets them from git, which works with GOFLAGS=-buildvcs=false too), else from Go's
// VCS stamping (vcs.revision, vcs.modified), else they are empty and false.
package buildinfo

import (
	"encoding/json"
	"fmt"
	"io"
	"runtime"
	"runtime/debug"
	"strings"
)

// DevVersion is the version of a build that has none from -ldflags or the module.
const DevVersion = "0.0.0-dev"

// Set with -ldflags -X by the Makefile (see the package comment). Strings, as -X requires.
var (
	version  string
	revision string
	modified string
)

// FeatureRDMA is the feature of a build with the iSER transport (cgo and rdma-core, without the
// nordma tag): iser:// targets work. Without it only iscsi:// (TCP) targets do.
const FeatureRDMA = "rdma"

// Info is what `iser-blk version --json` prints. The field names are stable.
type Info struct {
	Version  string   `json:"version"`  // semantic version, without a leading v
	Revision string   `json:"revision"` // VCS revision, "" when unknown
	Modified bool     `json:"modified"` // the tree had uncommitted changes
	Go       string   `json:"go"`       // the Go toolchain, e.g. go1.26.8
	Features []string `json:"features"` // optional features compiled in: "rdma"; empty, never null
}

// Get returns this binary's Info.
func Get() Info {
	bi, _ := debug.ReadBuildInfo()
	return resolve(linked{version, revision, modified}, bi)
}

// Version is Get().Version.
func Version() string { return Get().Version }

// Has reports whether the binary was built with feature f (FeatureRDMA).
func (i Info) Has(f string) bool {
	for _, g := range i.Features {
		if g == f {
			return true
		}
	}
	return false
}

// String is the one line `iser-blk version` prints after the program's name:
// "0.9.0 (rev 0123456789ab, modified; go1.26.8; rdma)".
func (i Info) String() string {
	var b strings.Builder
	b.WriteString(i.Version)
	b.WriteString(" (")
	if i.Revision != "" {
		b.WriteString("rev ")
		b.WriteString(short(i.Revision))
		if i.Modified {
			b.WriteString(", modified")
		}
		b.WriteString("; ")
	}
	b.WriteString(i.Go)
	b.WriteString("; ")
	if len(i.Features) == 0 {
		b.WriteString("no rdma")
	} else {
		b.WriteString(strings.Join(i.Features, ", "))
	}
	b.WriteString(")")
	return b.String()
}

// Write writes i as `iser-blk version` prints it: "iser-blk " and String on one line, or with
// asJSON the Info as indented JSON (`version --json`).
func (i Info) Write(w io.Writer, asJSON bool) error {
	if asJSON {
		e := json.NewEncoder(w)
		e.SetIndent("", "  ")
		return e.Encode(i)
	}
	_, err := fmt.Fprintln(w, "iser-blk", i)
	return err
}

// linked is what -ldflags -X set.
type linked struct{ version, revision, modified string }

// resolve applies the package comment's rules to the -X values and Go's build info (nil when
// the binary has none).
func resolve(ld linked, bi *debug.BuildInfo) Info {
	i := Info{Version: DevVersion, Go: runtime.Version(), Features: features()}
	var vcsRev, vcsMod string
	if bi != nil {
		if v := bi.Main.Version; v != "" && v != "(devel)" {
			i.Version = v
		}
		if bi.GoVersion != "" {
			i.Go = bi.GoVersion
		}
		for _, s := range bi.Settings {
			switch s.Key {
			case "vcs.revision":
				vcsRev = s.Value
			case "vcs.modified":
				vcsMod = s.Value
			}
		}
	}
	if ld.version != "" {
		i.Version = ld.version
	}
	i.Version = strings.TrimPrefix(i.Version, "v")
	i.Revision, i.Modified = vcsRev, vcsMod == "true"
	if ld.revision != "" {
		i.Revision, i.Modified = ld.revision, ld.modified == "true"
	}
	return i
}

// features lists what this build has; the list is built per call, so a caller may keep it.
func features() []string {
	f := []string{}
	if rdma {
		f = append(f, FeatureRDMA)
	}
	return f
}

func short(rev string) string {
	if len(rev) > 12 {
		return rev[:12]
	}
	return rev
}
