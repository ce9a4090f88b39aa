//go:build vm

package nbd

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/iser-blk/iser-blk/internal/syncbuf"
	"github.com/iser-blk/iser-blk/test/vm/vmtest"
)

// TestVMTargetOutageLongerThanTheKernelTimer: kernel NBD with two connections, no kernel request
// timeout (the default) and --replacement-timeout 120 s (the default), and a target that is gone
// for 40 s: longer than the 30 s after which the kernel's request timer fires even with no
// timeout set, requeues a write and, with more than one connection, closes the socket it was on.
// The writes that waited complete without an error once the target is back, and the device
// serves afterwards.
func TestVMTargetOutageLongerThanTheKernelTimer(t *testing.T) {
	requireNBD(t)
	lio := vmtest.StartLIO(t, vmtest.LIOOptions{SizeMiB: 64, NoISER: true})
	g := startGateway(t, "--target", lio.URL("iscsi"), "--nbd", "/dev/nbd6", "--cache", "off", "--connections", "2",
		"--name", "gw-outage", "--run-dir", t.TempDir())
	exec.Command("dmesg", "-C").Run()
	tpg := "/sys/kernel/config/target/iscsi/" + lio.IQN + "/tpgt_1/enable"
	if err := os.WriteFile(tpg, []byte("0\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	out := &syncbuf.Buffer{}
	// one writer on each CPU, so that both connections (the kernel's hardware queues) carry writes
	fio := exec.Command("fio", "--name=outage", "--filename="+g.Device, "--rw=randwrite", "--bs=4k", "--size=4M",
		"--ioengine=libaio", "--direct=1", "--iodepth=4", "--numjobs=2", "--cpus_allowed=0-1",
		"--cpus_allowed_policy=split", "--offset_increment=8M")
	fio.Stdout, fio.Stderr = out, out
	if err := fio.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- fio.Wait() }()
	select {
	case err := <-done:
		t.Fatalf("fio ended while the target was gone: %v\n%s", err, out)
	case <-time.After(40 * time.Second): // the outage's length: past the kernel's 30 s timer
	}
	if err := os.WriteFile(tpg, []byte("1\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	began := time.Now()
	select {
	case err := <-done:
		if err != nil {
			dm, _ := exec.Command("sh", "-c", "dmesg | tail -30").CombinedOutput()
			t.Fatalf("fio after a 40 s outage: %v\n%s\ndmesg:\n%s\ngateway:\n%s", err, out, dm, g.Stderr.String())
		}
	case <-time.After(2 * time.Minute):
		t.Fatal("fio still waiting 2 min after the target came back")
	}
	t.Logf("the writes completed %v after the target came back", time.Since(began).Round(time.Millisecond))
	base := filepath.Base(g.Device)
	dm, _ := exec.Command("sh", "-c", "dmesg | grep -i "+base).CombinedOutput()
	t.Logf("dmesg:\n%s", dm)
	if bytes.Contains(bytes.ToLower(dm), []byte("i/o error")) {
		t.Fatalf("kernel I/O errors for %s", base)
	}
	// The case under test happened: the kernel's timer fired during the outage, requeued a
	// write and closed the connection it was on (the gateway serves on with the other).
	if !bytes.Contains(dm, []byte("Connection timed out, retrying")) {
		t.Fatalf("the kernel's request timer did not fire during the 40 s outage: the test tested nothing")
	}
	if !strings.Contains(g.Stderr.String(), "the kernel closed one of the device's nbd connections") {
		t.Fatalf("the gateway did not log the connection the kernel closed:\n%s", g.Stderr.String())
	}
	if err := exec.Command("dd", "if="+g.Device, "of=/dev/null", "bs=1M", "count=4", "iflag=direct", "status=none").Run(); err != nil {
		t.Fatalf("read after the outage: %v\n%s", err, g.Stderr.String())
	}
	// with one connection left, the device still disconnects cleanly
	g.Detach(t, "detach after the outage")
	if vmtest.NBDServed(g.Device) {
		t.Fatalf("%s still has a client after the detach", g.Device)
	}
}
