package iser

import (
	"errors"
	"strings"
	"testing"
)

func TestParseURL(t *testing.T) {
	tests := []struct {
		in   string
		want Target
		err  string
	}{
		{"iscsi://10.0.0.1/iqn.2001-04.com.example:storage.disk1/1",
			Target{Transport: "iscsi", Host: "10.0.0.1", Port: 3260, IQN: "iqn.2001-04.com.example:storage.disk1", LUN: 1}, ""},
		{"iser://alice@host.example:3261/iqn.2025-01.io.x:t/0",
			Target{Transport: "iser", User: "alice", Host: "host.example", Port: 3261, IQN: "iqn.2025-01.io.x:t", LUN: 0}, ""},
		{"ISCSI://[fe80::1]:3260/eui.0123456789ABCDEF/16383",
			Target{Transport: "iscsi", Host: "fe80::1", Port: 3260, IQN: "eui.0123456789ABCDEF", LUN: 16383}, ""},
		{"iscsi://alice:hunter2@h/iqn.x:y/1", Target{}, "must not be in the URL"},
		{"nbd://h/iqn.x:y/1", Target{}, "unknown scheme"},
		{"h/iqn.x:y/1", Target{}, "missing scheme"},
		{"iscsi:///iqn.x:y/1", Target{}, "missing host"},
		{"iscsi://h:0/iqn.x:y/1", Target{}, "bad port"},
		{"iscsi://h:70000/iqn.x:y/1", Target{}, "bad port"},
		{"iscsi://h/iqn.x:y", Target{}, "want /IQN/LUN"},
		{"iscsi://h/iqn.x:y/", Target{}, "bad LUN"},
		{"iscsi://h/iqn.x:y/16384", Target{}, "bad LUN"},
		{"iscsi://h/iqn.x:y/-1", Target{}, "bad LUN"},
		{"iscsi://h/", Target{}, "want /IQN/LUN"},
		{"iscsi://h//1", Target{}, "bad target name"},
		{"iscsi://h/a/b/1", Target{}, "bad target name"},
		{"iscsi://h/iqn.x:y/1?x=1", Target{}, "unexpected query"},
	}
	for _, tt := range tests {
		got, err := ParseURL(tt.in)
		if tt.err != "" {
			if err == nil || !strings.Contains(err.Error(), tt.err) || !errors.Is(err, ErrBadURL) {
				t.Errorf("%q: err %v, want %q", tt.in, err, tt.err)
			}
			if strings.Contains(err.Error(), "hunter2") {
				t.Errorf("%q: error leaks the secret: %v", tt.in, err)
			}
			continue
		}
		if err != nil || got != tt.want {
			t.Errorf("%q: got %+v, %v; want %+v", tt.in, got, err, tt.want)
			continue
		}
		// String round-trips.
		again, err := ParseURL(got.String())
		if err != nil || again != got {
			t.Errorf("%q: String %q re-parses to %+v, %v", tt.in, got.String(), again, err)
		}
	}
	if p := (Target{Host: "fe80::1", Port: 3260}).Portal(); p != "[fe80::1]:3260" {
		t.Errorf("portal %q", p)
	}
}

func FuzzParseURL(f *testing.F) {
	for _, s := range []string{"iscsi://10.0.0.1/iqn.2001-04.com.example:storage.disk1/1", "iser://alice@[::1]:3261/eui.01/0",
		"iscsi://a:b@h/i/1", "iscsi://h/%2F/1", "iscsi://h/iqn/99999"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		tg, err := ParseURL(s)
		if err != nil {
			return
		}
		if tg.Port < 1 || tg.Port > 65535 || tg.LUN > 16383 || tg.IQN == "" || tg.Host == "" {
			t.Fatalf("accepted %q as %+v", s, tg)
		}
		again, err := ParseURL(tg.String())
		if err != nil || again != tg {
			t.Fatalf("%q → %+v → %q → %+v, %v", s, tg, tg.String(), again, err)
		}
	})
}

func TestRedactURL(t *testing.T) {
	for in, want := range map[string]string{
		"iscsi://alice@host:3260/iqn.x:y/1":         "iscsi://host:3260/iqn.x:y/1",
		"iscsi://alice:pw@host:3260/iqn.x:y/1":      "iscsi://host:3260/iqn.x:y/1",
		"mem://64MiB":                               "mem://64MiB",
		"iscsi://alice:p%zz@host/iqn.x:y/1":         "iscsi://host/iqn.x:y/1", // not a valid URL
		"iscsi://host/iqn.x:y/1":                    "iscsi://host/iqn.x:y/1",
		"iser://[fe80::1%25eth0]:3260/iqn.x:y/1":    "iser://[fe80::1%25eth0]:3260/iqn.x:y/1",
		"iscsi://u:a@b@host:3260/iqn.a@b.example/0": "iscsi://host:3260/iqn.a@b.example/0",
	} {
		if got := RedactURL(in); got != want {
			t.Errorf("RedactURL(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestParsePortal(t *testing.T) {
	tests := []struct {
		in, scheme, portal string
		bad                bool
	}{
		{"10.0.0.1", "iscsi", "10.0.0.1:3260", false},
		{"10.0.0.1:3261", "iscsi", "10.0.0.1:3261", false},
		{"host.example", "iscsi", "host.example:3260", false},
		{"[fe80::1]", "iscsi", "[fe80::1]:3260", false},
		{"[fe80::1]:99", "iscsi", "[fe80::1]:99", false},
		{"iser://10.0.0.1", "iser", "10.0.0.1:3260", false},
		{"iscsi://10.0.0.1:3262/", "iscsi", "10.0.0.1:3262", false},
		{"nbd://x", "", "", true},
		{"host:0", "", "", true},
		{"host:port", "", "", true},
		{"", "", "", true},
		{"u@host", "", "", true},
		{"host/iqn", "", "", true},
	}
	for _, tt := range tests {
		scheme, portal, err := ParsePortal(tt.in)
		if tt.bad {
			if err == nil {
				t.Errorf("%q: accepted as %q %q", tt.in, scheme, portal)
			}
			continue
		}
		if err != nil || scheme != tt.scheme || portal != tt.portal {
			t.Errorf("%q: %q %q %v", tt.in, scheme, portal, err)
		}
	}
}
