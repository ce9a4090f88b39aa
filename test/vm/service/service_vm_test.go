//go:build vm

// Package service_test runs `iser-blk attach` as a named service in the QEMU guest (test/vm/run.sh
// go-test ./test/vm/service): `status` shows the kernel device and its queues, `detach` refuses a
// mounted device and, once it is unmounted, removes the device and exits 0 (issue 16).
package service_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/iser-blk/iser-blk/internal/status"
	"github.com/iser-blk/iser-blk/test/vm/vmtest"
)

func binary(t *testing.T) string {
	bin := os.Getenv("ISERBLK_BIN")
	if bin == "" {
		t.Fatal("ISERBLK_BIN is not set (test/vm/run.sh go-test builds the CLI)")
	}
	return bin
}

// attach starts `iser-blk attach` with args and waits for the device path it prints.
func attach(t *testing.T, runDir string, args ...string) *vmtest.Gateway {
	t.Helper()
	cmd := exec.Command(binary(t), append([]string{"attach", "--target", "mem://64MiB", "--run-dir", runDir}, args...)...)
	g := vmtest.StartGateway(t, cmd, vmtest.GatewayOptions{})
	if !strings.HasPrefix(g.Device, "/dev/") {
		t.Fatalf("attach printed %q: %s", g.Device, g.Stderr)
	}
	return g
}

func run(t *testing.T, name string, args ...string) (string, int) {
	t.Helper()
	var out bytes.Buffer
	cmd := exec.Command(name, args...)
	cmd.Stdout, cmd.Stderr = &out, &out
	err := cmd.Run()
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		return out.String(), ee.ExitCode()
	}
	if err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	return out.String(), 0
}

// checkLifecycle: status shows the device and its queues; detach of the mounted device is
// refused naming the mount; after umount detach exits 0, the process is gone and gone reports
// the kernel device removed.
func checkLifecycle(t *testing.T, runDir, name string, g *vmtest.Gateway, kind string, gone func() bool) {
	bin := binary(t)
	out, code := run(t, bin, "status", name, "--json", "--run-dir", runDir)
	var st status.Status
	if code != 0 || json.Unmarshal([]byte(out), &st) != nil {
		t.Fatalf("status %s: exit %d: %s", name, code, out)
	}
	if st.Gateway.Name != name || st.Gateway.FrontendPath != g.Device || st.Frontend == nil ||
		string(st.Frontend.Kind) != kind || st.Frontend.Queues < 1 || st.Frontend.QueueDepth < 1 {
		t.Fatalf("status %s: gateway %+v frontend %+v, want %s %s with queues", name, st.Gateway, st.Frontend, kind, g.Device)
	}
	if _, code := run(t, "mkfs.ext4", "-q", "-F", g.Device); code != 0 {
		t.Fatal("mkfs.ext4 failed")
	}
	mnt := t.TempDir()
	if out, code := run(t, "mount", g.Device, mnt); code != 0 {
		t.Fatalf("mount: %s", out)
	}
	if err := os.WriteFile(filepath.Join(mnt, "f"), []byte("kept"), 0o644); err != nil {
		t.Fatal(err)
	}
	out, code = run(t, bin, "detach", name, "--run-dir", runDir)
	if code != 1 || !strings.Contains(out, "mounted") {
		t.Fatalf("detach of a mounted device: exit %d: %s", code, out)
	}
	if out, code := run(t, "umount", mnt); code != 0 {
		t.Fatalf("umount: %s", out)
	}
	if out, code := run(t, bin, "detach", name, "--run-dir", runDir); code != 0 {
		t.Fatalf("detach: exit %d: %s", code, out)
	}
	select {
	case <-g.Exited:
		if g.Err != nil {
			t.Fatalf("gateway exited with %v", g.Err)
		}
	case <-time.After(time.Minute):
		t.Fatal("gateway still running after detach returned")
	}
	if !gone() {
		t.Fatalf("%s still present after detach", g.Device)
	}
}

func TestAttachServiceNBD(t *testing.T) {
	vmtest.Require(t)
	vmtest.LoadModules(t, "nbd")
	runDir := filepath.Join(t.TempDir(), "run")
	g := attach(t, runDir, "--nbd", "/dev/nbd3", "--connections", "2", "--name", "vmnbd")
	checkLifecycle(t, runDir, "vmnbd", g, "nbd", func() bool { return !vmtest.NBDServed("/dev/nbd3") })
}

func TestAttachServiceUblk(t *testing.T) {
	vmtest.Require(t)
	vmtest.LoadModules(t, "ublk")
	runDir := filepath.Join(t.TempDir(), "run")
	g := attach(t, runDir, "--ublk", "--queues", "2", "--depth", "16", "--name", "vmublk")
	checkLifecycle(t, runDir, "vmublk", g, "ublk", func() bool {
		_, err := os.Stat(g.Device)
		return errors.Is(err, os.ErrNotExist)
	})
}
