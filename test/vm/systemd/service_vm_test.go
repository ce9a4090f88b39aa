//go:build vm

package systemd_test

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/iser-blk/iser-blk/test/vm/vmtest"
)

// TestStartActiveStopDetaches: `systemctl start` returns once the device serves (Type=notify),
// the unit is active with the gateway as its main process, and `systemctl stop` detaches: the
// device is gone and the unit inactive, not failed. NBD without cache and ublk write-through.
func TestStartActiveStopDetaches(t *testing.T) {
	requireSystemd(t)
	for _, tc := range []struct{ name, frontend, cache string }{
		{"nbd-off", "--nbd /dev/nbd2", "off"},
		{"ublk-writethrough", "--ublk --queues 1 --depth 64", "writethrough"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			vmtest.LoadModules(t, "nbd", "ublk")
			lio := target(t, vmtest.LIOOptions{})
			g := newGateway(t, "start-"+tc.name, conf("--target", lio.URL("iscsi"), tc.frontend, "--cache", tc.cache), "")
			g.start(t)
			if out, code := run("systemctl", "is-active", g.unit); code != 0 || strings.TrimSpace(out) != "active" {
				t.Fatalf("systemctl is-active %s: %q (exit %d)", g.unit, out, code)
			}
			dev := g.device(t)
			st := g.status(t)
			if pid := g.mainPID(t); pid != st.Gateway.PID {
				t.Fatalf("MainPID %d, but the gateway's PID is %d", pid, st.Gateway.PID)
			}
			if st.Gateway.State != "ready" {
				t.Fatalf("gateway state %q after READY=1, want ready", st.Gateway.State)
			}
			t.Logf("%s serves %s (pid %d)", g.unit, dev, st.Gateway.PID)
			must(t, "dd", "if=/dev/urandom", "of="+dev, "bs=4k", "count=256", "oflag=direct", "conv=fsync", "status=none")
			must(t, "systemctl", "stop", g.unit)
			p := g.show(t, "ActiveState", "Result")
			if p["ActiveState"] != "inactive" || p["Result"] != "success" {
				t.Fatalf("after systemctl stop: %v, want inactive and success", p)
			}
			gone := func() bool {
				if strings.HasPrefix(dev, "/dev/nbd") {
					return !vmtest.NBDServed(dev)
				}
				_, err := os.Stat(dev)
				return errors.Is(err, os.ErrNotExist)
			}
			if !gone() {
				t.Fatalf("%s still attached after systemctl stop (stop must detach)", dev)
			}
			out, _ := run("journalctl", "-u", g.unit, "-o", "cat", "--no-pager")
			if strings.Contains(out, "stop --keep") || strings.Contains(out, "keeping the device") {
				t.Fatalf("systemctl stop took the restart path:\n%s", lastLines(out, 20))
			}
		})
	}
}

// TestReloadKeepsPID: `systemctl reload` (iser-blk restart: a new image, same process) leaves
// the unit active with the same MainPID, also past TimeoutStopSec (shortened to 20 s by a
// drop-in): systemd must not have been told STOPPING=1 for a reload. Needs RELOADING=1 from the
// gateway.
func TestReloadKeepsPID(t *testing.T) {
	requireSystemd(t)
	vmtest.LoadModules(t, "nbd")
	lio := target(t, vmtest.LIOOptions{})
	g := newGateway(t, "reload", conf("--target", lio.URL("iscsi"), "--nbd /dev/nbd3", "--cache", "writeback"),
		"[Service]\nTimeoutStopSec=20s\n")
	g.start(t)
	dev := g.device(t)
	pid := g.mainPID(t)
	must(t, "dd", "if=/dev/urandom", "of="+dev, "bs=4k", "count=256", "oflag=direct", "status=none")
	t0 := time.Now()
	must(t, "systemctl", "reload", g.unit)
	t.Logf("systemctl reload returned after %v", time.Since(t0).Round(time.Millisecond))
	// Watch for 35 s, longer than TimeoutStopSec: a unit left in a stop state would be killed.
	until := time.Now().Add(35 * time.Second)
	for time.Now().Before(until) {
		p := g.show(t, "ActiveState", "SubState", "MainPID")
		if p["ActiveState"] != "active" || p["SubState"] != "running" || p["MainPID"] != strconv.Itoa(pid) {
			t.Fatalf("%v after systemctl reload, want active/running with MainPID %d", p, pid)
		}
		time.Sleep(time.Second)
	}
	if got := g.device(t); got != dev {
		t.Fatalf("after reload the gateway serves %s, want %s", got, dev)
	}
	if st := g.status(t); st.Gateway.State != "ready" || st.Gateway.PID != pid {
		t.Fatalf("after reload: state %q pid %d, want ready and %d", st.Gateway.State, st.Gateway.PID, pid)
	}
	must(t, "dd", "if="+dev, "of=/dev/null", "bs=4k", "count=256", "iflag=direct", "status=none")
}

// TestRestartKeepsMountedFS: `systemctl restart` while fio verifies a file on ext4 on the
// device: the unit's stop keeps the device (iser-blk stop --keep), the new process takes it
// over, fio ends without an error, the device is the same. Needs `iser-blk stop --keep`.
func TestRestartKeepsMountedFS(t *testing.T) {
	requireSystemd(t)
	vmtest.LoadModules(t, "nbd")
	lio := target(t, vmtest.LIOOptions{})
	g := newGateway(t, "restart", conf("--target", lio.URL("iscsi"), "--nbd /dev/nbd4", "--cache", "writeback"), "")
	g.start(t)
	dev := g.device(t)
	pid := g.mainPID(t)
	run("dmesg", "-C")
	must(t, "mkfs.ext4", "-q", "-F", dev)
	mnt := t.TempDir()
	must(t, "mount", dev, mnt)
	t.Cleanup(func() { run("umount", "-l", mnt) })
	fio := startFio(t, filepath.Join(mnt, "verify.dat"), 32)
	w0 := writes(dev)
	waitFor(t, "fio to write", 2*time.Minute, func() (bool, string) {
		return writes(dev) > w0+500, fmt.Sprintf("%d writes", writes(dev)-w0)
	})
	t0 := time.Now()
	must(t, "systemctl", "restart", g.unit)
	t.Logf("systemctl restart returned after %v", time.Since(t0).Round(time.Millisecond))
	out, _ := run("journalctl", "-u", g.unit, "-o", "cat", "--no-pager")
	if !strings.Contains(out, "keeping the device") {
		t.Errorf("the restart did not take the stop --keep path:\n%s", lastLines(out, 30))
	}
	if p := g.show(t, "ActiveState", "MainPID"); p["ActiveState"] != "active" || p["MainPID"] == strconv.Itoa(pid) {
		t.Fatalf("after systemctl restart: %v, want active with a new MainPID (was %d)", p, pid)
	}
	if got := g.device(t); got != dev {
		t.Fatalf("after restart the gateway serves %s, want the same %s", got, dev)
	}
	// The sockets waited in systemd's descriptor store: the successor served the very
	// connections the kernel kept sending on, so none waited for its request timer (30 s by
	// default), and the store holds nothing any more.
	out, _ = run("journalctl", "-u", g.unit, "-o", "cat", "--no-pager")
	if !strings.Contains(out, "descriptor store for the successor") || !strings.Contains(out, "the previous gateway's connections go on") {
		t.Errorf("the connections did not go through the descriptor store:\n%s", lastLines(out, 40))
	}
	if p := g.show(t, "NFileDescriptorStore"); p["NFileDescriptorStore"] != "0" {
		t.Errorf("the descriptor store still holds %s descriptors after the successor took them", p["NFileDescriptorStore"])
	}
	dm, _ := run("dmesg")
	for _, l := range strings.Split(dm, "\n") {
		if strings.Contains(l, filepath.Base(dev)) && (strings.Contains(l, "timed out") || strings.Contains(l, "Dead connection") || strings.Contains(l, "Receive control failed")) {
			t.Errorf("the kernel saw a connection of %s fail during the restart: %s", dev, l)
		}
	}
	fio.wait(t, 5*time.Minute)
	noKernelIOErrors(t, dev)
	must(t, "umount", mnt)
	must(t, "fsck.ext4", "-fn", dev)
}

// TestKill9RestartTakesOver: kill -9 of the main process; Restart= starts a successor that
// takes the device over while fio verifies on it: fio ends without an error, the device is the
// same, NRestarts is 1. NBD without cache and ublk write-through.
func TestKill9RestartTakesOver(t *testing.T) {
	requireSystemd(t)
	for _, tc := range []struct{ name, frontend, cache string }{
		{"nbd-off", "--nbd /dev/nbd5", "off"},
		{"ublk-writethrough", "--ublk --queues 1 --depth 64", "writethrough"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			vmtest.LoadModules(t, "nbd", "ublk")
			lio := target(t, vmtest.LIOOptions{})
			g := newGateway(t, "kill-"+tc.name, conf("--target", lio.URL("iscsi"), tc.frontend, "--cache", tc.cache), "")
			g.start(t)
			dev := g.device(t)
			pid := g.mainPID(t)
			run("dmesg", "-C")
			fio := startFio(t, dev, 32)
			w0 := writes(dev)
			waitFor(t, "fio to write", 2*time.Minute, func() (bool, string) {
				return writes(dev) > w0+500, fmt.Sprintf("%d writes", writes(dev)-w0)
			})
			if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
				t.Fatal(err)
			}
			t0 := time.Now()
			waitFor(t, "Restart= to bring the unit back", 3*time.Minute, func() (bool, string) {
				p := g.show(t, "ActiveState", "SubState", "MainPID")
				return p["ActiveState"] == "active" && p["SubState"] == "running" &&
					p["MainPID"] != "0" && p["MainPID"] != strconv.Itoa(pid), fmt.Sprint(p)
			})
			t.Logf("active again %v after kill -9", time.Since(t0).Round(time.Millisecond))
			if p := g.show(t, "NRestarts"); p["NRestarts"] != "1" {
				t.Fatalf("NRestarts=%s, want 1", p["NRestarts"])
			}
			if got := g.device(t); got != dev {
				t.Fatalf("the successor serves %s, want the same %s", got, dev)
			}
			fio.wait(t, 5*time.Minute)
			noKernelIOErrors(t, dev)
		})
	}
}

// TestBadCHAPFailsWithoutRetrying: a wrong CHAP secret makes the gateway exit 3, which
// RestartPreventExitStatus= keeps from being retried: the unit ends failed after one start and
// stays failed.
func TestBadCHAPFailsWithoutRetrying(t *testing.T) {
	requireSystemd(t)
	vmtest.LoadModules(t, "nbd")
	lio := target(t, vmtest.LIOOptions{CHAP: &vmtest.Credentials{User: "sduser", Secret: "right-secret-12"}})
	url := fmt.Sprintf("iscsi://sduser@%s/%s/%d", lio.Portal, lio.IQN, lio.LUN)
	g := newGateway(t, "badchap", conf("--target", url, "--nbd /dev/nbd6", "--cache", "off")+
		"ISERBLK_CHAP_SECRET=wrong-secret-12\n", "")
	if out, code := run("systemctl", "start", g.unit); code == 0 {
		t.Fatalf("systemctl start succeeded with a wrong CHAP secret:\n%s", out)
	}
	const props = "ActiveState,SubState,Result,NRestarts,ExecMainStatus"
	failed := func() (bool, string) {
		p := g.show(t, strings.Split(props, ",")...)
		return p["ActiveState"] == "failed", fmt.Sprint(p)
	}
	waitFor(t, "the unit to fail", 2*time.Minute, failed)
	p := g.show(t, strings.Split(props, ",")...)
	if p["ExecMainStatus"] != "3" || p["Result"] != "exit-code" {
		t.Fatalf("%v, want ExecMainStatus=3 (CHAP) and Result=exit-code", p)
	}
	if n, _ := strconv.Atoi(p["NRestarts"]); n > 2 {
		t.Fatalf("NRestarts=%d: more than 3 starts for a CHAP failure", n)
	}
	// It stays failed: no restart comes after RestartSec (5 s).
	until := time.Now().Add(12 * time.Second)
	for time.Now().Before(until) {
		if q := g.show(t, strings.Split(props, ",")...); q["ActiveState"] != "failed" || q["NRestarts"] != p["NRestarts"] {
			t.Fatalf("the unit was started again after a CHAP failure: %v (was %v)", q, p)
		}
		time.Sleep(time.Second)
	}
	t.Logf("failed after %s restarts: %v", p["NRestarts"], p)
}

// TestUnreachableTargetHitsStartLimit: a portal that refuses connections makes the gateway exit
// 5, which Restart= retries; the start limit (5 starts in 3 minutes, RestartSec=5s) stops the
// retries: the unit ends failed after 5 starts, the 6th refused by the limit.
func TestUnreachableTargetHitsStartLimit(t *testing.T) {
	requireSystemd(t)
	vmtest.LoadModules(t, "nbd")
	// nothing listens on 127.0.0.1:3261: every login attempt is refused at once
	g := newGateway(t, "unreachable", conf("--target", "iscsi://127.0.0.1:3261/iqn.2003-01.org.example:none/0",
		"--nbd /dev/nbd8", "--cache", "off"), "")
	t0 := time.Now()
	run("systemctl", "start", g.unit)
	const props = "ActiveState,Result,NRestarts,ExecMainStatus"
	waitFor(t, "the start limit", 3*time.Minute, func() (bool, string) {
		p := g.show(t, strings.Split(props, ",")...)
		return p["ActiveState"] == "failed", fmt.Sprint(p)
	})
	p := g.show(t, strings.Split(props, ",")...)
	t.Logf("failed %v after the first start: %v", time.Since(t0).Round(time.Second), p)
	// systemd 252 keeps the last run's Result (exit-code) when the limit refuses an automatic
	// restart; its journal says so
	if p["ExecMainStatus"] != "5" {
		t.Fatalf("%v, want ExecMainStatus=5 (unreachable)", p)
	}
	if n, _ := strconv.Atoi(p["NRestarts"]); n < 4 || n > 5 {
		t.Fatalf("NRestarts=%d, want 4 or 5 (5 starts, the 6th refused)", n)
	}
	out, _ := run("journalctl", "-u", g.unit, "-o", "cat", "--no-pager")
	starts := strings.Count(out, "Starting iser-blk@unreachable.service")
	if starts != 5 || !strings.Contains(out, "Start request repeated too quickly") {
		t.Fatalf("%d starts in the journal and no start limit, want 5 and the limit:\n%s", starts, lastLines(out, 40))
	}
}

// TestFinalFlushFailedAtErrPriority: a write-back gateway holds dirty data when its target goes
// away, then `systemctl stop`: the detach's write-back fails, SIGTERM's final flush fails, and
// `journalctl -p err` shows the FINAL FLUSH FAILED line, while the gateway's info lines are not
// at err.
func TestFinalFlushFailedAtErrPriority(t *testing.T) {
	requireSystemd(t)
	vmtest.LoadModules(t, "nbd")
	lio := target(t, vmtest.LIOOptions{})
	g := newGateway(t, "finalflush", conf("--target", lio.URL("iscsi"), "--nbd /dev/nbd7", "--cache", "writeback",
		"--replacement-timeout", "5s"), "")
	g.start(t)
	dev := g.device(t)
	// The target goes away (the TPG is disabled: logins are refused), then 1 MiB of 4 KiB
	// writes lands in the cache only.
	tpg := "/sys/kernel/config/target/iscsi/" + lio.IQN + "/tpgt_1/enable"
	if err := os.WriteFile(tpg, []byte("0\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	must(t, "dd", "if=/dev/urandom", "of="+dev, "bs=4k", "count=256", "oflag=direct", "status=none")
	run("systemctl", "stop", g.unit) // its status is the stop's: the flush failed
	waitFor(t, "the unit to stop", 3*time.Minute, func() (bool, string) {
		p := g.show(t, "ActiveState", "Result")
		return p["ActiveState"] == "inactive" || p["ActiveState"] == "failed", fmt.Sprint(p)
	})
	errs, _ := run("journalctl", "-u", g.unit, "-p", "err", "-o", "cat", "--no-pager")
	if !strings.Contains(errs, "FINAL FLUSH FAILED") {
		all, _ := run("journalctl", "-u", g.unit, "-o", "cat", "--no-pager")
		t.Fatalf("journalctl -p err has no FINAL FLUSH FAILED:\n%s\nall of the unit's journal:\n%s", errs, lastLines(all, 40))
	}
	info, _ := run("journalctl", "-u", g.unit, "-p", "info..info", "-o", "cat", "--no-pager")
	n := 0
	for _, l := range strings.Split(info, "\n") {
		if !strings.Contains(l, "\tINFO\t") {
			continue
		}
		n++
		if strings.Contains(errs, l) {
			t.Fatalf("an info line is at err priority: %q", l)
		}
	}
	if n == 0 {
		t.Fatalf("no gateway line at info priority (journalctl -p info..info):\n%s", lastLines(info, 20))
	}
	t.Logf("journalctl -p err:\n%s", lastLines(errs, 10))
}
