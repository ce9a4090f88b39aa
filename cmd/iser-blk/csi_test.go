package main

import (
	"strings"
	"testing"
)

// TestCSIUsage: the plugin's flags are checked before anything listens: each mistake is exit 2
// with a message naming the flag.
func TestCSIUsage(t *testing.T) {
	dir := t.TempDir()
	for _, tt := range []struct {
		args []string
		want string
	}{
		{[]string{"csi", "--node-id", "n"}, "--endpoint"},
		{[]string{"csi", "--endpoint", "unix://" + dir + "/csi.sock"}, "--node-id"},
		{[]string{"csi", "--endpoint", "tcp://127.0.0.1:1", "--node-id", "n"}, "--endpoint"},
		{[]string{"csi", "--endpoint", "unix://" + dir + "/csi.sock", "--node-id", "n", "--max-volumes", "-1"}, "--max-volumes"},
		{[]string{"csi", "--endpoint", "unix://" + dir + "/csi.sock", "--node-id", "n", "--pool", dir + "/pool.json"}, "--pool"},
		{[]string{"csi", "extra", "--endpoint", "unix://" + dir + "/csi.sock", "--node-id", "n"}, "argument"},
	} {
		code, _, stderr := runOut(tt.args...)
		if code != exitUsage || !strings.Contains(stderr, tt.want) {
			t.Errorf("%q: exit %d, stderr %q; want exit %d naming %s", tt.args, code, stderr, exitUsage, tt.want)
		}
	}
	_, _, help := runOut("csi", "--help")
	for _, s := range []string{groupCSI + ":", "--endpoint", "--node-id", "--pool", "--run-dir", "--max-volumes"} {
		if !strings.Contains(help, s) {
			t.Errorf("csi --help lacks %s", s)
		}
	}
}
