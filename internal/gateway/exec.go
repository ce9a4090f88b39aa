package gateway

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"
)

// Executable is the path of the binary this process was started from: arg0 (found on PATH when
// it has no slash, made absolute) when that names the running binary, else os.Executable without
// the " (deleted)" the kernel appends to /proc/self/exe once the file was replaced or removed.
// Resolve it when the process starts, before an upgrade can replace the file: a planned restart
// re-executes the file now at that path, so installing a new binary there and running
// `iser-blk restart` upgrades the gateway in place. The started path comes first because
// os.Executable resolves symbolic links: an install that upgrades by repointing a link
// (/usr/local/bin/iser-blk -> /opt/iser-blk/1.3/iser-blk) would otherwise re-execute the old
// version's file.
func Executable(arg0 string) (string, error) {
	if p, ok := startedAs(arg0); ok {
		return p, nil
	}
	p, err := os.Executable()
	if err != nil {
		return "", err
	}
	return trimDeleted(p), nil
}

// startedAs is arg0 as an absolute path, if it names the file this process runs (the same
// inode as /proc/self/exe now, at start: a spoofed or stale argv[0] does not).
func startedAs(arg0 string) (string, bool) {
	p := arg0
	if !strings.Contains(p, "/") {
		var err error
		if p, err = exec.LookPath(p); err != nil {
			return "", false
		}
	}
	abs, err := filepath.Abs(p)
	if err != nil {
		return "", false
	}
	named, err := os.Stat(abs)
	if err != nil {
		return "", false
	}
	running, err := os.Stat("/proc/self/exe")
	if err != nil || !os.SameFile(named, running) {
		return "", false
	}
	return abs, true
}

// trimDeleted strips the kernel's " (deleted)" mark from an executable's path.
func trimDeleted(p string) string { return strings.TrimSuffix(p, " (deleted)") }

// reexecutable checks that path can be executed now (a hand-over refuses before it stops
// anything when it could not re-execute).
func reexecutable(path string) error { return unix.Access(path, unix.X_OK) }
