package holders

import (
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

// fakeTree builds a /dev node (a real block device node, major 250 minor 7, made with mknod),
// and /proc and /sys trees that describe it as "fake0" with one partition fake0p1 (250:8):
// fake0p1 mounted at "/mnt/my data", fake0 held by dm-3, fake0 open in PID 4242, this
// process's own fd to it (to be skipped) as PID 1000.
func fakeTree(t *testing.T) (dev string, f Finder) {
	t.Helper()
	root := t.TempDir()
	dev = filepath.Join(root, "fake0")
	if err := unix.Mknod(dev, unix.S_IFBLK|0o600, int(unix.Mkdev(250, 7))); err != nil {
		t.Fatalf("mknod (tests run as root): %v", err)
	}
	sys, proc := filepath.Join(root, "sys"), filepath.Join(root, "proc")
	mkdir(t, sys, "devices/virtual/block/fake0/holders/dm-3")
	mkdir(t, sys, "dev/block")
	symlink(t, filepath.Join(sys, "devices/virtual/block/fake0"), filepath.Join(sys, "dev/block/250:7"))
	mkdir(t, sys, "block")
	symlink(t, filepath.Join(sys, "devices/virtual/block/fake0"), filepath.Join(sys, "block/fake0"))
	mkdir(t, sys, "devices/virtual/block/fake0/fake0p1/holders")
	write(t, filepath.Join(sys, "devices/virtual/block/fake0/fake0p1/partition"), "1\n")
	write(t, filepath.Join(sys, "devices/virtual/block/fake0/fake0p1/dev"), "250:8\n")
	mkdir(t, proc, "self")
	write(t, filepath.Join(proc, "self/mountinfo"),
		"22 1 8:1 / / rw,relatime shared:1 - ext4 /dev/sda1 rw\n"+
			"90 22 250:8 / /mnt/my\\040data rw,relatime shared:50 - xfs /dev/fake0p1 rw\n")
	for _, pid := range []string{"4242", "1000"} {
		mkdir(t, proc, pid+"/fd")
		symlink(t, "/dev/null", filepath.Join(proc, pid, "fd/0"))
		symlink(t, dev, filepath.Join(proc, pid, "fd/5"))
		symlink(t, dev, filepath.Join(proc, pid, "fd/6")) // twice: one holder line
	}
	write(t, filepath.Join(proc, "4242/comm"), "mkfs.xfs\n")
	return dev, Finder{ProcRoot: proc, SysRoot: sys, SkipPID: 1000}
}

func TestFindReportsMountsStackedAndOpeners(t *testing.T) {
	dev, f := fakeTree(t)
	hs, err := f.Find(dev)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, h := range hs {
		got = append(got, h.String())
	}
	sort.Strings(got)
	want := []string{
		"fake0 is held by dm-3",
		"fake0 is open in PID 4242 (mkfs.xfs)",
		"fake0p1 is mounted at /mnt/my data",
	}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Fatalf("holders:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}

func TestFindRejectsNonBlockDevices(t *testing.T) {
	if _, err := Find("/dev/null"); err == nil || !strings.Contains(err.Error(), "not a block device") {
		t.Fatalf("Find(/dev/null) = %v", err)
	}
	if _, err := Find(filepath.Join(t.TempDir(), "missing")); err == nil {
		t.Fatal("Find of a missing path succeeded")
	}
}

// TestFindOnTheRealSystem: on this host's /proc and /sys, a child process holding a loop
// device open is reported, and this process's own fd to it is not.
func TestFindOnTheRealSystem(t *testing.T) {
	const dev = "/dev/loop7" // the dev hosts and CI have loop devices; 7 is rarely bound
	own, err := os.Open(dev)
	if err != nil {
		t.Fatal(err)
	}
	defer own.Close()
	child := exec.Command("sleep", "60")
	child.ExtraFiles = []*os.File{own}
	if err := child.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = child.Process.Kill(); _ = child.Wait() }()
	hs, err := Find(dev)
	if err != nil {
		t.Fatal(err)
	}
	var sawChild bool
	for _, h := range hs {
		if h.Kind == "open" && strings.HasPrefix(h.What, "PID "+strconv.Itoa(os.Getpid())+" ") {
			t.Errorf("own fd reported: %v", h)
		}
		if h.Kind == "open" && h.What == "PID "+strconv.Itoa(child.Process.Pid)+" (sleep)" {
			sawChild = true
		}
	}
	if !sawChild {
		t.Fatalf("child holding %s not reported: %v", dev, hs)
	}
}

func TestUnescapeMount(t *testing.T) {
	for in, want := range map[string]string{`/a\040b`: "/a b", `/x\134y`: `/x\y`, `/tail\04`: `/tail\04`, `/plain`: "/plain"} {
		if got := unescapeMount(in); got != want {
			t.Errorf("unescapeMount(%q) = %q, want %q", in, got, want)
		}
	}
}

func mkdir(t *testing.T, base, rel string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Join(base, rel), 0o755); err != nil {
		t.Fatal(err)
	}
}

func symlink(t *testing.T, target, link string) {
	t.Helper()
	if err := os.Symlink(target, link); err != nil {
		t.Fatal(err)
	}
}

func write(t *testing.T, path, s string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(s), 0o644); err != nil {
		t.Fatal(err)
	}
}
