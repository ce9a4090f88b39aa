package main

import (
	"strings"
	"testing"
)

// TestUdevNameStdoutIsOnlyKeyValues: udev reads every stdout line of the helper as a property,
// so whatever goes wrong goes to stderr, with exit 1, and stdout stays empty. (What it prints
// for a served device: internal/udevname's tests and the VM test TestUdevLinks.)
func TestUdevNameStdoutIsOnlyKeyValues(t *testing.T) {
	for _, tt := range []struct {
		args   []string
		code   int
		stderr string
	}{
		{[]string{"udev-name", "sda"}, exitFailure, "not an nbd or ublk disk name"},
		{[]string{"udev-name", "nbd0p1"}, exitFailure, "not an nbd or ublk disk name"},
		{[]string{"udev-name", "ublkb4095", "--run-dir", t.TempDir()}, exitFailure, "/sys/block/ublkb4095"},
		{[]string{"udev-name"}, exitUsage, "usage: iser-blk udev-name KERNEL"},
	} {
		code, stdout, stderr := runOut(tt.args...)
		if code != tt.code || stdout != "" || !strings.Contains(stderr, tt.stderr) {
			t.Errorf("%q: exit %d, stdout %q, stderr %q; want exit %d, no stdout, stderr with %q", tt.args, code, stdout, stderr, tt.code, tt.stderr)
		}
	}
}

// TestUdevNameIsHidden: the helper is udev's, not a user's, so neither help nor the man pages
// list it.
func TestUdevNameIsHidden(t *testing.T) {
	for _, c := range documented(newRootCmd(nil, nil)) {
		if c.Name() == "udev-name" {
			t.Fatal("udev-name is listed among the documented commands")
		}
	}
}
