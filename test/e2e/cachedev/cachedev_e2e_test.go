//go:build e2e

// Package cachedev_test is the host end-to-end test of --cache-dev (issue 39): the real
// `iser-blk serve` over tgtd, with its persistent write-back log in a file, killed with SIGKILL
// while the target answers nothing, and started again with the same command.
package cachedev_test

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/iser-blk/iser-blk/test/e2e/gateway"
	"github.com/iser-blk/iser-blk/test/e2e/tgtd"
)

// qemuIO runs qemu-io commands against uri and fails the test if any fails.
func qemuIO(t *testing.T, uri string, cmds ...string) string {
	t.Helper()
	args := []string{"-f", "raw"}
	for _, c := range cmds {
		args = append(args, "-c", c)
	}
	out, err := exec.Command("qemu-io", append(args, uri)...).CombinedOutput()
	if err != nil || strings.Contains(string(out), "Pattern verification failed") || strings.Contains(string(out), "failed") {
		t.Fatalf("qemu-io %q: %v\n%s", cmds, err, out)
	}
	return string(out)
}

// writes is the workload: small writes (they go to the log) at scattered offsets, each with
// its own pattern, and one overwrite.
var writes = []struct {
	off, len int64
	pat      byte
}{{0, 4096, 0x11}, {1 << 20, 65536, 0x22}, {5 << 20, 8192, 0x33}, {0, 4096, 0x44}, {9<<20 + 4096, 131072, 0x55}}

func writeCmds() []string {
	var c []string
	for _, w := range writes {
		c = append(c, fmt.Sprintf("write -P %#x %d %d", w.pat, w.off, w.len))
	}
	return append(c, "flush")
}

func verifyCmds() []string {
	var c []string
	for i, w := range writes {
		if i == 0 { // overwritten by writes[3]
			continue
		}
		c = append(c, fmt.Sprintf("read -P %#x %d %d", w.pat, w.off, w.len))
	}
	return c
}

// TestE2ECacheDevSurvivesKill9: writes flushed to the cache device while the target is frozen
// survive a SIGKILL of the gateway; the same command recovers them (served again before the
// target has them), writes them back, and the target then holds them (read with --cache off).
func TestE2ECacheDevSurvivesKill9(t *testing.T) {
	tg := tgtd.Start(t, tgtd.Options{Size: 16 << 20})
	target := fmt.Sprintf("iscsi://%s/%s/%d", tg.Portal, tg.Name, tg.LUN)
	dev := filepath.Join(t.TempDir(), "cache.dev")
	args := []string{"--cache-dev", dev, "--cache-dev-size", "32MiB"}
	s := gateway.Start(t, target, args...)
	if err := tg.Pause(); err != nil {
		t.Fatal(err)
	}
	t0 := time.Now()
	qemuIO(t, s.URI, writeCmds()...) // FLUSH completes with the target frozen: local durability
	flushed := time.Since(t0)
	if err := syscall.Kill(s.PID(), syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	if err := s.Wait(t, 30*time.Second); err == nil {
		t.Fatal("the killed gateway exited 0")
	}
	if err := tg.Resume(); err != nil {
		t.Fatal(err)
	}
	t.Logf("writes and FLUSH with the target frozen took %v", flushed)

	runDir := t.TempDir()
	s2 := gateway.Start(t, target, append(args, "--name", "cd", "--run-dir", runDir)...)
	rec := s2.WaitLog(t, "cache device ready", 1, 10*time.Second)
	if strings.Contains(rec[0], `"batches recovered": 0`) {
		t.Fatalf("nothing recovered from the log: %s", rec[0])
	}
	t.Logf("restarted: %s", rec[0])
	qemuIO(t, s2.URI, verifyCmds()...)
	checkStatus(t, runDir, dev)
	detachReports(t, tg, s2, runDir)

	s3 := gateway.Start(t, target, "--cache", "off")
	qemuIO(t, s3.URI, verifyCmds()...)
	s3.Stop(t)
	s4 := gateway.Start(t, target, args...)
	ready := s4.WaitLog(t, "cache device ready", 1, 10*time.Second)
	if !strings.Contains(ready[0], `"recovered": "0 B"`) {
		t.Fatalf("the log was not empty after the stop's write-back: %s", ready[0])
	}
	s4.Stop(t)
}

// detachReports: `detach` writes the log back and reports what reached the target — the log's
// write-back, not the RAM cache's write-through into the log. The target is frozen until the
// detach has begun, so that the cleaner cannot write the log back before it (it would count for
// nothing then): all 204 KiB the writes left must be in the figure.
func detachReports(t *testing.T, tg *tgtd.Target, s *gateway.Server, runDir string) {
	t.Helper()
	if err := tg.Pause(); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(gateway.Binary(t), "detach", "cd", "--run-dir", runDir, "--timeout", "1m")
	res := make(chan error, 1)
	var out []byte
	go func() {
		var err error
		out, err = cmd.CombinedOutput()
		res <- err
	}()
	s.WaitLog(t, "writing the cache device's log back to the target", 1, 20*time.Second) // the detach began
	if err := tg.Resume(); err != nil {
		t.Fatal(err)
	}
	if err := <-res; err != nil || !strings.Contains(string(out), "204 KiB written back") {
		t.Fatalf("detach: %v, want success and \"204 KiB written back\":\n%s", err, out)
	}
	if err := s.Wait(t, 60*time.Second); err != nil {
		t.Fatalf("the gateway after detach: %v", err)
	}
}

// checkStatus: `iser-blk status --json` shows the cache device, its ring and index.
func checkStatus(t *testing.T, runDir, dev string) {
	t.Helper()
	out, err := exec.Command(gateway.Binary(t), "status", "cd", "--json", "--run-dir", runDir).Output()
	if err != nil {
		t.Fatalf("status: %v\n%s", err, out)
	}
	var st struct {
		Cache struct {
			Mode   string `json:"mode"`
			Device *struct {
				Path          string `json:"path"`
				CapacityBytes uint64 `json:"capacity_bytes"`
				IndexMemory   uint64 `json:"index_memory_bytes"`
			} `json:"device"`
		} `json:"cache"`
	}
	if err := json.Unmarshal(out, &st); err != nil {
		t.Fatalf("status --json: %v\n%s", err, out)
	}
	d := st.Cache.Device
	if d == nil || d.Path != dev || d.CapacityBytes != 32<<20-8192 || d.IndexMemory == 0 {
		t.Fatalf("status shows no (or a wrong) cache device: %s", out)
	}
}

// TestE2ECacheDevRefusesAnotherLUN: a cache device is never used for a LUN other than the one
// it was formatted for (its data would land on the wrong disk), nor one that holds other data,
// unless --cache-dev-format says so; a second gateway on a cache device in use is refused.
func TestE2ECacheDevRefusesAnotherLUN(t *testing.T) {
	tgA := tgtd.Start(t, tgtd.Options{Size: 16 << 20})
	tgB := tgtd.Start(t, tgtd.Options{Size: 16 << 20})
	urlA := fmt.Sprintf("iscsi://%s/%s/%d", tgA.Portal, tgA.Name, tgA.LUN)
	urlB := fmt.Sprintf("iscsi://%s/%s/%d", tgB.Portal, tgB.Name, tgB.LUN)
	dev := filepath.Join(t.TempDir(), "cache.dev")
	s := gateway.Start(t, urlA, "--cache-dev", dev, "--cache-dev-size", "32MiB")

	out, code := run(t, "serve", "--target", urlA, "--listen", "unix://"+filepath.Join(t.TempDir(), "x.sock"),
		"--run-dir", t.TempDir(), "--cache-dev", dev)
	if code == 0 || !strings.Contains(out, "in use by another process") {
		t.Fatalf("a second gateway on the same cache device: exit %d\n%s", code, out)
	}
	s.Stop(t)

	out, code = run(t, "serve", "--target", urlB, "--listen", "unix://"+filepath.Join(t.TempDir(), "y.sock"),
		"--run-dir", t.TempDir(), "--cache-dev", dev)
	if code == 0 || !strings.Contains(out, "cache-dev-format") || !strings.Contains(out, tgA.Name) {
		t.Fatalf("another LUN's cache device: exit %d\n%s", code, out)
	}
	junk := filepath.Join(t.TempDir(), "junk.dev")
	if err := os.WriteFile(junk, append([]byte("an ext4 superblock, say"), make([]byte, 32<<20)...), 0o600); err != nil {
		t.Fatal(err)
	}
	out, code = run(t, "serve", "--target", urlB, "--listen", "unix://"+filepath.Join(t.TempDir(), "z.sock"),
		"--run-dir", t.TempDir(), "--cache-dev", junk)
	if code == 0 || !strings.Contains(out, "holds data but no iser-blk cache") {
		t.Fatalf("a device holding other data: exit %d\n%s", code, out)
	}
	s2 := gateway.Start(t, urlB, "--cache-dev", dev, "--cache-dev-format")
	s2.WaitLog(t, "formatted the cache device", 1, 10*time.Second)
	qemuIO(t, s2.URI, "write -P 0x66 0 4096", "flush", "read -P 0x66 0 4096")
	s2.Stop(t)
}

// run runs the binary to completion (it must refuse before serving) and returns its output.
func run(t *testing.T, args ...string) (string, int) {
	t.Helper()
	cmd := exec.Command(gateway.Binary(t), args...)
	done := make(chan struct{})
	var out []byte
	var err error
	go func() { out, err = cmd.CombinedOutput(); close(done) }()
	select {
	case <-done:
	case <-time.After(time.Minute):
		cmd.Process.Kill()
		<-done
		t.Fatalf("iser-blk %v did not exit within a minute:\n%s", args, out)
	}
	if ee, ok := err.(*exec.ExitError); ok {
		return string(out), ee.ExitCode()
	}
	if err != nil {
		t.Fatal(err)
	}
	return string(out), 0
}
