package main

import (
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"syscall"
	"testing"

	"github.com/iser-blk/iser-blk/backend/iser"
	"github.com/iser-blk/iser-blk/backend/iser/scsi"
)

func TestParseArgsInterspersed(t *testing.T) {
	tests := []struct {
		args    []string
		pos     []string
		debug   bool
		wantErr bool
		help    bool
	}{
		{[]string{"URL"}, []string{"URL"}, false, false, false},
		{[]string{"--debug", "URL"}, []string{"URL"}, true, false, false},
		{[]string{"URL", "--debug"}, []string{"URL"}, true, false, false},
		{[]string{"A", "--debug", "B"}, []string{"A", "B"}, true, false, false},
		{[]string{"--", "--debug"}, []string{"--debug"}, false, false, false},
		{[]string{"--nope", "URL"}, nil, false, true, false},
		{[]string{"URL", "-h"}, nil, false, false, true},
	}
	for _, tt := range tests {
		var tf targetFlags
		fs := newFlagSet("x", "", "")
		tf.register(fs, true)
		pos, err := parseArgs(fs, tt.args)
		switch {
		case tt.help:
			if !errors.Is(err, flag.ErrHelp) {
				t.Errorf("%v: err %v, want help", tt.args, err)
			}
		case tt.wantErr:
			if exitCode(err) != exitUsage {
				t.Errorf("%v: err %v, want a usage error", tt.args, err)
			}
		default:
			if err != nil || !reflect.DeepEqual(pos, tt.pos) || tf.debug != tt.debug {
				t.Errorf("%v: pos %v debug %v err %v", tt.args, pos, tf.debug, err)
			}
		}
	}
}

func TestCHAPFromFlagsAndEnv(t *testing.T) {
	dir := t.TempDir()
	write := func(name, content string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	secret := write("s", "initiator-secret\n")
	tsecret := write("t", "target-secret\r\n")
	empty := write("e", "\n")
	tests := []struct {
		name    string
		tf      targetFlags
		urlUser string
		env     map[string]string
		want    *iser.CHAP
		wantErr string
	}{
		{"none", targetFlags{}, "", nil, nil, ""},
		{"env ignored without a user", targetFlags{}, "", map[string]string{envCHAPSecret: "x"}, nil, ""},
		{"file", targetFlags{chapUser: "u", chapSecretFile: secret}, "", nil, &iser.CHAP{User: "u", Secret: "initiator-secret"}, ""},
		{"url user + env", targetFlags{}, "alice", map[string]string{envCHAPSecret: "from-env"}, &iser.CHAP{User: "alice", Secret: "from-env"}, ""},
		{"file beats env", targetFlags{chapSecretFile: secret}, "alice", map[string]string{envCHAPSecret: "from-env"},
			&iser.CHAP{User: "alice", Secret: "initiator-secret"}, ""},
		{"mutual", targetFlags{chapUser: "u", chapSecretFile: secret, targetUser: "tgt", targetSecretFile: tsecret}, "", nil,
			&iser.CHAP{User: "u", Secret: "initiator-secret", TargetUser: "tgt", TargetSecret: "target-secret"}, ""},
		{"mutual from env", targetFlags{chapUser: "u"}, "", map[string]string{envCHAPSecret: "a", envCHAPSecretMutual: "b"},
			&iser.CHAP{User: "u", Secret: "a", TargetSecret: "b"}, ""},
		{"user without secret", targetFlags{chapUser: "u"}, "", nil, nil, "needs a secret"},
		{"secret without user", targetFlags{chapSecretFile: secret}, "", nil, nil, "no CHAP user"},
		{"empty file", targetFlags{chapUser: "u", chapSecretFile: empty}, "", nil, nil, "is empty"},
		{"missing file", targetFlags{chapUser: "u", chapSecretFile: filepath.Join(dir, "nope")}, "", nil, nil, "reading secret file"},
		{"users disagree", targetFlags{chapUser: "u"}, "v", nil, nil, "disagree"},
		{"target user without secret", targetFlags{chapUser: "u", chapSecretFile: secret, targetUser: "t"}, "", nil, nil, "target's secret"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Setenv(envCHAPSecret, "")
			t.Setenv(envCHAPSecretMutual, "")
			for k, v := range tt.env {
				t.Setenv(k, v)
			}
			got, err := tt.tf.chap(tt.urlUser)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) || exitCode(err) != exitUsage {
					t.Fatalf("err %v, want %q (usage)", err, tt.wantErr)
				}
				if strings.Contains(err.Error(), "initiator-secret") {
					t.Fatal("error leaks the secret")
				}
				return
			}
			if err != nil || !reflect.DeepEqual(got, tt.want) {
				t.Fatalf("got %#v, %v; want %#v", got, err, tt.want)
			}
		})
	}
}

func TestExitCode(t *testing.T) {
	loginErr := func(kind error) error {
		return fmt.Errorf("open: %w", &iser.LoginError{Target: "iqn.x:y", Portal: "h:3260", Kind: kind})
	}
	tests := []struct {
		err  error
		want int
	}{
		{nil, exitOK},
		{usagef("bad"), exitUsage},
		{fmt.Errorf("x: %w", iser.ErrBadURL), exitUsage},
		{loginErr(iser.ErrAuthFailed), exitAuth},
		{loginErr(iser.ErrAuthorization), exitAuth},
		{loginErr(iser.ErrTargetNotFound), exitNotFound},
		{fmt.Errorf("iser: LUN 3: %w", iser.ErrLUNNotFound), exitNotFound},
		{loginErr(iser.ErrPortalUnreachable), exitUnreachable},
		{fmt.Errorf("%w", iser.ErrTransportUnavailable), exitNoKernel},
		{&iser.LoginError{Kind: iser.ErrPortalUnreachable, Err: iser.ErrNoRDMA}, exitNoKernel},
		{&iser.LoginError{Kind: iser.ErrPortalUnreachable, Err: fmt.Errorf("rdma_create_event_channel: %w", syscall.ENODEV)}, exitNoKernel},
		{fmt.Errorf("iser: %w", iser.ErrNotDisk), exitFailure},
		{&scsi.SenseError{Command: "READ(16)", Sense: scsi.Sense{Key: scsi.KeyMediumError}}, exitFailure},
	}
	for _, tt := range tests {
		if got := exitCode(tt.err); got != tt.want {
			t.Errorf("exitCode(%v) = %d, want %d", tt.err, got, tt.want)
		}
	}
}

// TestDiscoveryPortalUsage: a portal iser.ParsePortal refuses is a usage error (exit 2).
func TestDiscoveryPortalUsage(t *testing.T) {
	if _, _, err := discoveryPortal("host:port"); exitCode(err) != exitUsage || err.Error() != `bad port "port"` {
		t.Errorf("err %v, want usage", err)
	}
	if scheme, portal, err := discoveryPortal("iser://10.0.0.1"); err != nil || scheme != "iser" || portal != "10.0.0.1:3260" {
		t.Errorf("%q %q %v", scheme, portal, err)
	}
}
