package main

import (
	"bytes"
	"context"
	"errors"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"go.uber.org/zap"
)

// TestListenUsageErrors: a --listen spec nbd.Listen cannot use, and a file in the socket's place,
// are usage errors (exit 2) naming the flag or the file; a usable spec listens.
func TestListenUsageErrors(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "file")
	if err := os.WriteFile(file, []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	for spec, want := range map[string]string{
		"tcp://127.0.0.1": `--listen "tcp://127.0.0.1": need tcp://host:port`,
		"unix://":         `--listen "unix://": no socket path`,
		"http://x":        `--listen "http://x": scheme must be unix:// or tcp://`,
		"::":              `--listen "::": parse "::": missing protocol scheme`,
		"unix://" + file:  file + " exists and is not a socket; not removing it",
	} {
		_, _, err := listen(spec)
		var ue *usageError
		if !errors.As(err, &ue) || err.Error() != want {
			t.Errorf("%q: %v, want the usage error %q", spec, err, want)
		}
	}
	l, uri, err := listen("unix://" + filepath.Join(dir, "a.sock"))
	if err != nil || uri != "nbd+unix:///?socket="+filepath.Join(dir, "a.sock") {
		t.Fatalf("%v %q", err, uri)
	}
	l.Close()
}

// TestUsagePrintedOnce: serve --help (and every other subcommand's) prints its usage once (the
// flag package used to call Usage itself on -h, and the caller printed it again), and so does a
// bad flag, after the error.
func TestUsagePrintedOnce(t *testing.T) {
	var out bytes.Buffer
	var names []string
	for _, c := range newRootCmd(io.Discard, io.Discard).Commands() {
		if c.Name() == "help" || c.Name() == "completion" {
			continue
		}
		names = append(names, c.Name())
	}
	for _, name := range names {
		for _, tt := range []struct {
			args []string
			code int
		}{{[]string{"--help"}, exitOK}, {[]string{"-h"}, exitOK}, {[]string{"--no-such-flag"}, exitUsage}} {
			out.Reset()
			if code := run(context.Background(), append([]string{name}, tt.args...), &out, &out); code != tt.code {
				t.Errorf("%s %v: exit %d, want %d", name, tt.args, code, tt.code)
			}
			if n := strings.Count(out.String(), "usage: iser-blk "+name+" "); n != 1 {
				t.Errorf("%s %v: usage printed %d times:\n%s", name, tt.args, n, out.String())
			}
		}
	}
	if !slices.Contains(names, "serve") {
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
