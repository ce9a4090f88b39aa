package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"syscall"
	"testing"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/iser-blk/iser-blk/backend/iser"
	"github.com/iser-blk/iser-blk/backend/iser/scsi"
	"github.com/iser-blk/iser-blk/internal/chapcreds"
	"github.com/iser-blk/iser-blk/internal/cli"
	"github.com/iser-blk/iser-blk/internal/stack"
)

// TestParseArgsInterspersed: flags may come before, between or after the positional arguments;
// "--" ends the flags; an unknown flag is a usage error (exit 2) and -h is help (exit 0), both
// before the command runs.
func TestParseArgsInterspersed(t *testing.T) {
	tests := []struct {
		args  []string
		pos   []string
		debug bool
		code  int
	}{
		{[]string{"URL"}, []string{"URL"}, false, exitOK},
		{[]string{"--debug", "URL"}, []string{"URL"}, true, exitOK},
		{[]string{"URL", "--debug"}, []string{"URL"}, true, exitOK},
		{[]string{"A", "--debug", "B"}, []string{"A", "B"}, true, exitOK},
		{[]string{"--", "--debug"}, []string{"--debug"}, false, exitOK},
		{[]string{"-debug", "URL"}, []string{"URL"}, true, exitOK}, // Go's flag package's spelling
		{[]string{"--nope", "URL"}, nil, false, exitUsage},
		{[]string{"URL", "-h"}, nil, false, exitOK},
	}
	for _, tt := range tests {
		var tf targetFlags
		var pos []string
		ran := false
		cmd := &cobra.Command{Use: "x", Args: cobra.ArbitraryArgs, RunE: func(_ *cobra.Command, args []string) error {
			ran, pos = true, args
			return nil
		}}
		cli.Group(cmd, groupTarget, func(fs *pflag.FlagSet) { tf.register(fs, true) })
		tf.registerDebug(cmd.Flags())
		root := newRootCmd(io.Discard, io.Discard)
		root.AddCommand(cmd)
		code := cli.Execute(context.Background(), root, append([]string{"x"}, tt.args...))
		if code != tt.code || ran != (tt.pos != nil) {
			t.Errorf("%v: exit %d (ran %v), want %d", tt.args, code, ran, tt.code)
			continue
		}
		if tt.pos != nil && (!reflect.DeepEqual(pos, tt.pos) || tf.debug != tt.debug) {
			t.Errorf("%v: pos %v debug %v", tt.args, pos, tf.debug)
		}
	}
}

// TestCHAPUsageErrors: credentials internal/chapcreds refuses are usage errors (exit 2); the
// flags reach it.
func TestCHAPUsageErrors(t *testing.T) {
	t.Setenv(chapcreds.EnvSecret, "")
	if _, err := (&targetFlags{chapUser: "u"}).chap("v"); exitCode(err) != exitUsage || !strings.Contains(err.Error(), "disagree") {
		t.Fatalf("err %v, want a usage error", err)
	}
	secret := filepath.Join(t.TempDir(), "s")
	if err := os.WriteFile(secret, []byte("initiator-secret\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	got, err := (&targetFlags{chapSecretFile: secret}).chap("alice")
	if err != nil || !reflect.DeepEqual(got, &iser.CHAP{User: "alice", Secret: "initiator-secret"}) {
		t.Fatalf("got %#v, %v", got, err)
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
		{&stack.ConfigError{Msg: "--target is required"}, exitUsage},
		{fmt.Errorf("attach: %w", &stack.ConfigError{Msg: "--cache-dev needs --cache writeback"}), exitUsage},
		{fmt.Errorf("x: %w", iser.ErrBadURL), exitUsage},
		{loginErr(iser.ErrAuthFailed), exitAuth},
		{loginErr(iser.ErrAuthorization), exitAuth},
		{loginErr(iser.ErrTargetNotFound), exitNotFound},
		{fmt.Errorf("iser: LUN 3: %w", iser.ErrLUNNotFound), exitNotFound},
		{loginErr(iser.ErrPortalUnreachable), exitUnreachable},
		{fmt.Errorf("%w", iser.ErrTransportUnavailable), exitNoKernel},
		{&iser.LoginError{Kind: iser.ErrPortalUnreachable, Err: iser.ErrNoRDMA}, exitNoKernel},
		{&iser.LoginError{Kind: iser.ErrPortalUnreachable, Err: fmt.Errorf("rdma_create_event_channel: %w: %w", iser.ErrNoRDMADevice, syscall.ENODEV)}, exitNoKernel},
		{fmt.Errorf("ublk: STOP_DEV: %w", syscall.ENODEV), exitFailure}, // ENODEV alone is no claim about RDMA
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
