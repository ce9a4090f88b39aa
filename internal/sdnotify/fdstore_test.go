package sdnotify

import (
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/iser-blk/iser-blk/internal/sdnotify/sdnotifytest"
)

// Store sends the descriptors with FDSTORE=1 and the name; the store gets copies of the very
// sockets (what is written to the copy reads from the peer), and the caller keeps its own.
func TestStoreSendsDescriptors(t *testing.T) {
	sock := sdnotifytest.Listen(t)
	pair, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(pair[0])
	defer unix.Close(pair[1])
	if !(FDStore{}).Available() {
		t.Fatal("Available: false with NOTIFY_SOCKET set")
	}
	if err := (FDStore{}).Store("nbd4-pid77", []int{pair[0]}); err != nil {
		t.Fatal(err)
	}
	msg, fds := sock.ReceiveFDs()
	if msg != "FDSTORE=1\nFDNAME=nbd4-pid77" || len(fds) != 1 {
		t.Fatalf("got %q with %d descriptors; want FDSTORE=1, the name, one descriptor", msg, len(fds))
	}
	defer unix.Close(fds[0])
	if _, err := unix.Write(fds[0], []byte("x")); err != nil {
		t.Fatal(err)
	}
	b := make([]byte, 1)
	if n, err := unix.Read(pair[1], b); err != nil || n != 1 || b[0] != 'x' {
		t.Fatalf("the stored copy is not the socket: read %d %q %v", n, b[:n], err)
	}
	if _, err := unix.Write(pair[0], []byte("y")); err != nil {
		t.Fatalf("the caller's descriptor after Store: %v", err)
	}
}

func TestRemoveNamesWhatToDrop(t *testing.T) {
	sock := sdnotifytest.Listen(t)
	if err := (FDStore{}).Remove("nbd4-pid77"); err != nil {
		t.Fatal(err)
	}
	if msg, fds := sock.ReceiveFDs(); msg != "FDSTOREREMOVE=1\nFDNAME=nbd4-pid77" || len(fds) != 0 {
		t.Fatalf("got %q with %d descriptors", msg, len(fds))
	}
}

func TestStoreRefuses(t *testing.T) {
	sdnotifytest.Listen(t)
	for _, name := range []string{"", "a:b", "tab\there", strings.Repeat("n", 256)} {
		if err := (FDStore{}).Store(name, []int{0}); err == nil {
			t.Errorf("Store(%q): no error for a name systemd refuses", name)
		}
	}
	if err := (FDStore{}).Store("ok", nil); err == nil {
		t.Error("Store with no descriptor: no error")
	}
	for v, want := range map[string]bool{"64": true, "0": false, "x": false} {
		t.Setenv("FDSTORE", v)
		if got := (FDStore{}).Available(); got != want {
			t.Errorf("Available with FDSTORE=%s: %v, want %v", v, got, want)
		}
	}
	t.Setenv("NOTIFY_SOCKET", "")
	if (FDStore{}).Available() {
		t.Error("Available without NOTIFY_SOCKET")
	}
	if err := (FDStore{}).Remove("ok"); err == nil {
		t.Error("Remove without NOTIFY_SOCKET: no error")
	}
}

// Take reads what systemd passes at start: this test runs itself through sh, whose exec keeps
// the PID that LISTEN_PID names ($$), with three files at descriptors 3, 4 and 5, two of them
// under one name.
func TestTakeGroupsByName(t *testing.T) {
	if os.Getenv("SDNOTIFY_TAKE_CHILD") == "1" {
		takeChild()
		return
	}
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	var files []*os.File
	for _, content := range []string{"a0", "a1", "b0"} {
		f, err := os.CreateTemp(t.TempDir(), "fd")
		if err != nil {
			t.Fatal(err)
		}
		if _, err := f.WriteString(content); err != nil {
			t.Fatal(err)
		}
		files = append(files, f)
	}
	cmd := exec.Command("sh", "-c", `LISTEN_PID=$$ exec "$0" -test.run='^TestTakeGroupsByName$'`, self)
	cmd.Env = append(os.Environ(), "SDNOTIFY_TAKE_CHILD=1", "LISTEN_FDS=3", "LISTEN_FDNAMES=nbd4-pid9:nbd4-pid9:other")
	cmd.ExtraFiles = files
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("child: %v\n%s", err, out)
	}
	if !strings.Contains(string(out), "take: nbd4-pid9=[a0 a1] other=[b0] again=0 env=") {
		t.Fatalf("child output:\n%s", out)
	}
}

func takeChild() {
	got := (FDStore{}).Take()
	read := func(name string) []string {
		var s []string
		for _, f := range got[name] {
			if _, err := f.Seek(0, io.SeekStart); err != nil {
				return []string{err.Error()}
			}
			b, _ := io.ReadAll(f)
			s = append(s, string(b))
		}
		return s
	}
	fmt.Printf("take: nbd4-pid9=%v other=%v again=%d env=%s\n", read("nbd4-pid9"), read("other"),
		len((FDStore{}).Take()), os.Getenv("LISTEN_FDS")+os.Getenv("LISTEN_PID")+os.Getenv("LISTEN_FDNAMES"))
}
