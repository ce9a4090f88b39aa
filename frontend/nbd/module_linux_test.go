package nbd

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestLoadModule(t *testing.T) {
	dir := t.TempDir()
	sys := filepath.Join(dir, "sys-module-nbd")
	// modprobe stand-ins: one that loads the module (creates the sysfs directory), one that fails.
	loads := filepath.Join(dir, "modprobe-ok")
	fails := filepath.Join(dir, "modprobe-fail")
	if err := os.WriteFile(loads, []byte("#!/bin/sh\nmkdir \""+sys+"\"\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(fails, []byte("#!/bin/sh\necho 'FATAL: Module nbd not found in directory /lib/modules/6.18' >&2\nexit 1\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	err := loadModule(sys, fails)
	if !errors.Is(err, ErrNoKernelNBD) || !strings.Contains(err.Error(), "Module nbd not found") {
		t.Fatalf("failing modprobe: %v, want ErrNoKernelNBD with modprobe's words", err)
	}
	if err := loadModule(sys, loads); err != nil {
		t.Fatalf("modprobe that loads it: %v", err)
	}
	if err := loadModule(sys, filepath.Join(dir, "never-run")); err != nil {
		t.Fatalf("module already loaded: %v (modprobe must not be needed)", err)
	}
}
