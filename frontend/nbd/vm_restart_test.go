//go:build vm

package nbd

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/iser-blk/iser-blk/test/vm/vmtest"
)

// TestVMPlannedRestart is issue 17's planned-restart acceptance on kernel NBD (netlink, 2
// connections): ext4 on /dev/nbdX with the write-back cache under fio verify, `iser-blk restart
// NAME` three times: the same device and PID throughout, the log says how much was written back
// before each re-exec, fio ends without a verify or I/O error, no kernel I/O error, fsck clean.
// Each new image serves the sockets the old one handed down, and the kernel logs no connection
// timing out or dying.
func TestVMPlannedRestart(t *testing.T) {
	requireNBD(t)
	bin := os.Getenv("ISERBLK_BIN")
	lio := vmtest.StartLIO(t, vmtest.LIOOptions{File: true, SizeMiB: 256, NoISER: true})
	runDir := t.TempDir()
	args := []string{"--target", lio.URL("iscsi"), "--nbd", "/dev/nbd5", "--connections", "2",
		"--cache", "writeback", "--name", "gw-nbd-planned", "--run-dir", runDir}
	g := startGateway(t, args...)
	pid := g.Cmd.Process.Pid
	mnt, fioDone, fioOut, firstWrite := mountAndVerify(t, g.Device)
	base := filepath.Base(g.Device)
	if out, err := exec.Command("dmesg", "-C").CombinedOutput(); err != nil {
		t.Fatalf("dmesg -C: %v: %s", err, out)
	}
	for i := range 3 {
		vmtest.WaitWrites(t, base, vmtest.KillAt(firstWrite, i), nil)
		t0 := time.Now()
		out, err := exec.Command(bin, "restart", "gw-nbd-planned", "--run-dir", runDir).CombinedOutput()
		if err != nil {
			t.Fatalf("restart %d: %v\n%s\n%s", i+1, err, out, g.Stderr.String())
		}
		waitLogCount(t, g, "nbd device reattached", i+1, time.Minute)
		t.Logf("restart %d: %s reattached %v after the request (%s)", i+1, g.Device, time.Since(t0), bytes.TrimSpace(out))
		checkSameProcess(t, g, pid)
	}
	for _, l := range strings.Split(g.Stderr.String(), "\n") {
		if strings.Contains(l, "re-executing for a planned restart") {
			t.Logf("log: %s", l)
		}
	}
	if n := strings.Count(g.Stderr.String(), "re-executing for a planned restart"); n != 3 {
		t.Fatalf("%d re-exec lines in the log, want 3", n)
	}
	// Each new image served the connections the old one handed down: the kernel never saw one
	// die, so nothing it sent waited for its request timer (30 s a restart before).
	if n := strings.Count(g.Stderr.String(), "the previous gateway's connections go on"); n != 3 {
		t.Fatalf("%d of 3 restarts kept the device's connections:\n%s", n, g.Stderr.String())
	}
	for _, l := range kernelLines(t, base) {
		if strings.Contains(l, "timed out") || strings.Contains(l, "Dead connection") || strings.Contains(l, "Receive control failed") {
			t.Fatalf("the kernel saw a connection of %s fail during the restarts: %s", base, l)
		}
	}
	finishVerify(t, fioDone, fioOut, g.Device, mnt)
	t.Logf("fio: %s", lastLine(fioOut.String(), "err="))
	g.Detach(t, "detach")
}

// waitLogCount waits until msg is in the gateway's log n times.
func waitLogCount(t *testing.T, g *vmtest.Gateway, msg string, n int, within time.Duration) {
	t.Helper()
	deadline := time.Now().Add(within)
	for strings.Count(g.Stderr.String(), msg) < n {
		if time.Now().After(deadline) {
			t.Fatalf("%q not %d times in the gateway's log within %v:\n%s", msg, n, within, g.Stderr.String())
		}
		time.Sleep(50 * time.Millisecond) // polling the log, not synchronising
	}
}

// checkSameProcess requires the gateway to be running as pid still.
func checkSameProcess(t *testing.T, g *vmtest.Gateway, pid int) {
	t.Helper()
	select {
	case <-g.Exited:
		t.Fatalf("the gateway exited: %v", g.Err)
	default:
	}
	if _, err := os.Readlink(fmt.Sprintf("/proc/%d/exe", pid)); err != nil {
		t.Fatalf("pid %d is gone: %v", pid, err)
	}
}

// lastLine is the last line of s containing sub ("" if none).
func lastLine(s, sub string) string {
	last := ""
	for _, l := range strings.Split(s, "\n") {
		if strings.Contains(l, sub) {
			last = strings.TrimSpace(l)
		}
	}
	return last
}

// kernelLines is the kernel log's lines that mention dev.
func kernelLines(t *testing.T, dev string) []string {
	t.Helper()
	out, err := exec.Command("dmesg").Output()
	if err != nil {
		t.Fatalf("dmesg: %v", err)
	}
	var lines []string
	for _, l := range strings.Split(string(out), "\n") {
		if strings.Contains(l, dev+":") || strings.Contains(l, dev+" ") {
			lines = append(lines, l)
		}
	}
	return lines
}
