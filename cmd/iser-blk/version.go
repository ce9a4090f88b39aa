package main

import (
	"context"
	"fmt"
	"runtime/debug"
)

func init() {
	register(&command{name: "version", summary: "print the version", run: func(context.Context, []string) int {
		v := "devel"
		if bi, ok := debug.ReadBuildInfo(); ok {
			for _, s := range bi.Settings {
				if s.Key == "vcs.revision" {
					v = s.Value
				}
			}
		}
		fmt.Println("iser-blk", v)
		return exitOK
	}})
}
