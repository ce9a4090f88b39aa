package udevname

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/iser-blk/iser-blk/internal/modes"
	"github.com/iser-blk/iser-blk/internal/statefile"
)

// fakeSys is a /sys/block with the given devices: name → attribute files.
func fakeSys(t *testing.T, devs map[string]map[string]string) string {
	t.Helper()
	root := t.TempDir()
	for dev, attrs := range devs {
		dir := filepath.Join(root, dev)
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		for k, v := range attrs {
			if err := os.WriteFile(filepath.Join(dir, k), []byte(v), 0o644); err != nil {
				t.Fatal(err)
			}
		}
	}
	return root
}

var lun = statefile.Identity{Target: "iscsi://h/iqn.2003-01.org.example:disk/1", Size: 1 << 20, BlockSize: 512}

// writeState writes gateway name's state file naming ublk device id, written by pid at updated.
func writeState(t *testing.T, dir, name string, kind modes.Frontend, id, pid int, updated time.Time) {
	t.Helper()
	st := statefile.Fresh(name, kind, id, lun, modes.WriteThrough, pid)
	st.Updated = updated
	if err := statefile.Write(statefile.Path(dir, name), st); err != nil {
		t.Fatal(err)
	}
}

func TestLookupNBD(t *testing.T) {
	sys := fakeSys(t, map[string]map[string]string{
		"nbd0": {"size": "131072\n", "backend": BackendID("db", lun.Target) + "\n"},
		"nbd1": {"size": "0\n"},                                           // not configured
		"nbd2": {"size": "131072\n", "backend": "iser-blk:nbd2-export\n"}, // an unnamed gateway
		"nbd3": {"size": "131072\n"},                                      // configured through ioctls
	})
	for _, tt := range []struct {
		dev  string
		want Device
		ok   bool
	}{
		{"nbd0", Device{Name: "db", Target: lun.Target}, true},
		{"nbd1", Device{}, false},
		{"nbd2", Device{}, false},
		{"nbd3", Device{}, false},
	} {
		d, ok, err := Lookup(tt.dev, Options{SysBlock: sys, BackendWait: 20 * time.Millisecond})
		if err != nil || ok != tt.ok || d != tt.want {
			t.Errorf("Lookup(%s) = %+v, %v, %v; want %+v, %v, nil", tt.dev, d, ok, err, tt.want, tt.ok)
		}
	}
}

// TestLookupNBDWaitsForTheBackendFile: the kernel sends the connect uevent before it creates
// the backend file; a lookup that finds a size and no backend looks again until it appears.
func TestLookupNBDWaitsForTheBackendFile(t *testing.T) {
	sys := fakeSys(t, map[string]map[string]string{"nbd4": {"size": "8\n"}})
	type result struct {
		d   Device
		ok  bool
		err error
	}
	done := make(chan result, 1)
	go func() {
		d, ok, err := Lookup("nbd4", Options{SysBlock: sys, BackendWait: time.Minute})
		done <- result{d, ok, err}
	}()
	tmp := filepath.Join(sys, "nbd4", ".backend")
	if err := os.WriteFile(tmp, []byte(BackendID("late", "mem://4KiB")+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, filepath.Join(sys, "nbd4", "backend")); err != nil { // appears whole, as a sysfs file does
		t.Fatal(err)
	}
	r := <-done
	if r.err != nil || !r.ok || r.d.Name != "late" {
		t.Fatalf("Lookup = %+v, %v, %v; want the gateway late", r.d, r.ok, r.err)
	}
}

func TestLookupNBDGivesUpAtTheDeadline(t *testing.T) {
	sys := fakeSys(t, map[string]map[string]string{"nbd5": {"size": "8\n"}})
	t0 := time.Now()
	_, ok, err := Lookup("nbd5", Options{SysBlock: sys, BackendWait: 50 * time.Millisecond})
	if err != nil || ok {
		t.Fatalf("Lookup = %v, %v; want not ours", ok, err)
	}
	if d := time.Since(t0); d < 50*time.Millisecond || d > 10*time.Second {
		t.Fatalf("gave up after %v, want the 50ms wait", d)
	}
}

func TestLookupUblk(t *testing.T) {
	sys := fakeSys(t, map[string]map[string]string{"ublkb0": {}, "ublkb1": {}, "ublkb2": {}, "ublkb7": {}})
	run := t.TempDir()
	now := time.Now().UTC()
	self, dead := os.Getpid(), deadPID(t)
	writeState(t, run, "db", modes.Ublk, 0, self, now)
	writeState(t, run, "web", modes.NBD, 1, self, now) // an nbd gateway's number 1
	// ublkb2: the file of a gateway that died is older and loses to the live one's, and a
	// dead gateway's newer file still loses to a live one's.
	writeState(t, run, "old", modes.Ublk, 2, dead, now.Add(time.Hour))
	writeState(t, run, "new", modes.Ublk, 2, self, now)
	// ublkb7: two dead gateways' files: the newer wins (written just before START_DEV).
	writeState(t, run, "seven-a", modes.Ublk, 7, dead, now)
	writeState(t, run, "seven-b", modes.Ublk, 7, dead, now.Add(time.Minute))
	for _, tt := range []struct {
		dev, name string
		ok        bool
	}{
		{"ublkb0", "db", true},
		{"ublkb1", "", false},
		{"ublkb2", "new", true},
		{"ublkb7", "seven-b", true},
	} {
		d, ok, err := Lookup(tt.dev, Options{SysBlock: sys, RunDir: run})
		if err != nil || ok != tt.ok || d.Name != tt.name {
			t.Errorf("Lookup(%s) = %+v, %v, %v; want %q, %v", tt.dev, d, ok, err, tt.name, tt.ok)
		}
		if ok && d.Target != lun.Target {
			t.Errorf("Lookup(%s): target %q, want %q", tt.dev, d.Target, lun.Target)
		}
	}
}

// TestLookupUblkSkipsWhatIsNotAState: corrupt files, a file under another gateway's name, a
// FIFO (which would block a plain open) and a symbolic link are skipped, reported, and never
// make the lookup fail or hang; the one good file is still found.
func TestLookupUblkSkipsWhatIsNotAState(t *testing.T) {
	sys := fakeSys(t, map[string]map[string]string{"ublkb3": {}})
	run := t.TempDir()
	writeState(t, run, "good", modes.Ublk, 3, os.Getpid(), time.Now())
	for name, data := range map[string]string{
		"corrupt.json": "{not json",
		"huge.json":    `{"version":1,"name":"huge"` + strings.Repeat(" ", maxStateBytes) + "}",
		"empty.json":   "",
	} {
		if err := os.WriteFile(filepath.Join(run, name), []byte(data), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	st := statefile.Fresh("impostor", modes.Ublk, 3, lun, modes.Off, os.Getpid())
	st.Updated = time.Now().Add(time.Hour)
	if err := statefile.Write(filepath.Join(run, "renamed.json"), st); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Mkfifo(filepath.Join(run, "fifo.json"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(filepath.Join(run, "renamed.json"), filepath.Join(run, "link.json")); err != nil {
		t.Fatal(err)
	}
	var warned []string
	d, ok, err := Lookup("ublkb3", Options{SysBlock: sys, RunDir: run, Warn: func(e error) { warned = append(warned, e.Error()) }})
	if err != nil || !ok || d.Name != "good" {
		t.Fatalf("Lookup = %+v, %v, %v; want the gateway good", d, ok, err)
	}
	if len(warned) != 4 { // corrupt, huge, empty, renamed (the FIFO and the link are not regular files)
		t.Fatalf("warnings %q, want 4", warned)
	}
}

func TestLookupErrors(t *testing.T) {
	sys := fakeSys(t, map[string]map[string]string{"ublkb0": {}})
	for _, tt := range []struct {
		dev  string
		opts Options
		want error
	}{
		{"sda", Options{SysBlock: sys}, ErrKernelName},
		{"nbd0p1", Options{SysBlock: sys}, ErrKernelName},
		{"nbd", Options{SysBlock: sys}, ErrKernelName},
		{"nbd01", Options{SysBlock: sys}, ErrKernelName},
		{"ublkb", Options{SysBlock: sys}, ErrKernelName},
		{"ublkb1/../../x", Options{SysBlock: sys}, ErrKernelName},
		{"nbd9", Options{SysBlock: sys}, os.ErrNotExist},
	} {
		if _, ok, err := Lookup(tt.dev, tt.opts); ok || !errors.Is(err, tt.want) {
			t.Errorf("Lookup(%q) = %v, %v; want %v", tt.dev, ok, err, tt.want)
		}
	}
	if _, ok, err := Lookup("ublkb0", Options{SysBlock: sys}); ok || err == nil {
		t.Errorf("Lookup without a run directory = %v, %v; want an error", ok, err)
	}
	if _, ok, err := Lookup("ublkb0", Options{SysBlock: sys, RunDir: filepath.Join(t.TempDir(), "none")}); ok || err != nil {
		t.Errorf("Lookup with no run directory yet = %v, %v; want not ours", ok, err)
	}
}

// deadPID is the PID of a process that has exited and been reaped.
func deadPID(t *testing.T) int {
	t.Helper()
	p, err := os.StartProcess("/bin/true", []string{"true"}, &os.ProcAttr{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := p.Wait(); err != nil {
		t.Fatal(err)
	}
	return p.Pid
}
