package initiatorname_test

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"

	"github.com/iser-blk/iser-blk/internal/initiatorname"
)

// TestInitiatorNameFromFile: open-iscsi's file format — comments, blanks, other keys — yields its
// InitiatorName; no file or no name yields "" (and the default falls back to the host name).
func TestInitiatorNameFromFile(t *testing.T) {
	dir := t.TempDir()
	for _, tt := range []struct {
		name, content, want string
	}{
		{"open-iscsi default", "## DO NOT EDIT OR REMOVE THIS FILE!\n## If you remove this file, the iSCSI daemon will not start.\nInitiatorName=iqn.1993-08.org.debian:01:abcdef012345\n", "iqn.1993-08.org.debian:01:abcdef012345"},
		{"commented out", "#InitiatorName=iqn.2000-01.com.example:old\nInitiatorName=iqn.2000-01.com.example:new\n", "iqn.2000-01.com.example:new"},
		{"blanks and alias", "\n  InitiatorAlias=host1\n  InitiatorName = x\n\tInitiatorName=iqn.2000-01.com.example:h1  \r\n", "iqn.2000-01.com.example:h1"},
		{"empty value", "InitiatorName=\n", ""},
		{"no name", "# nothing here\n", ""},
	} {
		t.Run(tt.name, func(t *testing.T) {
			path := filepath.Join(dir, strings.ReplaceAll(tt.name, " ", "-"))
			if err := os.WriteFile(path, []byte(tt.content), 0o600); err != nil {
				t.Fatal(err)
			}
			if got := initiatorname.FromFile(path); got != tt.want {
				t.Fatalf("got %q, want %q", got, tt.want)
			}
		})
	}
	if got := initiatorname.FromFile(filepath.Join(dir, "missing")); got != "" {
		t.Fatalf("missing file: got %q", got)
	}
}

// TestInitiatorNameGeneratedOnce: without open-iscsi's file a name is generated once, iscsi-iname
// style, kept under /etc/iser-blk with modes 0700/0600 and read back on every later start;
// open-iscsi's file, when present, wins.
func TestInitiatorNameGeneratedOnce(t *testing.T) {
	root := t.TempDir()
	name, generated, err := initiatorname.Host(root)
	if err != nil || !generated {
		t.Fatalf("first use: %q generated=%v err=%v", name, generated, err)
	}
	if !regexp.MustCompile(`^iqn\.2025-01\.io\.iser-blk:[0-9a-f]{12}$`).MatchString(name) {
		t.Fatalf("generated name %q", name)
	}
	for path, mode := range map[string]os.FileMode{"etc/iser-blk": 0o700 | os.ModeDir, "etc/iser-blk/initiatorname": 0o600} {
		fi, err := os.Stat(filepath.Join(root, path))
		if err != nil || fi.Mode() != mode {
			t.Errorf("%s: %v, mode %v, want %v", path, err, fi.Mode(), mode)
		}
	}
	again, generated, err := initiatorname.Host(root)
	if err != nil || generated || again != name {
		t.Fatalf("second use: %q generated=%v err=%v, want %q kept", again, generated, err, name)
	}
	if other, _, _ := initiatorname.Host(t.TempDir()); other == name {
		t.Fatalf("two hosts generated the same name %q", name)
	}
	if leftovers, _ := filepath.Glob(filepath.Join(root, "etc/iser-blk/.initiatorname-*")); len(leftovers) != 0 {
		t.Errorf("temporary files left: %v", leftovers)
	}

	// open-iscsi installed later: its name is the host's from then on
	openISCSI := filepath.Join(root, "etc/iscsi/initiatorname.iscsi")
	if err := os.MkdirAll(filepath.Dir(openISCSI), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(openISCSI, []byte("InitiatorName=iqn.1993-08.org.debian:01:abcdef012345\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if got, generated, err := initiatorname.Host(root); err != nil || generated || got != "iqn.1993-08.org.debian:01:abcdef012345" {
		t.Fatalf("with open-iscsi's file: %q generated=%v err=%v", got, generated, err)
	}
}

// TestInitiatorNameRace: gateways starting together on a fresh host agree on one name.
func TestInitiatorNameRace(t *testing.T) {
	root := t.TempDir()
	const n = 8
	names := make(chan string, n)
	var wg sync.WaitGroup
	for i := 0; i < n; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			name, _, err := initiatorname.Host(root)
			if err != nil {
				t.Error(err)
			}
			names <- name
		}()
	}
	wg.Wait()
	close(names)
	first := <-names
	for name := range names {
		if name != first {
			t.Fatalf("gateways disagree: %q and %q", first, name)
		}
	}
}

// TestInitiatorNameUnwritable: a root where the name cannot be kept is an error, not a name
// that would change at the next start.
func TestInitiatorNameUnwritable(t *testing.T) {
	root := t.TempDir()
	if err := os.WriteFile(filepath.Join(root, "etc"), nil, 0o600); err != nil { // etc is a file: no directory under it
		t.Fatal(err)
	}
	if name, _, err := initiatorname.Host(root); err == nil {
		t.Fatalf("got %q without being able to keep it", name)
	}
}
