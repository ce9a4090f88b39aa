package main

import (
	"bytes"
	"context"
	"errors"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"go.uber.org/zap"
)

func TestListenSpecs(t *testing.T) {
	dir := t.TempDir()
	for _, tc := range []struct {
		spec    string
		uri     string // prefix of the printed URI
		wantErr bool
	}{
		{"unix://" + filepath.Join(dir, "a.sock"), "nbd+unix:///?socket=" + filepath.Join(dir, "a.sock"), false},
		{"tcp://127.0.0.1:0", "nbd://127.0.0.1:", false},
		{"tcp://127.0.0.1", "", true},
		{"unix://", "", true},
		{"http://x", "", true},
		{"::", "", true},
	} {
		l, uri, err := listen(tc.spec)
		if (err != nil) != tc.wantErr {
			t.Errorf("%q: err %v", tc.spec, err)
			continue
		}
		if err != nil {
			var ue *usageError
			if !errors.As(err, &ue) {
				t.Errorf("%q: %v is not a usage error", tc.spec, err)
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

func TestRemoveStaleSocket(t *testing.T) {
	dir := t.TempDir()
	// Missing: nothing to do.
	if err := removeStaleSocket(filepath.Join(dir, "none")); err != nil {
		t.Error(err)
	}
	// A regular file is never removed.
	file := filepath.Join(dir, "file")
	os.WriteFile(file, []byte("x"), 0o600)
	if err := removeStaleSocket(file); err == nil {
		t.Error("regular file accepted")
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
	if err := removeStaleSocket(live); err == nil || !strings.Contains(err.Error(), "another server") {
		t.Errorf("live socket: %v", err)
	}
	// Once nobody listens (the file left behind), it is stale and removed.
	l.(*net.UnixListener).SetUnlinkOnClose(false)
	l.Close()
	if err := removeStaleSocket(live); err != nil {
		t.Errorf("stale socket: %v", err)
	}
	if _, err := os.Lstat(live); !os.IsNotExist(err) {
		t.Error("stale socket not removed")
	}
}

// TestUsagePrintedOnce: serve --help (and every other subcommand's) prints its usage once (the
// flag package calls Usage itself on -h, and parseOrExit used to print it again), and so does a
// bad flag, after the error.
func TestUsagePrintedOnce(t *testing.T) {
	var out bytes.Buffer
	usageOutput = &out
	defer func() { usageOutput = os.Stderr }()
	for name, c := range commands {
		for _, tt := range []struct {
			args []string
			code int
		}{{[]string{"--help"}, exitOK}, {[]string{"-h"}, exitOK}, {[]string{"--no-such-flag"}, exitUsage}} {
			out.Reset()
			if code := c.run(context.Background(), tt.args); code != tt.code {
				t.Errorf("%s %v: exit %d, want %d", name, tt.args, code, tt.code)
			}
			if n := strings.Count(out.String(), "usage: iser-blk "+name+" "); n != 1 {
				t.Errorf("%s %v: usage printed %d times:\n%s", name, tt.args, n, out.String())
			}
		}
	}
	if _, ok := commands["serve"]; !ok {
		t.Fatal("serve is not registered")
	}
}

// TestTLSFlagsUsageErrors: a TLS configuration internal/nbdtls refuses is a usage error (exit 2)
// with its message unchanged.
func TestTLSFlagsUsageErrors(t *testing.T) {
	for _, f := range []tlsFlags{{mode: "yes"}, {certDir: "/nonexistent"}, {mode: "require", certDir: t.TempDir()}, {}} {
		_, err := f.serverTLS(context.Background(), "tcp://0.0.0.0:10809", zap.NewNop())
		var ue *usageError
		if !errors.As(err, &ue) || exitCode(err) != exitUsage || !strings.Contains(err.Error(), "--tls") {
			t.Errorf("%+v: %v, want a usage error naming --tls", f, err)
		}
	}
}
