//go:build vm

package ublk

import (
	"bytes"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/iser-blk/iser-blk/internal/syncbuf"
	"github.com/iser-blk/iser-blk/test/vm/vmtest"
)

// Issue 17: the gateway's own restart. These tests run the CLI (attach --ublk --name) against a
// LIO LUN, whose data outlives the killed gateway (a mem:// LUN would die with it).

// logKernelRecoveryFeatures records which recovery flags the guest's kernel has.
func logKernelRecoveryFeatures(t *testing.T) {
	c, err := OpenControl("")
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	f, err := c.Features()
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("ublk features %#x: USER_RECOVERY %v, REISSUE %v, FAIL_IO %v", f,
		f&FeatUserRecovery != 0, f&FeatUserRecoveryReissue != 0, f&FeatUserRecoveryFailIO != 0)
	if f&FeatUserRecovery == 0 {
		t.Fatal("the guest kernel lacks UBLK_F_USER_RECOVERY")
	}
}

// Depth 64 with fio at QD16: a queue whose every tag is in flight when the server dies is
// quiesced only at the driver's request timeout (see orphanWait), which the test would wait for.

// TestVMRestartKill9 is acceptance 1: ext4 on /dev/ublkbN under fio verify, the gateway killed
// with -9 three times and started again at once; same device, fio without an error, no kernel
// I/O error, fsck clean.
func TestVMRestartKill9(t *testing.T) {
	t.Run("off", func(t *testing.T) { testRestartKill9(t, "off") })
	t.Run("writethrough", func(t *testing.T) { testRestartKill9(t, "writethrough") })
}

func testRestartKill9(t *testing.T, cacheMode string) {
	requireCLI(t)
	logKernelRecoveryFeatures(t)
	target := lioTarget(t)
	args := []string{"--cache", cacheMode, "--name", "gw-" + cacheMode, "--run-dir", t.TempDir()}
	p := startServer(t, target, 2, 64, args...)
	defer watchdog(t, p, 6*time.Minute)()
	run(t, "dmesg", "-C")
	run(t, "mkfs.ext4", "-q", "-F", p.path)
	mnt := t.TempDir()
	run(t, "mount", p.path, mnt)
	defer exec.Command("umount", "-l", mnt).Run()
	fioCmd, fioDone, fioOut := startFioVerify(t, filepath.Join(mnt, "verify.dat"))
	_ = fioCmd
	base := filepath.Base(p.path)
	for i := range 3 {
		_, w, _ := diskStat(base)
		waitWrites(t, base, w+300+int64(randUint32()%1500)) // a random point in the run
		p.cmd.Process.Kill()
		<-p.exited
		t0 := time.Now()
		next := startServer(t, target, 2, 64, args...)
		if next.path != p.path {
			t.Fatalf("restart %d: device %s, want %s", i+1, next.path, p.path)
		}
		waitLog(t, next, "ublk device recovered", 10*time.Second) // stderr is copied by another goroutine
		t.Logf("restart %d: %s served again %v after kill -9", i+1, next.path, time.Since(t0))
		p = next
	}
	finishVerify(t, fioDone, fioOut, p.path, mnt)
	p.terminate(t, 60*time.Second)
	if _, err := os.Stat(filepath.Join(args[5], args[3]+".json")); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("state file left after a clean detach: %v", err)
	}
}

// finishVerify waits for fio verify to end without an error, then requires no kernel I/O error
// for dev, unmounts mnt and requires fsck to find the filesystem clean.
func finishVerify(t *testing.T, fioDone chan error, fioOut *syncbuf.Buffer, dev, mnt string) {
	t.Helper()
	select {
	case err := <-fioDone:
		checkFioVerify(t, err, fioOut)
	case <-time.After(4 * time.Minute):
		t.Fatal("fio still running 4 min after the last restart")
	}
	base := filepath.Base(dev)
	if out, _ := exec.Command("sh", "-c", "dmesg | grep -i 'error' | grep -i "+base).CombinedOutput(); len(bytes.TrimSpace(out)) != 0 {
		t.Fatalf("kernel I/O errors for %s:\n%s", base, out)
	}
	run(t, "umount", mnt)
	run(t, "fsck.ext4", "-fn", dev)
}

// startFioVerify writes a file in the filesystem with 4 KiB random writes (libaio, direct,
// QD16), then verifies every block.
func startFioVerify(t *testing.T, file string) (*exec.Cmd, chan error, *syncbuf.Buffer) {
	t.Helper()
	out := &syncbuf.Buffer{}
	cmd := exec.Command("fio", "--name=verify", "--filename="+file, "--size=48M", "--rw=randwrite",
		"--bs=4k", "--ioengine=libaio", "--direct=1", "--iodepth=16", "--verify=crc32c",
		"--do_verify=1", "--verify_fatal=1", "--output-format=json")
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	t.Cleanup(func() { cmd.Process.Kill() })
	return cmd, done, out
}

// checkFioVerify requires fio's exit 0, no job error and every block written and verified.
func checkFioVerify(t *testing.T, err error, out *syncbuf.Buffer) {
	t.Helper()
	if err != nil {
		t.Fatalf("fio: %v\n%s", err, lastLines(out.String(), 30))
	}
	b := []byte(out.String())
	if i := bytes.IndexByte(b, '{'); i > 0 {
		b = b[i:]
	}
	var r fioResult
	if err := json.Unmarshal(b, &r); err != nil {
		t.Fatalf("fio json: %v\n%s", err, b)
	}
	for _, j := range r.Jobs {
		if j.Error != 0 || j.Write.TotalIOs != 12288 || j.Read.TotalIOs != 12288 {
			t.Fatalf("fio job %s: error %d, %d writes, %d verified reads (want 0, 12288, 12288)", j.Name, j.Error, j.Write.TotalIOs, j.Read.TotalIOs)
		}
		t.Logf("fio: %d writes, %d verified reads, 0 errors", j.Write.TotalIOs, j.Read.TotalIOs)
	}
}

// TestVMRestartWriteBackDirty is acceptance 3: kill -9 of a write-back gateway while fio writes;
// the gateway started again fails I/O with EIO within 2 s and says why; data written and flushed
// before the kill reads back intact after a detach and a fresh attach.
func TestVMRestartWriteBackDirty(t *testing.T) {
	requireCLI(t)
	target := lioTarget(t)
	args := []string{"--cache", "writeback", "--name", "gw-wb", "--run-dir", t.TempDir()}
	p := startServer(t, target, 2, 64, args...)
	defer watchdog(t, p, 5*time.Minute)()
	// 1 MiB flushed before the kill, at 200 MiB (fio below stays in the first 64 MiB).
	want := make([]byte, 1<<20)
	for i := range want {
		want[i] = byte(randUint32())
	}
	src := filepath.Join(t.TempDir(), "fsynced")
	if err := os.WriteFile(src, want, 0o600); err != nil {
		t.Fatal(err)
	}
	run(t, "dd", "if="+src, "of="+p.path, "bs=1M", "seek=200", "oflag=direct", "conv=fsync", "status=none")
	_, fioDone, fioOut := startFio(t, p.path)
	waitWrites(t, filepath.Base(p.path), 1000)
	p.cmd.Process.Kill()
	<-p.exited
	next := startServer(t, target, 2, 64, args...)
	if next.path != p.path {
		t.Fatalf("successor created %s, want the same %s", next.path, p.path)
	}
	took := vmtest.ExpectEIO(t, next.path, 0, 2*time.Second)
	t.Logf("read failed with EIO %v after the successor announced the device", took)
	waitLog(t, next, "NOT resuming the device", 10*time.Second)
	if !strings.Contains(next.stderr.String(), "fsck") {
		t.Fatalf("the successor's log does not say what to do:\n%s", next.stderr.String())
	}
	st, err := exec.Command(os.Getenv("ISERBLK_BIN"), "status", "gw-wb", "--run-dir", args[5]).CombinedOutput()
	if err != nil || !strings.Contains(string(st), "failed: device fenced") || !strings.Contains(string(st), "fsck") {
		t.Fatalf("status does not say the device is fenced and why (%v):\n%s", err, st)
	}
	t.Logf("status of the fenced gateway:\n%s", st)
	select {
	case err := <-fioDone:
		t.Logf("fio ended: %v\n%s", err, lastLines(fioOut.String(), 4))
		if err == nil {
			t.Fatal("fio succeeded on a fenced device")
		}
	case <-time.After(30 * time.Second):
		t.Fatal("fio hangs on the fenced device")
	}
	next.terminate(t, 60*time.Second)
	fresh := startServer(t, target, 2, 64, args...)
	if strings.Contains(fresh.stderr.String(), "NOT resuming") {
		t.Fatal("a fresh attach after the detach is still fenced")
	}
	got := filepath.Join(t.TempDir(), "readback")
	run(t, "dd", "if="+fresh.path, "of="+got, "bs=1M", "skip=200", "count=1", "iflag=direct", "status=none")
	b, err := os.ReadFile(got)
	if err != nil {
		t.Fatal(err)
	}
	if sha256.Sum256(b) != sha256.Sum256(want) {
		t.Fatal("data fsynced before the kill did not survive")
	}
	fresh.terminate(t, 60*time.Second)
	fmt.Fprintln(os.Stderr, "write-back dirty restart: fenced, EIO, fsynced data intact")
}
