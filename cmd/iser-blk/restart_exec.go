package main

import (
	"os"
	"strings"
	"syscall"
)

// startExecutable is the path of the binary this process was started from, resolved when the
// process starts (package initialisation), before an upgrade can replace the file: a planned
// restart re-executes the file now at that path, so installing a new binary there and running
// `iser-blk restart` upgrades the gateway in place.
var startExecutable, startExecutableErr = executablePath()

// executablePath is os.Executable without the " (deleted)" the kernel appends to
// /proc/self/exe once the file was replaced or removed: the path on disk is what is wanted.
func executablePath() (string, error) {
	p, err := os.Executable()
	if err != nil {
		return "", err
	}
	return trimDeleted(p), nil
}

// trimDeleted strips the kernel's " (deleted)" mark from an executable's path.
func trimDeleted(p string) string { return strings.TrimSuffix(p, " (deleted)") }

// reexecutable checks that path can be executed now (a restart refuses before it stops
// anything when it could not re-execute).
func reexecutable(path string) error {
	return syscall.Access(path, 1) // X_OK
}

// reexec replaces the process image with path, with this process's arguments and environment:
// same PID, every file descriptor closed except those without close-on-exec (Go opens every
// file close-on-exec). It returns only on failure.
func reexec(path string) error {
	return syscall.Exec(path, os.Args, os.Environ())
}
