package nbd_test

import (
	"errors"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/iser-blk/iser-blk/frontend/nbd"
)

func TestListenSpecs(t *testing.T) {
	dir := t.TempDir()
	for _, tc := range []struct {
		spec    string
		uri     string // prefix of the returned URI
		wantErr bool
	}{
		{"unix://" + filepath.Join(dir, "a.sock"), "nbd+unix:///?socket=" + filepath.Join(dir, "a.sock"), false},
		{"tcp://127.0.0.1:0", "nbd://127.0.0.1:", false},
		{"tcp://127.0.0.1", "", true},
		{"unix://", "", true},
		{"http://x", "", true},
		{"::", "", true},
	} {
		l, uri, err := nbd.Listen(tc.spec)
		if (err != nil) != tc.wantErr {
			t.Errorf("%q: err %v", tc.spec, err)
			continue
		}
		if err != nil {
			var se *nbd.SpecError
			if !errors.As(err, &se) || se.Spec != tc.spec || se.Reason == "" {
				t.Errorf("%q: %v is not a SpecError for the spec", tc.spec, err)
			}
			continue
		}
		if !strings.HasPrefix(uri, tc.uri) {
			t.Errorf("%q: uri %q, want prefix %q", tc.spec, uri, tc.uri)
		}
		if l.Addr().Network() == "unix" {
			st, err := os.Stat(l.Addr().String())
			if err != nil || st.Mode().Perm() != 0o600 {
				t.Errorf("%q: socket mode %v (%v), want 0600", tc.spec, st.Mode(), err)
			}
		}
		l.Close()
	}
}

// TestListenStaleSocket: a socket file nobody listens on is replaced; a regular file and a live
// server's socket are left alone and refused.
func TestListenStaleSocket(t *testing.T) {
	dir := t.TempDir()
	// A regular file is never removed.
	file := filepath.Join(dir, "file")
	if err := os.WriteFile(file, []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, _, err := nbd.Listen("unix://" + file); !errors.Is(err, nbd.ErrNotSocket) || err.Error() != file+" exists and is not a socket; not removing it" {
		t.Errorf("regular file: %v", err)
	}
	if _, err := os.Stat(file); err != nil {
		t.Error("regular file removed")
	}
	// A live socket is kept and reported.
	live := filepath.Join(dir, "live.sock")
	l, err := net.Listen("unix", live)
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := nbd.Listen("unix://" + live); err == nil || !strings.Contains(err.Error(), "another server") {
		t.Errorf("live socket: %v", err)
	}
	// Once nobody listens (the file left behind), it is stale and replaced.
	l.(*net.UnixListener).SetUnlinkOnClose(false)
	l.Close()
	if _, err := os.Lstat(live); err != nil {
		t.Fatalf("the socket file went with its listener: %v", err)
	}
	l2, _, err := nbd.Listen("unix://" + live)
	if err != nil {
		t.Fatalf("stale socket: %v", err)
	}
	l2.Close()
}
