//go:build vm

package systemd_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/iser-blk/iser-blk/internal/status"
	"github.com/iser-blk/iser-blk/internal/syncbuf"
	"github.com/iser-blk/iser-blk/test/vm/vmtest"
)

// cmdTimeout bounds any one command (systemctl start waits for READY=1; a stop for the flush).
const cmdTimeout = 4 * time.Minute

// run runs a command and returns its combined output and exit status (-1: did not run or timed
// out); it never fails the test.
func run(name string, args ...string) (string, int) {
	ctx, cancel := context.WithTimeout(context.Background(), cmdTimeout)
	defer cancel()
	var out bytes.Buffer
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Stdout, cmd.Stderr = &out, &out
	cmd.WaitDelay = 5 * time.Second
	err := cmd.Run()
	if ctx.Err() != nil {
		return out.String() + "\n(timed out after " + cmdTimeout.String() + ")", -1
	}
	if err != nil && cmd.ProcessState == nil {
		return err.Error(), -1
	}
	return out.String(), cmd.ProcessState.ExitCode()
}

// must runs a command and fails the test unless it exits 0.
func must(t *testing.T, name string, args ...string) string {
	t.Helper()
	out, code := run(name, args...)
	if code != 0 {
		t.Fatalf("%s %s: exit %d\n%s", name, strings.Join(args, " "), code, out)
	}
	return out
}

var (
	installMu sync.Mutex
	installed bool // make install ran in this guest (and no make uninstall since)
)

// requireSystemd fails the test unless it runs in the guest with systemd as PID 1, and installs
// the unit there with `make install` unless it is installed (the binary gotest.sh built, not
// rebuilt in the guest).
func requireSystemd(t *testing.T) {
	t.Helper()
	requirePID1(t)
	installMu.Lock()
	defer installMu.Unlock()
	if installed {
		return
	}
	bin, root := os.Getenv("ISERBLK_BIN"), os.Getenv("ISERBLK_ROOT")
	if bin == "" || root == "" {
		t.Fatalf("ISERBLK_BIN (%q) and ISERBLK_ROOT (%q) must be set", bin, root)
	}
	// -o build: the binary is built already; the tree is read-only in the guest
	if out, code := run("make", "-C", root, "-o", "build", "install", "BIN="+bin); code != 0 {
		t.Fatalf("make install: exit %d\n%s", code, out)
	}
	for _, f := range []string{"/usr/local/bin/iser-blk", "/etc/systemd/system/iser-blk@.service",
		"/usr/local/libexec/iser-blk/iser-blk-unit-stop"} {
		if _, err := os.Stat(f); err != nil {
			t.Fatalf("make install did not install %s: %v", f, err)
		}
	}
	must(t, "systemctl", "daemon-reload")
	installed = true
}

// requirePID1 fails the test unless it runs in the guest with systemd as PID 1.
func requirePID1(t *testing.T) {
	t.Helper()
	vmtest.Require(t)
	comm, _ := os.ReadFile("/proc/1/comm")
	if strings.TrimSpace(string(comm)) != "systemd" {
		t.Fatalf("PID 1 is %q, not systemd: run with VM_INIT=systemd (test/vm/run.sh)", strings.TrimSpace(string(comm)))
	}
}

// withoutMakeInstall runs `make uninstall` if an earlier test installed with make install, so
// that a test of the Debian package sees only the package's files (make install's unit in
// /etc/systemd/system would shadow the package's); the next requireSystemd installs again.
func withoutMakeInstall(t *testing.T) {
	t.Helper()
	installMu.Lock()
	defer installMu.Unlock()
	if !installed {
		return
	}
	must(t, "make", "-C", os.Getenv("ISERBLK_ROOT"), "uninstall")
	must(t, "systemctl", "daemon-reload")
	installed = false
}

// gateway is one instance iser-blk@NAME of the installed unit.
type gateway struct {
	name, unit string
}

// newGateway writes /etc/iser-blk/NAME.conf (and a drop-in when dropIn is not empty) and
// arranges for the unit to be stopped and forgotten when the test ends, with its journal in the
// test log if the test failed.
func newGateway(t *testing.T, name, conf, dropIn string) gateway {
	t.Helper()
	g := gateway{name: name, unit: "iser-blk@" + name + ".service"}
	if err := os.MkdirAll("/etc/iser-blk", 0o700); err != nil {
		t.Fatal(err)
	}
	confPath := "/etc/iser-blk/" + name + ".conf"
	if err := os.WriteFile(confPath, []byte(conf), 0o600); err != nil {
		t.Fatal(err)
	}
	dir := "/run/systemd/system/" + g.unit + ".d"
	if dropIn != "" {
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, "test.conf"), []byte(dropIn), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	must(t, "systemctl", "daemon-reload")
	t.Cleanup(func() {
		if t.Failed() {
			out, _ := run("journalctl", "-u", g.unit, "--no-pager", "-o", "short-monotonic")
			t.Logf("journal of %s:\n%s", g.unit, lastLines(out, 80))
		}
		run("systemctl", "stop", g.unit)
		run("systemctl", "reset-failed", g.unit)
		os.Remove(confPath)
		os.RemoveAll(dir)
		run("systemctl", "daemon-reload")
	})
	return g
}

// start runs `systemctl start`, which returns once the gateway sent READY=1.
func (g gateway) start(t *testing.T) {
	t.Helper()
	t0 := time.Now()
	must(t, "systemctl", "start", g.unit)
	t.Logf("%s active %v after systemctl start", g.unit, time.Since(t0).Round(time.Millisecond))
}

// show returns the unit's properties.
func (g gateway) show(t *testing.T, props ...string) map[string]string {
	t.Helper()
	args := []string{"show", g.unit}
	for _, p := range props {
		args = append(args, "-p", p)
	}
	m := map[string]string{}
	for _, l := range strings.Split(must(t, "systemctl", args...), "\n") {
		if k, v, ok := strings.Cut(l, "="); ok {
			m[k] = v
		}
	}
	return m
}

func (g gateway) mainPID(t *testing.T) int {
	t.Helper()
	pid, err := strconv.Atoi(g.show(t, "MainPID")["MainPID"])
	if err != nil {
		t.Fatal(err)
	}
	return pid
}

// status is `iser-blk status NAME --json` of the running gateway.
func (g gateway) status(t *testing.T) status.Status {
	t.Helper()
	out := must(t, "/usr/local/bin/iser-blk", "status", g.name, "--json")
	var st status.Status
	if err := json.Unmarshal([]byte(out), &st); err != nil {
		t.Fatalf("status %s: %v\n%s", g.name, err, out)
	}
	return st
}

// device is the kernel device the running gateway serves; it must exist as a block device.
func (g gateway) device(t *testing.T) string {
	t.Helper()
	dev := g.status(t).Gateway.FrontendPath
	fi, err := os.Stat(dev)
	if err != nil || fi.Mode()&os.ModeDevice == 0 {
		t.Fatalf("%s serves %q, which is not a block device (%v)", g.unit, dev, err)
	}
	return dev
}

// waitFor polls cond every 200 ms until it holds, failing the test after timeout with the last
// state cond described.
func waitFor(t *testing.T, what string, timeout time.Duration, cond func() (bool, string)) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		ok, state := cond()
		if ok {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s; last: %s", timeout, what, state)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// target starts an LIO target over TCP with a 128 MiB RAM LUN (torn down when the test ends,
// after the unit is stopped: register it before the gateway).
func target(t *testing.T, o vmtest.LIOOptions) vmtest.LIOTarget {
	t.Helper()
	o.NoISER = true
	if o.SizeMiB == 0 {
		o.SizeMiB = 128
	}
	return vmtest.StartLIO(t, o)
}

// conf is the content of NAME.conf for `attach` with these flags.
func conf(args ...string) string {
	return "ISERBLK_COMMAND=attach\nISERBLK_ARGS=" + strings.Join(args, " ") + "\n"
}

// writes is the number of writes the kernel completed on dev (/sys/block/NAME/stat).
func writes(dev string) int64 {
	b, err := os.ReadFile("/sys/block/" + filepath.Base(dev) + "/stat")
	if err != nil {
		return -1
	}
	f := strings.Fields(string(b))
	if len(f) < 5 {
		return -1
	}
	n, _ := strconv.ParseInt(f[4], 10, 64)
	return n
}

// fioVerify is a background fio that writes a file or device with 4 KiB random direct writes
// (QD16), then reads every block back and checks it.
type fioVerify struct {
	done chan error
	out  *syncbuf.Buffer
	ios  int64
}

func startFio(t *testing.T, file string, sizeMiB int) *fioVerify {
	t.Helper()
	f := &fioVerify{done: make(chan error, 1), out: &syncbuf.Buffer{}, ios: int64(sizeMiB) << 8}
	cmd := exec.Command("fio", "--name=verify", "--filename="+file, fmt.Sprintf("--size=%dM", sizeMiB),
		"--rw=randwrite", "--bs=4k", "--ioengine=libaio", "--direct=1", "--iodepth=16",
		"--verify=crc32c", "--do_verify=1", "--verify_fatal=1", "--output-format=json")
	cmd.Stdout, cmd.Stderr = f.out, f.out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { f.done <- cmd.Wait() }()
	t.Cleanup(func() { cmd.Process.Kill() })
	return f
}

// wait requires fio to end within timeout with exit 0, no job error, and every block written
// and verified.
func (f *fioVerify) wait(t *testing.T, timeout time.Duration) {
	t.Helper()
	var err error
	select {
	case err = <-f.done:
	case <-time.After(timeout):
		t.Fatalf("fio still running after %v:\n%s", timeout, lastLines(f.out.String(), 20))
	}
	if err != nil {
		t.Fatalf("fio: %v\n%s", err, lastLines(f.out.String(), 30))
	}
	b := []byte(f.out.String())
	if i := bytes.IndexByte(b, '{'); i > 0 {
		b = b[i:]
	}
	var r struct {
		Jobs []struct {
			Error int `json:"error"`
			Read  struct {
				TotalIOs int64 `json:"total_ios"`
			} `json:"read"`
			Write struct {
				TotalIOs int64 `json:"total_ios"`
			} `json:"write"`
		} `json:"jobs"`
	}
	if err := json.Unmarshal(b, &r); err != nil || len(r.Jobs) != 1 {
		t.Fatalf("fio json (%v):\n%s", err, b)
	}
	j := r.Jobs[0]
	if j.Error != 0 || j.Write.TotalIOs != f.ios || j.Read.TotalIOs != f.ios {
		t.Fatalf("fio: error %d, %d writes, %d verified reads (want 0, %d, %d)", j.Error, j.Write.TotalIOs, j.Read.TotalIOs, f.ios, f.ios)
	}
	t.Logf("fio: %d writes, %d verified reads, 0 errors", j.Write.TotalIOs, j.Read.TotalIOs)
}

// noKernelIOErrors requires dmesg to hold no I/O error for dev.
func noKernelIOErrors(t *testing.T, dev string) {
	t.Helper()
	out, _ := run("dmesg")
	for _, l := range strings.Split(out, "\n") {
		if strings.Contains(l, filepath.Base(dev)) && strings.Contains(strings.ToLower(l), "error") {
			t.Fatalf("kernel I/O error on %s: %s", dev, l)
		}
	}
}

func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
