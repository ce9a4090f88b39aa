package main

import (
	"io"
	"strings"
	"testing"
	"time"

	"github.com/spf13/pflag"

	"github.com/iser-blk/iser-blk/backend/iser"
)

// TestRecoveryFlags: --target repeats into alternates; the reliability flags reach
// iser.Options.Recovery with their documented meanings; nonsense is a usage error.
func TestRecoveryFlags(t *testing.T) {
	def := iser.DefaultRecovery()
	tests := []struct {
		name       string
		args       []string
		target     string
		alternates int
		rec        iser.Recovery
		wantErr    bool
	}{
		{"defaults", []string{"--target", "iscsi://a/iqn.x/1"}, "iscsi://a/iqn.x/1", 0, def, false},
		{"two portals", []string{"--target", "iscsi://a/iqn.x/1", "--target", "iscsi://b/iqn.x/1"}, "iscsi://a/iqn.x/1", 1, def, false},
		{"portals from discovery", []string{"--target", "iscsi://a/iqn.x/1", "--portals-from-discovery"}, "iscsi://a/iqn.x/1", 0, def, false},
		{"timeouts", []string{"--target", "iscsi://a/iqn.x/1", "--replacement-timeout", "5s", "--noop-interval", "2s",
			"--noop-timeout", "1s", "--command-timeout", "0"}, "iscsi://a/iqn.x/1", 0,
			iser.Recovery{NOPInterval: 2 * time.Second, NOPTimeout: time.Second, ReplacementTimeout: 5 * time.Second,
				ReconnectMin: def.ReconnectMin, ReconnectMax: def.ReconnectMax}, false},
		{"queue forever", []string{"--target", "iscsi://a/iqn.x/1", "--replacement-timeout", "-1s"}, "iscsi://a/iqn.x/1", 0,
			func() iser.Recovery { r := def; r.ReplacementTimeout = -time.Second; return r }(), false},
		{"negative keepalive", []string{"--target", "iscsi://a/iqn.x/1", "--noop-interval", "-1s"}, "", 0, iser.Recovery{}, true},
		{"ping without timeout", []string{"--target", "iscsi://a/iqn.x/1", "--noop-timeout", "0"}, "", 0, iser.Recovery{}, true},
		{"mem with portals", []string{"--target", "mem://1MiB", "--target", "iscsi://b/iqn.x/1"}, "", 0, iser.Recovery{}, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var tf targetFlags
			var ef exportFlags
			fs := pflag.NewFlagSet("serve", pflag.ContinueOnError)
			fs.SetOutput(io.Discard)
			ef.registerTarget(fs)
			tf.register(fs, true)
			tf.registerReliability(fs)
			err := fs.Parse(tt.args)
			var opts iser.Options
			if err == nil {
				opts, err = tf.options("", nil)
			}
			if tt.wantErr {
				if err == nil {
					t.Fatalf("no error for %v", tt.args)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if ef.target != tt.target || len(ef.alternates) != tt.alternates {
				t.Fatalf("target %q alternates %v", ef.target, ef.alternates)
			}
			if opts.PortalsFromDiscovery != strings.Contains(strings.Join(tt.args, " "), "--portals-from-discovery") {
				t.Fatalf("PortalsFromDiscovery %v", opts.PortalsFromDiscovery)
			}
			if opts.Recovery == nil || *opts.Recovery != tt.rec {
				t.Fatalf("recovery %+v, want %+v", opts.Recovery, tt.rec)
			}
		})
	}
}

// TestCommandTimeoutHelp: --command-timeout's help names the watchdog's escalation
// (recovery.go's unstick, docs/reliability.md), not only the final drop.
func TestCommandTimeoutHelp(t *testing.T) {
	var tf targetFlags
	fs := pflag.NewFlagSet("serve", pflag.ContinueOnError)
	tf.registerReliability(fs)
	usage := fs.Lookup("command-timeout").Usage
	for _, step := range []string{"ABORT TASK", "LOGICAL UNIT RESET", "drop", "re-issued"} {
		if !strings.Contains(usage, step) {
			t.Errorf("--command-timeout help %q does not mention %q", usage, step)
		}
	}
}
