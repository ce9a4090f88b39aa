//go:build vm

package nbd

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/iser-blk/iser-blk/internal/syncbuf"
	"github.com/iser-blk/iser-blk/test/vm/vmtest"
)

// startGateway runs `iser-blk attach` with args and waits for the device path
// (vmtest.StartGateway, which stops the process and shows its log when the test ends).
func startGateway(t *testing.T, args ...string) *vmtest.Gateway {
	t.Helper()
	bin := os.Getenv("ISERBLK_BIN")
	if bin == "" {
		t.Fatal("ISERBLK_BIN is not set (test/vm/run.sh go-test builds the CLI)")
	}
	return vmtest.StartGateway(t, exec.Command(bin, append([]string{"attach"}, args...)...), vmtest.GatewayOptions{})
}

// TestVMReattachKill9 is acceptance 2 (kernel NBD, cache off, 4 connections): ext4 under fio
// verify, the gateway killed with -9 three times and started again at once: the same /dev/nbdX
// gets fresh sockets (NBD_CMD_RECONFIGURE), fio ends without an error, fsck is clean.
func TestVMReattachKill9(t *testing.T) {
	requireNBD(t)
	lio := vmtest.StartLIO(t, vmtest.LIOOptions{File: true, SizeMiB: 256, NoISER: true})
	args := []string{"--target", lio.URL("iscsi"), "--nbd", "/dev/nbd3", "--connections", "4",
		"--cache", "off", "--name", "gw-nbd", "--run-dir", t.TempDir()}
	g := startGateway(t, args...)
	if got := sysBlock(t, g.Device, "backend"); !strings.HasPrefix(got, "iser-blk:gw-nbd:") {
		t.Fatalf("backend identifier %q does not name the gateway", got)
	}
	mnt, fioDone, fioOut, firstWrite := mountAndVerify(t, g.Device)
	base := filepath.Base(g.Device)
	for i := range 3 {
		vmtest.WaitWrites(t, base, vmtest.KillAt(firstWrite, i), nil)
		g.Stop() // SIGKILL
		t0 := time.Now()
		next := startGateway(t, args...)
		if next.Device != g.Device {
			t.Fatalf("restart %d: device %q, want %q; log:\n%s", i+1, next.Device, g.Device, next.Stderr.String())
		}
		waitLogCount(t, next, "nbd device reattached", 1, 10*time.Second)
		t.Logf("restart %d: %s has new connections %v after kill -9", i+1, next.Device, time.Since(t0))
		g = next
	}
	finishVerify(t, fioDone, fioOut, g.Device, mnt)
	g.Detach(t, "detach")
}

// fioSize is what mountAndVerify's fio writes: 4,096 writes of 4 KiB, then a read of each to
// verify. The three kills or restarts land by the device's 2,900th write since fio started
// (vmtest.KillAt), so fio is still writing at the last one. Most of what the two tests that use it take
// (about 110 s each under TCG) is not fio's writing but the kernel's request timer: the requests
// in flight when the old sockets close are requeued on the new ones only when it fires, 30 s
// after they were sent (dmesg: "Connection timed out, retrying", 29.7 s after each kill).
const fioSize = 16 << 20

// mountAndVerify makes ext4 on dev, mounts it and starts fio verify on a file in it (4 KiB random
// writes, libaio, direct, QD16) after clearing the kernel log. firstWrite is the device's count
// of completed writes just before fio starts.
func mountAndVerify(t *testing.T, dev string) (mnt string, fioDone chan error, fioOut *syncbuf.Buffer, firstWrite int64) {
	t.Helper()
	exec.Command("dmesg", "-C").Run()
	mnt = t.TempDir()
	for _, c := range [][]string{{"mkfs.ext4", "-q", "-F", dev}, {"mount", dev, mnt}} {
		if out, err := exec.Command(c[0], c[1:]...).CombinedOutput(); err != nil {
			t.Fatalf("%v: %v\n%s", c, err, out)
		}
	}
	t.Cleanup(func() { exec.Command("umount", "-l", mnt).Run() })
	firstWrite = vmtest.DiskWrites(t, dev)
	fio := exec.Command("fio", "--name=verify", "--filename="+filepath.Join(mnt, "verify.dat"), "--size="+strconv.Itoa(fioSize),
		"--rw=randwrite", "--bs=4k", "--ioengine=libaio", "--direct=1", "--iodepth=16", "--verify=crc32c",
		"--do_verify=1", "--verify_fatal=1")
	fioOut = &syncbuf.Buffer{}
	fio.Stdout, fio.Stderr = fioOut, fioOut
	if err := fio.Start(); err != nil {
		t.Fatal(err)
	}
	fioDone = make(chan error, 1)
	go func() { fioDone <- fio.Wait() }()
	t.Cleanup(func() { fio.Process.Kill() })
	return mnt, fioDone, fioOut, firstWrite
}

// finishVerify waits for fio to end without a verify or I/O error (fio exits non-zero on
// either), requires no kernel I/O error for dev, unmounts mnt and requires a clean fsck.
func finishVerify(t *testing.T, fioDone chan error, fioOut *syncbuf.Buffer, dev, mnt string) {
	t.Helper()
	select {
	case err := <-fioDone:
		if err != nil {
			t.Fatalf("fio: %v\n%s", err, fioOut.String())
		}
	case <-time.After(4 * time.Minute):
		t.Fatal("fio still running 4 min after the last restart")
	}
	base := filepath.Base(dev)
	if out, _ := exec.Command("sh", "-c", "dmesg | grep -i 'I/O error' | grep "+base).CombinedOutput(); len(bytes.TrimSpace(out)) != 0 {
		t.Fatalf("kernel I/O errors for %s:\n%s", base, out)
	}
	for _, c := range [][]string{{"umount", mnt}, {"fsck.ext4", "-fn", dev}} {
		if out, err := exec.Command(c[0], c[1:]...).CombinedOutput(); err != nil {
			t.Fatalf("%v: %v\n%s", c, err, out)
		}
	}
}

// TestVMReattachWriteBackDirty is acceptance 3 for kernel NBD: after kill -9 of a write-back
// gateway under writes, the gateway started again reattaches the device but answers every request
// with EIO (within 2 s), and its log says why.
func TestVMReattachWriteBackDirty(t *testing.T) {
	requireNBD(t)
	lio := vmtest.StartLIO(t, vmtest.LIOOptions{File: true, SizeMiB: 128, NoISER: true})
	args := []string{"--target", lio.URL("iscsi"), "--nbd", "/dev/nbd4", "--connections", "2",
		"--cache", "writeback", "--name", "gw-nbd-wb", "--run-dir", t.TempDir()}
	g := startGateway(t, args...)
	dd := exec.Command("dd", "if=/dev/urandom", "of="+g.Device, "bs=4k", "count=100000", "oflag=direct")
	if err := dd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { dd.Process.Kill() })
	vmtest.WaitWrites(t, g.Device, vmtest.DiskWrites(t, g.Device)+500, nil)
	g.Stop() // SIGKILL
	next := startGateway(t, args...)
	if next.Device != g.Device {
		t.Fatalf("successor attached %s, want %s", next.Device, g.Device)
	}
	took := vmtest.ExpectEIO(t, next.Device, 1<<20, 2*time.Second)
	t.Logf("read failed with EIO %v after the successor announced the device", took)
	waitLogCount(t, next, "NOT resuming the device", 1, 10*time.Second)
	next.Detach(t, "detach of the fenced device")
}
