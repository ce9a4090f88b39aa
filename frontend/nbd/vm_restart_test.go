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
func TestVMPlannedRestart(t *testing.T) {
	requireNBD(t)
	bin := os.Getenv("ISERBLK_BIN")
	lio := vmtest.StartLIO(t, vmtest.LIOOptions{File: true, SizeMiB: 256, NoISER: true})
	runDir := t.TempDir()
	args := []string{"--target", lio.URL("iscsi"), "--nbd", "/dev/nbd5", "--connections", "2",
		"--cache", "writeback", "--name", "gw-nbd-planned", "--run-dir", runDir}
	g := startGateway(t, args...)
	pid := g.cmd.Process.Pid
	exec.Command("dmesg", "-C").Run()
	mnt := t.TempDir()
	for _, c := range [][]string{{"mkfs.ext4", "-q", "-F", g.dev}, {"mount", g.dev, mnt}} {
		if out, err := exec.Command(c[0], c[1:]...).CombinedOutput(); err != nil {
			t.Fatalf("%v: %v\n%s", c, err, out)
		}
	}
	defer exec.Command("umount", "-l", mnt).Run()
	fio := exec.Command("fio", "--name=verify", "--filename="+filepath.Join(mnt, "verify.dat"), "--size=32M",
		"--rw=randwrite", "--bs=4k", "--ioengine=libaio", "--direct=1", "--iodepth=16", "--verify=crc32c",
		"--do_verify=1", "--verify_fatal=1")
	var fioOut bytes.Buffer
	fio.Stdout, fio.Stderr = &fioOut, &fioOut
	if err := fio.Start(); err != nil {
		t.Fatal(err)
	}
	fioDone := make(chan error, 1)
	go func() { fioDone <- fio.Wait() }()
	t.Cleanup(func() { fio.Process.Kill() })
	base := filepath.Base(g.dev)
	for i := range 3 {
		waitMoreWrites(t, base, 200+int64(time.Now().UnixNano()%800))
		t0 := time.Now()
		out, err := exec.Command(bin, "restart", "gw-nbd-planned", "--run-dir", runDir).CombinedOutput()
		if err != nil {
			t.Fatalf("restart %d: %v\n%s\n%s", i+1, err, out, g.stderr.String())
		}
		g.waitLogCount(t, "nbd device reattached", i+1, time.Minute)
		t.Logf("restart %d: %s reattached %v after the request (%s)", i+1, g.dev, time.Since(t0), bytes.TrimSpace(out))
		g.checkSameProcess(t, pid)
	}
	for _, l := range strings.Split(g.stderr.String(), "\n") {
		if strings.Contains(l, "re-executing for a planned restart") {
			t.Logf("log: %s", l)
		}
	}
	if n := strings.Count(g.stderr.String(), "re-executing for a planned restart"); n != 3 {
		t.Fatalf("%d re-exec lines in the log, want 3", n)
	}
	select {
	case err := <-fioDone:
		if err != nil {
			t.Fatalf("fio: %v\n%s", err, fioOut.String())
		}
		t.Logf("fio: %s", lastLine(fioOut.String(), "err="))
	case <-time.After(4 * time.Minute):
		t.Fatal("fio still running 4 min after the last restart")
	}
	if out, _ := exec.Command("sh", "-c", "dmesg | grep -i 'I/O error' | grep "+base).CombinedOutput(); len(bytes.TrimSpace(out)) != 0 {
		t.Fatalf("kernel I/O errors for %s:\n%s", base, out)
	}
	for _, c := range [][]string{{"umount", mnt}, {"fsck.ext4", "-fn", g.dev}} {
		if out, err := exec.Command(c[0], c[1:]...).CombinedOutput(); err != nil {
			t.Fatalf("%v: %v\n%s", c, err, out)
		}
	}
	g.cmd.Process.Signal(os.Interrupt)
	if err := <-g.exited; err != nil {
		t.Fatalf("detach: %v\n%s", err, g.stderr.String())
	}
}

// waitLogCount waits until msg is in the gateway's log n times.
func (g *gateway) waitLogCount(t *testing.T, msg string, n int, within time.Duration) {
	t.Helper()
	deadline := time.Now().Add(within)
	for strings.Count(g.stderr.String(), msg) < n {
		if time.Now().After(deadline) {
			t.Fatalf("%q not %d times in the gateway's log within %v:\n%s", msg, n, within, g.stderr.String())
		}
		time.Sleep(50 * time.Millisecond) // polling the log, not synchronising
	}
}

// checkSameProcess requires the gateway to be running as pid still.
func (g *gateway) checkSameProcess(t *testing.T, pid int) {
	t.Helper()
	if g.cmd.ProcessState != nil {
		t.Fatalf("the gateway exited: %v", g.cmd.ProcessState)
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
