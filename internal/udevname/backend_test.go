package udevname

import (
	"strings"
	"testing"

	"github.com/iser-blk/iser-blk/internal/control"
)

func TestParseBackendID(t *testing.T) {
	for _, tt := range []struct {
		id, name, target string
		ok               bool
	}{
		{"iser-blk:db:iscsi://10.0.0.1/iqn.2003-01.org.example:disk/1\n", "db", "iscsi://10.0.0.1/iqn.2003-01.org.example:disk/1", true},
		{BackendID("gw-1.a_b", "mem://64MiB"), "gw-1.a_b", "mem://64MiB", true},
		{"iser-blk:", "", "", false},
		{"iser-blk:export", "", "", false},                                     // an unnamed gateway's: iser-blk:EXPORT
		{"iser-blk:some:export", "", "", false},                                // no URL after the name
		{"iser-blk::iscsi://h/iqn/1", "", "", false},                           // empty name
		{"iser-blk:.hidden:iscsi://h/iqn/1", "", "", false},                    // a name ValidateName refuses
		{"iser-blk:a b:iscsi://h/iqn/1", "", "", false},                        // a space would split the SYMLINK list
		{"iser-blk:a/b:iscsi://h/iqn/1", "", "", false},                        // a slash would leave /dev/iser-blk
		{"nbd-client:db:iscsi://h/iqn/1", "", "", false},                       // another program's
		{"iser-blk:" + strings.Repeat("n", 65) + ":mem://1MiB", "", "", false}, // longer than a name may be
		{"iser-blk:db:mem://" + strings.Repeat("x", maxBackendBytes), "", "", false},
	} {
		name, target, ok := ParseBackendID(tt.id)
		if name != tt.name || target != tt.target || ok != tt.ok {
			t.Errorf("ParseBackendID(%.60q) = %q, %q, %v; want %q, %q, %v", tt.id, name, target, ok, tt.name, tt.target, tt.ok)
		}
	}
}

func TestEnvLeavesOutAnUnprintableTarget(t *testing.T) {
	if got, want := (Device{Name: "db", Target: "iscsi://h/iqn.x:y/1"}).Env(), "ISER_BLK_NAME=db\nISER_BLK_TARGET=iscsi://h/iqn.x:y/1\n"; got != want {
		t.Errorf("Env = %q, want %q", got, want)
	}
	for _, bad := range []string{"mem://1 MiB", "a\"b", "a\nISER_BLK_NAME=x", "é", ""} {
		if got, want := (Device{Name: "db", Target: bad}).Env(), "ISER_BLK_NAME=db\n"; got != want {
			t.Errorf("target %q: Env = %q, want %q", bad, got, want)
		}
	}
}

// FuzzParseBackendID: the backend identifier is whatever the program that configured the nbd
// device chose. What ParseBackendID accepts must give a valid name, round-trip through
// BackendID, and print as exactly the KEY=VALUE lines udev expects.
func FuzzParseBackendID(f *testing.F) {
	f.Add(BackendID("db", "iscsi://10.0.0.1/iqn.2003-01.org.example:disk/1"))
	f.Add("iser-blk:export")
	f.Add("iser-blk:a:b:c://")
	f.Fuzz(func(t *testing.T, id string) {
		name, target, ok := ParseBackendID(id)
		if !ok {
			return
		}
		if BackendID(name, target) != strings.TrimSuffix(id, "\n") {
			t.Fatalf("%q parsed as %q, %q, which do not make it again", id, name, target)
		}
		if control.ValidateName(name) != nil {
			t.Fatalf("%q gave the invalid name %q", id, name)
		}
		env := Device{Name: name, Target: target}.Env()
		if !strings.HasPrefix(env, "ISER_BLK_NAME="+name+"\n") {
			t.Fatalf("%q: env %q does not start with the name", id, env)
		}
		for _, l := range strings.Split(strings.TrimSuffix(env, "\n"), "\n") {
			k, v, found := strings.Cut(l, "=")
			if !found || (k != "ISER_BLK_NAME" && k != "ISER_BLK_TARGET") || v == "" || strings.ContainsAny(v, " \t\"'\\") {
				t.Fatalf("%q: env line %q", id, l)
			}
		}
	})
}
