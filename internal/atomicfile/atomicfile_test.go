package atomicfile

import (
	"os"
	"path/filepath"
	"testing"
)

// TestWriteReplacesWholly: the new contents replace the old, the file is 0600, and no
// temporary file stays behind, whether the write succeeds or fails.
func TestWriteReplacesWholly(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "state.json")
	if err := os.WriteFile(path, []byte("old contents, longer than the new"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := Write(path, []byte("new")); err != nil {
		t.Fatal(err)
	}
	if b, err := os.ReadFile(path); err != nil || string(b) != "new" {
		t.Fatalf("read %q, %v; want %q", b, err, "new")
	}
	if fi, err := os.Stat(path); err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("mode %v, %v; want 0600", fi.Mode(), err)
	}
	if err := Write(filepath.Join(dir, "missing", "x"), []byte("y")); err == nil {
		t.Fatal("a write into a missing directory succeeded")
	}
	entries, err := os.ReadDir(dir)
	if err != nil || len(entries) != 1 {
		t.Fatalf("directory holds %v (%v); want only state.json", entries, err)
	}
}
