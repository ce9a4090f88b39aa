package systemd

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// TestUnitStopVerb runs iser-blk-unit-stop with a fake systemctl that lists the unit's job and
// a fake iser-blk that records its arguments: a restart job keeps the device (stop --keep),
// every other stop detaches, a list that cannot be read detaches, and a gateway that has
// already exited is left alone.
func TestUnitStopVerb(t *testing.T) {
	const unit = `iser-blk@gw\x2d0.service`
	other := "7 iser-blk@gw1.service restart running\n"
	for _, tc := range []struct {
		name, jobs                string
		systemctlFails, noMainPID bool
		want                      string // the fake iser-blk's argv, "" when it must not run
	}{
		{name: "restart", jobs: other + "12 " + unit + " restart running\n", want: "stop --keep gw\\x2d0"},
		{name: "try-restart", jobs: "12 " + unit + " try-restart running\n", want: "stop --keep gw\\x2d0"},
		{name: "stop", jobs: other + "12 " + unit + " stop running\n", want: "detach gw\\x2d0"},
		{name: "shutdown", jobs: "1 poweroff.target start waiting\n12 " + unit + " stop running\n", want: "detach gw\\x2d0"},
		{name: "another unit restarts", jobs: other, want: "detach gw\\x2d0"},
		{name: "systemctl fails", jobs: "12 " + unit + " restart running\n", systemctlFails: true, want: "detach gw\\x2d0"},
		{name: "gateway already exited", jobs: "12 " + unit + " restart running\n", noMainPID: true, want: ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			record := filepath.Join(dir, "argv")
			fakeBin := filepath.Join(dir, "iser-blk")
			write(t, fakeBin, "#!/bin/sh\necho \"$*\" >"+record+"\n")
			status := "0"
			if tc.systemctlFails {
				status = "1"
			}
			write(t, filepath.Join(dir, "systemctl"), "#!/bin/sh\n[ \"$1\" = list-jobs ] || exit 9\ncat <<'E'\n"+tc.jobs+"E\nexit "+status+"\n")
			script, err := os.ReadFile("iser-blk-unit-stop")
			if err != nil {
				t.Fatal(err)
			}
			if !strings.Contains(string(script), "bin="+installedBinary+"\n") {
				t.Fatalf("the script no longer runs %s; update this test", installedBinary)
			}
			stop := filepath.Join(dir, "stop")
			write(t, stop, strings.Replace(string(script), "bin="+installedBinary, "bin="+fakeBin, 1))
			cmd := exec.Command(stop, `gw\x2d0`, unit)
			cmd.Env = []string{"PATH=" + dir + ":/usr/bin:/bin"}
			if !tc.noMainPID {
				cmd.Env = append(cmd.Env, "MAINPID=4242")
			}
			if out, err := cmd.CombinedOutput(); err != nil {
				t.Fatalf("%v\n%s", err, out)
			}
			got, err := os.ReadFile(record)
			if tc.want == "" {
				if err == nil {
					t.Fatalf("iser-blk ran (%q) although the gateway had exited", got)
				}
				return
			}
			if err != nil {
				t.Fatalf("iser-blk did not run: %v", err)
			}
			if s := strings.TrimSpace(string(got)); s != tc.want {
				t.Errorf("ran iser-blk %q, want %q", s, tc.want)
			}
		})
	}
}

func write(t *testing.T, path, content string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(content), 0o755); err != nil {
		t.Fatal(err)
	}
}
