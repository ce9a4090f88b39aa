//go:build vm

package nbd

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"fmt"
	"math/big"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zaptest"
	"golang.org/x/sys/unix"

	"github.com/iser-blk/iser-blk/backend/memdev"
	"github.com/iser-blk/iser-blk/test/vm/vmtest"
)

// These tests run inside the QEMU guest (test/vm/run.sh go-test ./frontend/nbd): the host kernel
// has no nbd driver.

func requireNBD(t *testing.T) {
	t.Helper()
	vmtest.Require(t)
	vmtest.LoadModules(t, "nbd")
}

func sysBlock(t *testing.T, dev, attr string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("/sys/block", filepath.Base(dev), attr))
	if err != nil {
		t.Fatal(err)
	}
	return strings.TrimSpace(string(b))
}

// checkKernelFlags: the transmission flags reached the kernel — a volatile write cache with FUA
// (so filesystems send flushes), discard and write-zeroes enabled.
func checkKernelFlags(t *testing.T, dev string, size int64) {
	t.Helper()
	if got := sysBlock(t, dev, "queue/write_cache"); got != "write back" {
		t.Errorf("%s write_cache = %q, want \"write back\"", dev, got)
	}
	if got := sysBlock(t, dev, "queue/fua"); got != "1" {
		t.Errorf("%s fua = %q, want 1", dev, got)
	}
	if n, _ := strconv.ParseInt(sysBlock(t, dev, "queue/discard_max_bytes"), 10, 64); n <= 0 {
		t.Errorf("%s discard_max_bytes = %d, want > 0", dev, n)
	}
	if n, _ := strconv.ParseInt(sysBlock(t, dev, "queue/write_zeroes_max_bytes"), 10, 64); n <= 0 {
		t.Errorf("%s write_zeroes_max_bytes = %d, want > 0", dev, n)
	}
	if n, _ := strconv.ParseInt(sysBlock(t, dev, "size"), 10, 64); n*512 != size {
		t.Errorf("%s size = %d sectors, want %d bytes", dev, n, size)
	}
}

// TestVMAttachFlagsAndFlush attaches in-process (netlink, then the ioctl path) and proves that an
// fsync on /dev/nbdX arrives as a Flush on the device, and that the data written through the
// kernel is what the device holds. On the ioctl path it first sends signals, aimed at the
// NBD_DO_IT thread and to the whole process, which must not end the device.
func TestVMAttachFlagsAndFlush(t *testing.T) {
	requireNBD(t)
	for _, tc := range []struct {
		name  string
		ioctl bool
		conns int
		dev   string
	}{{"netlink", false, 4, ""}, {"ioctl", true, 2, "/dev/nbd3"}} {
		t.Run(tc.name, func(t *testing.T) {
			mem, err := memdev.New(256<<20, memdev.Options{})
			if err != nil {
				t.Fatal(err)
			}
			dev := &countingDevice{Device: mem}
			srv, err := NewServer(dev, Options{Logger: zaptest.NewLogger(t, zaptest.Level(zap.InfoLevel))})
			if err != nil {
				t.Fatal(err)
			}
			a, err := Attach(srv, AttachOptions{Device: tc.dev, Connections: tc.conns, ForceIoctl: tc.ioctl,
				DeadConnTimeout: 10 * time.Second, Logger: zaptest.NewLogger(t)})
			if err != nil {
				t.Fatalf("Attach: %v", err)
			}
			if a.viaNetlink == tc.ioctl {
				t.Fatalf("attached via netlink=%v", a.viaNetlink)
			}
			t.Logf("attached %s (netlink=%v, %d connections)", a.Path(), a.viaNetlink, tc.conns)
			if tc.ioctl {
				// NBD_DO_IT waits interruptibly: a signal landing on its thread used to end the
				// wait and zero the device (seen as "size = 0 sectors" and ENOSPC, and as EBUSY
				// on the restarted ioctl). Aim signals straight at that thread.
				tid := int(a.doItTID.Load())
				for i := 0; i < 50; i++ {
					if err := unix.Tgkill(os.Getpid(), tid, unix.SIGCHLD); err != nil {
						t.Fatalf("tgkill: %v", err)
					}
					if err := unix.Tgkill(os.Getpid(), tid, unix.SIGURG); err != nil {
						t.Fatalf("tgkill: %v", err)
					}
				}
				sigterms := sendProcessSIGTERMs(t, tid, 50)
				defer func() { t.Logf("%d of 50 process-directed SIGTERMs reached signal.Notify", sigterms()) }()
			}
			checkKernelFlags(t, a.Path(), 256<<20)

			f, err := os.OpenFile(a.Path(), os.O_RDWR|unix.O_DIRECT, 0)
			if err != nil {
				t.Fatal(err)
			}
			buf := alignedBuf(1 << 20)
			rand.Read(buf)
			before := dev.flushes.Load()
			if _, err := f.WriteAt(buf, 8<<20); err != nil {
				t.Fatal(err)
			}
			if err := f.Sync(); err != nil {
				t.Fatal(err)
			}
			if dev.flushes.Load() == before {
				t.Error("fsync on the nbd device did not reach Device.Flush")
			}
			got := make([]byte, 1<<20)
			if err := mem.ReadAt(context.Background(), got, 8<<20); err != nil || !bytes.Equal(got, buf) {
				t.Errorf("device content differs after write through %s (%v)", a.Path(), err)
			}
			back := alignedBuf(1 << 20)
			if _, err := f.ReadAt(back, 8<<20); err != nil || !bytes.Equal(back, buf) {
				t.Errorf("read back through %s differs (%v)", a.Path(), err)
			}
			// BLKDISCARD reaches the device as Discard.
			rng := [2]uint64{16 << 20, 1 << 20}
			if _, _, e := unix.Syscall(unix.SYS_IOCTL, f.Fd(), unix.BLKDISCARD, uintptrOf(&rng)); e != 0 {
				t.Errorf("BLKDISCARD: %v", e)
			} else if mem.Stats().Discards == 0 {
				t.Error("discard did not reach the device")
			}
			f.Close()
			if tc.ioctl {
				select {
				case err := <-a.doItErr:
					t.Fatalf("NBD_DO_IT ended before Detach: %v", err)
				default:
				}
			}
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			if err := a.Detach(ctx); err != nil {
				t.Fatalf("Detach: %v", err)
			}
			select {
			case <-a.Done():
			default:
				t.Error("connections still open after Detach")
			}
			if err := srv.Shutdown(ctx); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// sendProcessSIGTERMs sends n SIGTERMs to the whole process, as a service manager or a shell
// would, while the test catches them with signal.Notify (stopped when the test ends). The kernel
// routes a process-directed signal to any thread that does not block it, so without the mask
// Attach sets on the NBD_DO_IT thread (tid) some could land there and end the device. Which
// thread takes one is the kernel's choice (it prefers the main thread while that has none
// pending), so 50 signals need not hit tid even without the mask: the check that tid blocks
// SIGTERM is what fails without it. It then waits for the first to reach the channel; the count it
// returns is of those that arrived by the time it is called (pending signals of one kind merge,
// so fewer than n may). The device must keep working: the caller's I/O checks come after.
func sendProcessSIGTERMs(t *testing.T, tid, n int) (received func() int) {
	t.Helper()
	if !sigBlocked(t, tid, unix.SIGTERM) {
		t.Fatalf("the NBD_DO_IT thread %d does not block SIGTERM", tid)
	}
	ch := make(chan os.Signal, n)
	signal.Notify(ch, syscall.SIGTERM)
	t.Cleanup(func() { signal.Stop(ch) }) // SIGTERM's handling returns to what it was
	for range n {
		if err := unix.Kill(os.Getpid(), unix.SIGTERM); err != nil {
			t.Fatalf("kill: %v", err)
		}
	}
	got := 0
	select {
	case <-ch:
		got++
	case <-time.After(30 * time.Second): // a guard against a lost signal, not a wait for one
		t.Fatal("no SIGTERM reached signal.Notify within 30 s")
	}
	return func() int {
		for {
			select {
			case <-ch:
				got++
			default:
				return got
			}
		}
	}
}

// sigBlocked reports whether thread tid of this process blocks sig (SigBlk in its
// /proc/<pid>/task/<tid>/status: a hex mask with bit sig-1 for sig).
func sigBlocked(t *testing.T, tid int, sig unix.Signal) bool {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/self/task/%d/status", tid))
	if err != nil {
		t.Fatal(err)
	}
	for line := range strings.Lines(string(b)) {
		if hex, ok := strings.CutPrefix(line, "SigBlk:"); ok {
			mask, err := strconv.ParseUint(strings.TrimSpace(hex), 16, 64)
			if err != nil {
				t.Fatalf("SigBlk of thread %d: %v", tid, err)
			}
			return mask&(1<<(sig-1)) != 0
		}
	}
	t.Fatalf("no SigBlk in the status of thread %d", tid)
	return false
}

// TestVMAttachExt4 is the acceptance workload through the CLI: `iser-blk attach` with 4
// connections, ext4 with 2000 files of random sizes, sync, umount, fsck clean, remount, every
// checksum verified, fstrim, detach on SIGTERM with exit 0.
func TestVMAttachExt4(t *testing.T) {
	requireNBD(t)
	ext4Workload(t, "mem://1GiB", "/dev/nbd1", 1<<30)
}

// TestVMAttachExt4LIO runs the same workload with the kernel's own iSCSI target (LIO, fileio
// LUN) behind the gateway over iSCSI/TCP.
func TestVMAttachExt4LIO(t *testing.T) {
	requireNBD(t)
	lio := vmtest.StartLIO(t, vmtest.LIOOptions{File: true, SizeMiB: 512, NoISER: true})
	// Thin provisioning (UNMAP and WRITE SAME with UNMAP) is off by default on LIO backstores;
	// turn it on so that the LUN can discard and NBD TRIM / fstrim have something to reach.
	attrs, _ := filepath.Glob("/sys/kernel/config/target/core/fileio_*/*/attrib")
	if len(attrs) != 1 {
		t.Fatalf("expected one LIO fileio backstore, found %v", attrs)
	}
	for _, a := range []string{"emulate_tpu", "emulate_tpws"} {
		if err := os.WriteFile(filepath.Join(attrs[0], a), []byte("1"), 0); err != nil {
			t.Fatalf("LIO %s: %v", a, err)
		}
	}
	ext4Workload(t, lio.URL("iscsi"), "/dev/nbd2", lio.SizeBytes)
}

func ext4Workload(t *testing.T, target, nbdDev string, size int64) {
	t.Helper()
	bin := os.Getenv("ISERBLK_BIN")
	if bin == "" {
		t.Fatal("ISERBLK_BIN is not set (test/vm/run.sh go-test builds the CLI)")
	}
	g := vmtest.StartGateway(t, exec.Command(bin, "attach", "--target", target, "--nbd", nbdDev, "--connections", "4"),
		vmtest.GatewayOptions{})
	dev := g.Device
	if dev != nbdDev {
		t.Fatalf("attach printed %q: %s", dev, g.Stderr)
	}
	checkKernelFlags(t, dev, size)

	mnt := t.TempDir()
	sh := func(name string, args ...string) string {
		t.Helper()
		out, err := exec.Command(name, args...).CombinedOutput()
		if err != nil {
			t.Fatalf("%s %s: %v\n%s", name, strings.Join(args, " "), err, out)
		}
		return string(out)
	}
	sh("mkfs.ext4", "-q", "-F", dev)
	sh("mount", dev, mnt)
	mounted := true
	t.Cleanup(func() {
		if mounted {
			exec.Command("umount", mnt).Run()
		}
	})
	sums := map[string][32]byte{}
	for i := range 2000 {
		n, _ := rand.Int(rand.Reader, big.NewInt(96<<10)) // 0..96 KiB: many extents, bounded run time under TCG
		data := make([]byte, n.Int64())
		rand.Read(data)
		name := filepath.Join(fmt.Sprintf("d%02d", i%50), fmt.Sprintf("f%04d", i))
		if err := os.MkdirAll(filepath.Join(mnt, filepath.Dir(name)), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(mnt, name), data, 0o644); err != nil {
			t.Fatal(err)
		}
		sums[name] = sha256.Sum256(data)
	}
	sh("sync")
	sh("umount", mnt)
	mounted = false
	out := sh("fsck.ext4", "-fn", dev)
	t.Logf("fsck: %s", strings.TrimSpace(out))
	// Drop the page cache so the verification reads come from the device, not memory.
	os.WriteFile("/proc/sys/vm/drop_caches", []byte("3"), 0)
	sh("mount", dev, mnt)
	mounted = true
	for name, want := range sums {
		data, err := os.ReadFile(filepath.Join(mnt, name))
		if err != nil {
			t.Fatal(err)
		}
		if sha256.Sum256(data) != want {
			t.Fatalf("%s: checksum differs after remount", name)
		}
	}
	t.Logf("verified %d files", len(sums))
	t.Logf("fstrim: %s", strings.TrimSpace(sh("fstrim", "-v", mnt)))
	sh("umount", mnt)
	mounted = false

	if err := g.Cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case <-g.Exited:
		if g.Err != nil {
			t.Fatalf("attach exited with %v: %s", g.Err, g.Stderr)
		}
	case <-time.After(2 * time.Minute):
		t.Fatalf("attach did not exit after SIGTERM: %s", g.Stderr)
	}
	if !strings.Contains(g.Stderr.String(), "nbd device detached") {
		t.Errorf("no detach logged: %s", g.Stderr)
	}
	if n := sysBlock(t, dev, "size"); n != "0" {
		t.Errorf("%s still has size %s after detach", dev, n)
	}
}
