//go:build vm

package systemd_test

import (
	"context"
	"encoding/binary"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/iser-blk/iser-blk/test/vm/vmtest"
)

// udevRule is where the test installs contrib/udev/60-iser-blk.rules; its program,
// /usr/local/bin/iser-blk, is the binary requireSystemd's make install put there.
const udevRule = "/etc/udev/rules.d/60-iser-blk.rules"

// startUdev installs the rule and runs systemd-udevd (masked in the guest: its coldplug costs
// ~20 s under TCG, and this test needs only the events of its own devices) as a transient unit,
// stopped when the test ends so that the package's other tests run without udev as before.
func startUdev(t *testing.T) {
	t.Helper()
	rule, err := os.ReadFile(filepath.Join(os.Getenv("ISERBLK_ROOT"), "contrib/udev/60-iser-blk.rules"))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Dir(udevRule), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(udevRule, rule, 0o644); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.Remove(udevRule) })
	must(t, "systemd-run", "--unit=iserblk-test-udevd", "--service-type=notify", "/lib/systemd/systemd-udevd")
	t.Cleanup(func() {
		if t.Failed() {
			out, _ := run("journalctl", "-u", "iserblk-test-udevd", "--no-pager", "-o", "short-monotonic")
			t.Logf("journal of udevd:\n%s", lastLines(out, 60))
		}
		run("systemctl", "stop", "iserblk-test-udevd")
		run("systemctl", "reset-failed", "iserblk-test-udevd")
	})
	must(t, "udevadm", "control", "--reload")
}

// TestUdevLinks: with 60-iser-blk.rules under a real udev, a named gateway's disk is
// /dev/iser-blk/NAME — nbd through the backend identifier, ublk (with --ublk-id 7, which must
// give /dev/ublkb7) through the state file written before START_DEV — an nbd partition is
// /dev/iser-blk/NAME-part1, and the link goes when
// systemctl stop detaches the device. A second attach asking for the taken ublk number fails
// with exit 2 and says so.
func TestUdevLinks(t *testing.T) {
	requireSystemd(t)
	vmtest.LoadModules(t, "nbd", "ublk")
	startUdev(t)
	for _, tc := range []struct{ name, frontend, dev string }{
		{"udev-nbd", "--nbd /dev/nbd5", "/dev/nbd5"},
		{"udev-ublk", "--ublk --queues 1 --depth 16 --ublk-id 7", "/dev/ublkb7"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			g := newGateway(t, tc.name, conf("--target", "mem://64MiB", tc.frontend, "--cache", "off"), "")
			g.start(t)
			if dev := g.device(t); dev != tc.dev {
				t.Fatalf("%s serves %s, want %s", g.unit, dev, tc.dev)
			}
			link := "/dev/iser-blk/" + tc.name
			must(t, "udevadm", "settle", "--timeout=120")
			waitFor(t, link+" → "+tc.dev, time.Minute, func() (bool, string) {
				got, err := filepath.EvalSymlinks(link)
				return err == nil && got == tc.dev, got + " " + errString(err)
			})
			props := must(t, "udevadm", "info", "--query=property", "--name="+tc.dev)
			if !strings.Contains(props, "ISER_BLK_NAME="+tc.name+"\n") || !strings.Contains(props, "ISER_BLK_TARGET=mem://64MiB\n") {
				t.Fatalf("udev properties of %s lack the gateway's name and target:\n%s", tc.dev, props)
			}
			if strings.HasPrefix(tc.dev, "/dev/ublkb") {
				takenID(t)
			} else {
				partitionLink(t, tc.dev, link)
			}
			must(t, "systemctl", "stop", g.unit)
			must(t, "udevadm", "settle", "--timeout=120")
			waitFor(t, link+" removed", time.Minute, func() (bool, string) {
				_, err := os.Lstat(link)
				return errors.Is(err, os.ErrNotExist), errString(err)
			})
		})
	}
}

// partitionLink writes an MBR with one partition on dev and requires udev to link it as
// LINK-part1 (the name imported from the disk).
func partitionLink(t *testing.T, dev, link string) {
	t.Helper()
	mbr := make([]byte, 512)
	entry := mbr[446:462]
	entry[4] = 0x83                                      // Linux
	binary.LittleEndian.PutUint32(entry[8:], 2048)       // first sector
	binary.LittleEndian.PutUint32(entry[12:], 16<<20>>9) // 16 MiB
	mbr[510], mbr[511] = 0x55, 0xaa
	f, err := os.OpenFile(dev, os.O_WRONLY|os.O_SYNC, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteAt(mbr, 0); err != nil {
		t.Fatal(err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	must(t, "blockdev", "--rereadpt", dev)
	must(t, "udevadm", "settle", "--timeout=120")
	part := dev + "p1"
	waitFor(t, link+"-part1 → "+part, time.Minute, func() (bool, string) {
		got, err := filepath.EvalSymlinks(link + "-part1")
		return err == nil && got == part, got + " " + errString(err)
	})
}

// takenID runs a second attach asking for /dev/ublkb7 while the gateway under test has it.
func takenID(t *testing.T) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "/usr/local/bin/iser-blk", "attach", "--target", "mem://64MiB",
		"--ublk", "--queues", "1", "--depth", "16", "--ublk-id", "7", "--run-dir", t.TempDir())
	out, err := cmd.CombinedOutput()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != 2 || !strings.Contains(string(out), "--ublk-id: the ublk device number is taken: /dev/ublkb7 exists already") {
		t.Fatalf("attach --ublk-id 7 while ublkb7 exists: %v (want exit 2 saying the number is taken)\n%s", err, lastLines(string(out), 20))
	}
	if _, err := os.Stat("/dev/ublkb7"); err != nil {
		t.Fatalf("the refused attach disturbed /dev/ublkb7: %v", err)
	}
}

func errString(err error) string {
	if err == nil {
		return "<nil>"
	}
	return err.Error()
}
