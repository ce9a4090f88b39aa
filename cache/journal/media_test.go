package journal

import (
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// A new cache device file has written blocks, not fallocate's unwritten ones, so that no FLUSH
// of the first lap of the ring waits for an extent conversion (zeroFill). Checked with filefrag
// where the test's file system has unwritten extents to show (ext4, xfs).
func TestNewFileIsWritten(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "cache.dev")
	m, err := OpenFile(path, 8<<20)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	if m.Size() != 8<<20 {
		t.Fatalf("size %d, want 8 MiB", m.Size())
	}
	if _, err := exec.LookPath("filefrag"); err != nil {
		t.Skip("no filefrag (e2fsprogs) to read the file's extents")
	}
	probe := filepath.Join(dir, "probe")
	if out, err := exec.Command("fallocate", "-l", "1M", probe).CombinedOutput(); err != nil {
		t.Skipf("fallocate(1): %v %s", err, out)
	}
	if out, _ := exec.Command("filefrag", "-v", probe).CombinedOutput(); !strings.Contains(string(out), "unwritten") {
		t.Skipf("the test's file system shows no unwritten extents (tmpfs?):\n%s", out)
	}
	out, err := exec.Command("filefrag", "-v", path).CombinedOutput()
	if err != nil {
		t.Fatalf("filefrag: %v\n%s", err, out)
	}
	if strings.Contains(string(out), "unwritten") {
		t.Fatalf("the new cache device file has unwritten extents:\n%s", out)
	}
}
