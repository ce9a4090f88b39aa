package systemd

import (
	"bufio"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

const (
	installedBinary = "/usr/local/bin/iser-blk"
	installedStop   = "/usr/local/libexec/iser-blk/iser-blk-unit-stop"
)

// TestUnitVerifies runs `systemd-analyze verify` on an instance of the template, with the
// binary path pointed at a stand-in executable (verify checks that ExecStart exists). Any
// output (systemd logs "ignoring" for a bad setting and still exits 0) is a failure.
func TestUnitVerifies(t *testing.T) {
	analyze, err := exec.LookPath("systemd-analyze")
	if err != nil {
		t.Fatalf("systemd-analyze is needed to check the unit: %v", err)
	}
	unit, err := os.ReadFile("iser-blk@.service")
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	bin := filepath.Join(dir, "iser-blk")
	if err := os.WriteFile(bin, []byte("#!/bin/sh\nexit 0\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(unit), installedBinary) {
		t.Fatalf("unit no longer runs %s; update this test", installedBinary)
	}
	stop := filepath.Join(dir, "iser-blk-unit-stop")
	if err := os.WriteFile(stop, []byte("#!/bin/sh\nexit 0\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(unit), installedStop) {
		t.Fatalf("unit no longer runs %s; update this test", installedStop)
	}
	local := strings.ReplaceAll(string(unit), installedBinary, bin)
	local = strings.ReplaceAll(local, installedStop, stop)
	if err := os.WriteFile(filepath.Join(dir, "iser-blk@.service"), []byte(local), 0o644); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(analyze, "verify", "--man=no", "./iser-blk@gw0.service")
	cmd.Dir = dir
	out, err := cmd.CombinedOutput()
	if err != nil || len(out) > 0 {
		t.Fatalf("systemd-analyze verify: %v\n%s", err, out)
	}
}

// TestUnitContract checks the settings docs/operations.md promises.
func TestUnitContract(t *testing.T) {
	settings := readSettings(t, "iser-blk@.service")
	want := map[string]string{
		"Type":            "notify",
		"EnvironmentFile": "/etc/iser-blk/%i.conf",
		"ExecStop":        installedStop + " %i %n",
		"ExecReload":      installedBinary + " restart %i",
		"Restart":         "on-failure",
		"After":           "network-online.target",
		"Wants":           "network-online.target",
		"Before":          "remote-fs.target",
		"TimeoutStopSec":  "10min",
		// exit codes a restart cannot fix: usage, CHAP, no kernel support, no takeover
		"RestartPreventExitStatus": "2 3 6 7",
		"StartLimitBurst":          "5",
		"StartLimitIntervalSec":    "3min",
		"RestartSec":               "5s",
		// stop --keep leaves an nbd device's sockets in the store (one per connection, at
		// most 64); only the main process may store (the successor trusts what it is given)
		"FileDescriptorStoreMax": "64",
		"NotifyAccess":           "main",
	}
	for k, v := range want {
		if !contains(strings.Fields(strings.Join(settings[k], " ")), strings.Fields(v)[0]) && !contains(settings[k], v) {
			t.Errorf("%s=%v, want %s among them", k, settings[k], v)
		}
	}
	if v := settings["RestartPreventExitStatus"]; len(v) != 1 || v[0] != "2 3 6 7" {
		t.Errorf("RestartPreventExitStatus=%v, want exactly 2 3 6 7", v)
	}
	if start := strings.Join(settings["ExecStart"], " "); !strings.Contains(start, "--name=%i") {
		t.Errorf("ExecStart %q does not name the gateway after the instance", start)
	}
}

// TestExampleConf: every line is a comment or VAR=value, the variables the unit uses are set,
// and no secret value sits in ISERBLK_ARGS (which becomes argv).
func TestExampleConf(t *testing.T) {
	settings := readSettings(t, "iser-blk.conf.example")
	for _, k := range []string{"ISERBLK_COMMAND", "ISERBLK_ARGS"} {
		if len(settings[k]) != 1 || settings[k][0] == "" {
			t.Errorf("%s not set in the example", k)
		}
	}
	args := strings.Join(settings["ISERBLK_ARGS"], " ")
	if regexp.MustCompile(`--chap-secret[= ]|:[^@/]+@`).MatchString(args) {
		t.Errorf("ISERBLK_ARGS carries a secret: %q", args)
	}
	for k, v := range settings {
		if strings.Contains(k, "SECRET") && len(v) > 0 {
			t.Errorf("example sets %s; it must stay commented out", k)
		}
	}
}

// readSettings parses KEY=value lines (unit sections are ignored: keys are unique enough here).
func readSettings(t *testing.T, path string) map[string][]string {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	settings := map[string][]string{}
	sc := bufio.NewScanner(f)
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if line == "" || line[0] == '#' || line[0] == '[' {
			continue
		}
		k, v, ok := strings.Cut(line, "=")
		if !ok {
			t.Fatalf("%s:%d: not KEY=value: %q", path, n, line)
		}
		settings[k] = append(settings[k], v)
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return settings
}

func contains(list []string, v string) bool {
	for _, s := range list {
		if s == v {
			return true
		}
	}
	return false
}
