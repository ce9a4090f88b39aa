//go:build e2e

package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestE2EAttachNamedFailsBeforeDevice: a gateway named before login (--name) whose attach fails
// before any kernel device exists — here a corrupt state file refuses the takeover — exits with
// its own code (7), closes the device it opened, and does not panic. Before the fix the gateway's
// shutdown flushed the device it had not been told about yet: a nil device, a panic, exit 2.
func TestE2EAttachNamedFailsBeforeDevice(t *testing.T) {
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "gw.json"), []byte("{not json"), 0o600); err != nil {
		t.Fatal(err)
	}
	r := runCLI(t, nil, "attach", "--target", "mem://64MiB", "--ublk", "--name", "gw", "--run-dir", dir)
	if r.code != exitNoResume {
		t.Fatalf("exit %d, want %d (takeover refused)", r.code, exitNoResume)
	}
	if strings.Contains(r.stderr, "panic") {
		t.Fatalf("the gateway panicked:\n%s", r.stderr)
	}
	if !strings.Contains(r.stderr, "device flushed") {
		t.Fatalf("the device openStack opened was not flushed and closed:\n%s", r.stderr)
	}
}

// TestE2EAttachNBDLoadsTheModuleBeforeLogin: attach --nbd loads nbd itself before it logs in. On
// a host whose kernel cannot load it (this host tier's) it exits 6 at once, naming modprobe,
// without a login attempt (the target here refuses connections: a login would exit 5).
func TestE2EAttachNBDLoadsTheModuleBeforeLogin(t *testing.T) {
	r := runCLI(t, nil, "attach", "--target", "iscsi://127.0.0.1:1/iqn.2026-01.test:none/0", "--nbd", "/dev/nbd0")
	if _, err := os.Stat("/sys/module/nbd"); err == nil {
		if r.code != exitUnreachable {
			t.Fatalf("nbd loaded: exit %d, want %d (the login to a closed port)", r.code, exitUnreachable)
		}
		return
	}
	if r.code != exitNoKernel || !strings.Contains(r.stderr, "modprobe nbd") {
		t.Fatalf("no nbd: exit %d, want %d naming modprobe:\n%s", r.code, exitNoKernel, r.stderr)
	}
}
