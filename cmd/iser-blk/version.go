package main

import (
	"context"
	"fmt"
	"runtime/debug"
)

func init() {
	register(&command{name: "version", summary: "print the version", run: func(context.Context, []string) int {
		fmt.Println("iser-blk", buildVersion())
		return exitOK
	}})
}

// buildVersion is the VCS revision the binary was built from, "devel" without one; `version`
// prints it and status/metrics report it.
func buildVersion() string {
	v := "devel"
	if bi, ok := debug.ReadBuildInfo(); ok {
		for _, s := range bi.Settings {
			if s.Key == "vcs.revision" {
				v = s.Value
			}
		}
	}
	return v
}
