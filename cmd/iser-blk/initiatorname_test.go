package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
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
			if got := initiatorNameFromFile(path); got != tt.want {
				t.Fatalf("got %q, want %q", got, tt.want)
			}
		})
	}
	if got := initiatorNameFromFile(filepath.Join(dir, "missing")); got != "" {
		t.Fatalf("missing file: got %q", got)
	}
	if h := hostInitiatorName(); !strings.HasPrefix(h, "iqn.2025-01.io.iser-blk:") || strings.ContainsAny(h, " _/") {
		t.Fatalf("host-derived name %q", h)
	}
}
