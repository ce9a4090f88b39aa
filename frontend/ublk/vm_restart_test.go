//go:build vm

package ublk

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestVMPlannedRestart is issue 17's planned-restart acceptance on ublk: ext4 on /dev/ublkbN with
// the write-back cache under fio verify, `iser-blk restart NAME` three times: the same device and
// the same PID throughout (the binary re-executes itself), the log says how much was written back
// before each re-exec, fio ends without a verify or I/O error, no kernel I/O error, fsck clean.
func TestVMPlannedRestart(t *testing.T) {
	bin := requireCLI(t)
	logKernelRecoveryFeatures(t)
	target := lioTarget(t)
	runDir := t.TempDir()
	args := []string{"--cache", "writeback", "--name", "gw-planned", "--run-dir", runDir}
	p := startServer(t, target, 2, 64, args...)
	defer watchdog(t, p, 8*time.Minute)()
	pid := p.cmd.Process.Pid
	run(t, "dmesg", "-C")
	run(t, "mkfs.ext4", "-q", "-F", p.path)
	mnt := t.TempDir()
	run(t, "mount", p.path, mnt)
	defer exec.Command("umount", "-l", mnt).Run()
	_, fioDone, fioOut := startFioVerify(t, filepath.Join(mnt, "verify.dat"))
	base := filepath.Base(p.path)
	for i := range 3 {
		_, w, _ := diskStat(base)
		waitWrites(t, base, w+300+int64(randUint32()%1500))
		t0 := time.Now()
		out := run(t, bin, "restart", "gw-planned", "--run-dir", runDir)
		waitLogCount(t, p, "ublk device recovered", i+1, 60*time.Second)
		t.Logf("restart %d: %s served again %v after the request (%s)", i+1, p.path, time.Since(t0), strings.TrimSpace(out))
		checkSameProcess(t, p, pid, bin)
		if _, err := os.Stat(p.path); err != nil {
			t.Fatalf("restart %d: %v", i+1, err)
		}
	}
	if n := strings.Count(p.stderr.String(), "re-executing for a planned restart"); n != 3 {
		t.Fatalf("%d re-exec lines in the log, want 3", n)
	}
	for _, l := range strings.Split(p.stderr.String(), "\n") {
		if strings.Contains(l, "re-executing for a planned restart") {
			if !strings.Contains(l, "written_back_bytes") {
				t.Fatalf("the re-exec line does not say what was written back: %s", l)
			}
			t.Logf("log: %s", l)
		}
	}
	finishVerify(t, fioDone, fioOut, p.path, mnt)
	p.terminate(t, 60*time.Second)
}

// waitLogCount waits until msg is in the server's log n times.
func waitLogCount(t *testing.T, p *serverProc, msg string, n int, within time.Duration) {
	t.Helper()
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	deadline := time.After(within)
	for strings.Count(p.stderr.String(), msg) < n {
		select {
		case <-tick.C:
		case <-p.exited:
			t.Fatalf("server exited (%v) before logging %q %d times", p.err, msg, n)
		case <-deadline:
			t.Fatalf("%q not %d times in the server's log within %v", msg, n, within)
		}
	}
}

// checkSameProcess requires the gateway to run as the same PID, from bin.
func checkSameProcess(t *testing.T, p *serverProc, pid int, bin string) {
	t.Helper()
	select {
	case <-p.exited:
		t.Fatalf("the gateway exited: %v", p.err)
	default:
	}
	exe, err := os.Readlink(fmt.Sprintf("/proc/%d/exe", pid))
	if err != nil {
		t.Fatalf("pid %d: %v", pid, err)
	}
	want, _ := filepath.EvalSymlinks(bin)
	if exe != want && exe != bin {
		t.Fatalf("pid %d runs %s, want %s", pid, exe, bin)
	}
}
