package csipool

import (
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

const goodPool = `# the pool of array A
iscsi://192.0.2.10/iqn.2001-04.com.example:pool/1
  iscsi://192.0.2.10:3261/iqn.2001-04.com.example:pool/2 , iscsi://[2001:db8::1]/iqn.2001-04.com.example:pool/2   # two portals

ISER://alice@192.0.2.12/iqn.2001-04.com.example:fast/1` + "\r\n" + `iscsi://192.0.2.10/iqn.2001-04.com.example:pool/3#no space before the comment
`

func TestParsePool(t *testing.T) {
	luns, err := ParsePool([]byte(goodPool))
	if err != nil {
		t.Fatal(err)
	}
	want := []LUN{
		{Key: "iqn.2001-04.com.example:pool/1", URLs: []string{"iscsi://192.0.2.10:3260/iqn.2001-04.com.example:pool/1"}, Transport: "iscsi", Line: 2},
		{Key: "iqn.2001-04.com.example:pool/2", URLs: []string{"iscsi://192.0.2.10:3261/iqn.2001-04.com.example:pool/2",
			"iscsi://[2001:db8::1]:3260/iqn.2001-04.com.example:pool/2"}, Transport: "iscsi", Line: 3},
		{Key: "iqn.2001-04.com.example:fast/1", URLs: []string{"iser://alice@192.0.2.12:3260/iqn.2001-04.com.example:fast/1"}, Transport: "iser", Line: 5},
		{Key: "iqn.2001-04.com.example:pool/3", URLs: []string{"iscsi://192.0.2.10:3260/iqn.2001-04.com.example:pool/3"}, Transport: "iscsi", Line: 6},
	}
	if len(luns) != len(want) {
		t.Fatalf("%d LUNs, want %d: %+v", len(luns), len(want), luns)
	}
	for i := range want {
		if luns[i].Key != want[i].Key || !slices.Equal(luns[i].URLs, want[i].URLs) || luns[i].Transport != want[i].Transport || luns[i].Line != want[i].Line {
			t.Errorf("LUN %d = %+v, want %+v", i, luns[i], want[i])
		}
	}
	if got := luns[1].Target(); got != strings.Join(want[1].URLs, ",") {
		t.Errorf("Target() = %q", got)
	}
}

func TestParsePoolErrors(t *testing.T) {
	const u = "iscsi://192.0.2.10/iqn.2001-04.com.example:pool/1"
	for _, tc := range []struct{ name, text, want string }{
		{"empty", "", "no LUNs"},
		{"only comments", "# nothing\n\n   # here\n", "no LUNs"},
		{"not a URL", "# x\n/dev/sda\n", "line 2:"},
		{"no LUN", "iscsi://192.0.2.10/iqn.2001-04.com.example:pool\n", "line 1:"},
		{"secret in URL", "iscsi://alice:s3cret@192.0.2.10/iqn.x:y/1\n", "must not be in the URL"},
		{"same LUN twice", u + "\n\n" + strings.Replace(u, "192.0.2.10", "192.0.2.11", 1) + "\n", "line 3: LUN iqn.2001-04.com.example:pool/1 is already on line 1"},
		{"portal twice", u + "," + u + "\n", "portal 192.0.2.10:3260 given twice"},
		{"other LUN after the comma", u + ",iscsi://192.0.2.11/iqn.2001-04.com.example:pool/2\n", "not the LUN of"},
		{"other scheme after the comma", u + ",iser://192.0.2.11/iqn.2001-04.com.example:pool/1\n", "not the LUN of"},
		{"other user after the comma", u + ",iscsi://bob@192.0.2.11/iqn.2001-04.com.example:pool/1\n", "not the LUN of"},
		{"empty between commas", u + ",,\n", "empty URL between commas"},
		{"space-separated", u + " iscsi://192.0.2.11/iqn.2001-04.com.example:pool/1\n", "separated by commas"},
		{"query", u + "?x=1\n", "line 1:"},
		{"long line", strings.Repeat("a", maxLineBytes+1), "line 1: longer than"},
		{"too many portals", u + strings.Repeat(","+u, maxPortalsOfLUN), "portals, at most"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			luns, err := ParsePool([]byte(tc.text))
			if err == nil {
				t.Fatalf("accepted: %+v", luns)
			}
			if !errors.Is(err, ErrPool) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %q, want ErrPool and %q", err, tc.want)
			}
		})
	}
}

func TestReadPool(t *testing.T) {
	path := filepath.Join(t.TempDir(), "pool")
	if _, err := ReadPool(path); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("missing file: %v", err)
	}
	if err := os.WriteFile(path, []byte("# x\nnot-a-url\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := ReadPool(path); err == nil || !strings.Contains(err.Error(), path+": pool file: line 2:") {
		t.Fatalf("error %v, want the path and the line", err)
	}
	if err := os.WriteFile(path, []byte(goodPool), 0o600); err != nil {
		t.Fatal(err)
	}
	if luns, err := ReadPool(path); err != nil || len(luns) != 4 {
		t.Fatalf("ReadPool = %d LUNs, %v", len(luns), err)
	}
}

// FuzzParsePool: a pool file is bytes from a ConfigMap anyone with access may edit. ParsePool
// must never panic, and what it accepts must be LUNs it accepts again as written back.
func FuzzParsePool(f *testing.F) {
	f.Add([]byte(goodPool))
	f.Add([]byte("iscsi://h/iqn.a:b/1,iscsi://h2/iqn.a:b/1\n#\n"))
	f.Add([]byte("iser://[::1]:1/x/0"))
	f.Fuzz(func(t *testing.T, data []byte) {
		luns, err := ParsePool(data)
		if err != nil {
			if !errors.Is(err, ErrPool) {
				t.Fatalf("error without ErrPool: %v", err)
			}
			return
		}
		var text strings.Builder
		keys := map[string]bool{}
		for _, l := range luns {
			if l.Key == "" || len(l.URLs) == 0 || (l.Transport != TransportISCSI && l.Transport != TransportISER) || keys[l.Key] {
				t.Fatalf("accepted a bad LUN %+v", l)
			}
			keys[l.Key] = true
			text.WriteString(l.Target() + "\n")
		}
		again, err := ParsePool([]byte(text.String()))
		if err != nil {
			t.Fatalf("written back, %q is refused: %v", text.String(), err)
		}
		for i := range luns {
			if again[i].Key != luns[i].Key || !slices.Equal(again[i].URLs, luns[i].URLs) {
				t.Fatalf("round trip changed LUN %d: %+v → %+v", i, luns[i], again[i])
			}
		}
	})
}
