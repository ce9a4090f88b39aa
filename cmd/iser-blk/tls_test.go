package main

import (
	"context"
	"crypto/tls"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

	"github.com/iser-blk/iser-blk/internal/testcerts"
)

// certDir writes a --tls-certificates directory for a server certificate valid from notBefore to
// notAfter (zero: now ± a day) and returns it with its CA.
func certDir(t *testing.T, notBefore, notAfter time.Time) (string, *testcerts.CA) {
	t.Helper()
	ca, err := testcerts.NewCA("test-ca")
	if err != nil {
		t.Fatal(err)
	}
	p, err := ca.Server("server", notBefore, notAfter)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	if err := testcerts.WriteDir(dir, ca, "server", p); err != nil {
		t.Fatal(err)
	}
	return dir, ca
}

// TestTLSStartupErrors: every configuration a user can fix is a usage error (exit 2) whose message
// names the file or flag and what is wrong.
func TestTLSStartupErrors(t *testing.T) {
	good, _ := certDir(t, time.Time{}, time.Time{})
	expired, _ := certDir(t, time.Now().Add(-48*time.Hour), time.Now().Add(-time.Hour))
	future, _ := certDir(t, time.Now().Add(time.Hour), time.Now().Add(48*time.Hour))
	mismatch, _ := certDir(t, time.Time{}, time.Time{})
	other, _ := certDir(t, time.Time{}, time.Time{})
	copyFile(t, filepath.Join(other, tlsKeyFile), filepath.Join(mismatch, tlsKeyFile))
	noKey, _ := certDir(t, time.Time{}, time.Time{})
	os.Remove(filepath.Join(noKey, tlsKeyFile))
	noCA, _ := certDir(t, time.Time{}, time.Time{})
	os.Remove(filepath.Join(noCA, tlsCAFile))
	unreadable, _ := certDir(t, time.Time{}, time.Time{})
	os.Remove(filepath.Join(unreadable, tlsCertFile))
	if err := os.Mkdir(filepath.Join(unreadable, tlsCertFile), 0o700); err != nil { // read fails even as root
		t.Fatal(err)
	}
	badCA, _ := certDir(t, time.Time{}, time.Time{})
	if err := os.WriteFile(filepath.Join(badCA, tlsCAFile), []byte("not pem"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name   string
		f      tlsFlags
		listen string
		want   []string
	}{
		{"non-loopback without --tls", tlsFlags{}, "tcp://0.0.0.0:10809", []string{"--tls require", "--tls off"}},
		{"all addresses without --tls", tlsFlags{}, "tcp://:10809", []string{"reachable from other hosts"}},
		{"IPv6 any without --tls", tlsFlags{}, "tcp://[::]:10809", []string{"reachable from other hosts"}},
		{"bad mode", tlsFlags{mode: "yes"}, "tcp://127.0.0.1:1", []string{`--tls "yes"`}},
		{"no directory", tlsFlags{mode: "require"}, "tcp://127.0.0.1:1", []string{"--tls-certificates DIR"}},
		{"certificates without TLS", tlsFlags{certDir: good}, "tcp://127.0.0.1:1", []string{"need --tls on"}},
		{"missing key", tlsFlags{mode: "on", certDir: noKey}, "tcp://127.0.0.1:1", []string{tlsKeyFile, "no such file"}},
		{"unreadable certificate", tlsFlags{mode: "on", certDir: unreadable}, "tcp://127.0.0.1:1", []string{tlsCertFile, "is a directory"}},
		{"key of another certificate", tlsFlags{mode: "require", certDir: mismatch}, "tcp://127.0.0.1:1", []string{tlsKeyFile, "does not match"}},
		{"expired", tlsFlags{mode: "require", certDir: expired}, "tcp://127.0.0.1:1", []string{tlsCertFile, "expired"}},
		{"not yet valid", tlsFlags{mode: "require", certDir: future}, "tcp://127.0.0.1:1", []string{tlsCertFile, "not valid before"}},
		{"verify-peer without CA", tlsFlags{mode: "require", certDir: noCA, verifyPeer: true}, "tcp://127.0.0.1:1", []string{tlsCAFile, "no such file"}},
		{"verify-peer with a bad CA file", tlsFlags{mode: "require", certDir: badCA, verifyPeer: true}, "tcp://127.0.0.1:1", []string{tlsCAFile, "no PEM certificate"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p, err := tc.f.serverTLS(context.Background(), tc.listen, zap.NewNop())
			var ue *usageError
			if !errors.As(err, &ue) || exitCode(err) != exitUsage {
				t.Fatalf("got %v, %v; want a usage error", p, err)
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("%q does not say %q", err, w)
				}
			}
		})
	}
}

// TestTLSPlaintextListeners: loopback and unix listeners start without TLS; --tls off on a
// non-loopback address starts with a warning.
func TestTLSPlaintextListeners(t *testing.T) {
	for _, tc := range []struct {
		f      tlsFlags
		listen string
		warn   string
	}{
		{tlsFlags{}, "tcp://127.0.0.1:10809", "no authentication or encryption"},
		{tlsFlags{}, "tcp://localhost:10809", "no authentication or encryption"},
		{tlsFlags{}, "tcp://[::1]:10809", "no authentication or encryption"},
		{tlsFlags{}, "unix:///run/x.sock", ""},
		{tlsFlags{mode: "off"}, "tcp://0.0.0.0:10809", "non-loopback address (--tls off)"},
	} {
		core, logs := observer.New(zap.WarnLevel)
		p, err := tc.f.serverTLS(context.Background(), tc.listen, zap.New(core))
		if err != nil || p != nil {
			t.Errorf("%s %+v: %v %v", tc.listen, tc.f, p, err)
		}
		n := len(logs.FilterMessageSnippet(tc.warn).All())
		if tc.warn == "" && logs.Len() != 0 || tc.warn != "" && n != 1 {
			t.Errorf("%s %+v: warnings %v", tc.listen, tc.f, logs.All())
		}
	}
}

// TestTLSReload: a reload serves the new certificate to new handshakes; a reload that fails
// (a key of another certificate) keeps the old one and logs why.
func TestTLSReload(t *testing.T) {
	dir, _ := certDir(t, time.Time{}, time.Time{})
	f := tlsFlags{mode: "require", certDir: dir}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	p, err := f.serverTLS(ctx, "tcp://0.0.0.0:1", zap.NewNop())
	if err != nil {
		t.Fatal(err)
	}
	if !p.Require || p.Config.MinVersion != tls.VersionTLS12 {
		t.Fatalf("policy %+v", p)
	}
	serial := func(cur *atomic.Pointer[tls.Config]) string {
		return cur.Load().Certificates[0].Leaf.SerialNumber.String()
	}
	var cur atomic.Pointer[tls.Config]
	cfg, err := p.Config.GetConfigForClient(nil)
	if err != nil {
		t.Fatal(err)
	}
	cur.Store(cfg)
	first := serial(&cur)

	next, _ := certDir(t, time.Time{}, time.Time{})
	for _, name := range []string{tlsCertFile, tlsKeyFile} {
		copyFile(t, filepath.Join(next, name), filepath.Join(dir, name))
	}
	core, logs := observer.New(zap.InfoLevel)
	f.reload(&cur, zap.New(core))
	second := serial(&cur)
	if second == first || logs.FilterMessage("TLS certificates reloaded").Len() != 1 {
		t.Fatalf("reload kept serial %s (logs %v)", first, logs.All())
	}
	other, _ := certDir(t, time.Time{}, time.Time{})
	copyFile(t, filepath.Join(other, tlsKeyFile), filepath.Join(dir, tlsKeyFile))
	f.reload(&cur, zap.New(core))
	if serial(&cur) != second {
		t.Fatal("a failed reload replaced the certificate")
	}
	failed := logs.FilterMessage("TLS certificate reload failed; keeping the old certificates").All()
	if len(failed) != 1 || !strings.Contains(failed[0].ContextMap()["error"].(string), "does not match") {
		t.Fatalf("failed reload logged %v", logs.All())
	}
}

func TestTLSURI(t *testing.T) {
	for mode, want := range map[string]string{"": "nbd://127.0.0.1:1/", "off": "nbd://127.0.0.1:1/", "on": "nbds://127.0.0.1:1/", "require": "nbds://127.0.0.1:1/"} {
		if got := (&tlsFlags{mode: mode}).uri("nbd://127.0.0.1:1/"); got != want {
			t.Errorf("--tls %q: %s, want %s", mode, got, want)
		}
	}
	if got := (&tlsFlags{mode: "on"}).uri("nbd+unix:///?socket=/s"); got != "nbds+unix:///?socket=/s" {
		t.Errorf("unix: %s", got)
	}
}

func copyFile(t *testing.T, from, to string) {
	t.Helper()
	b, err := os.ReadFile(from)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(to, b, 0o600); err != nil {
		t.Fatal(err)
	}
}
