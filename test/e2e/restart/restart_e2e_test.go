//go:build e2e

// Package restart_test is the host end-to-end test of `iser-blk restart` (issue 17) where no
// kernel device is needed: the refusals and their exit codes. The planned restart of an attached
// device is the VM tier's (frontend/ublk and frontend/nbd, TestVMPlannedRestart).
package restart_test

import (
	"bytes"
	"errors"
	"fmt"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/iser-blk/iser-blk/test/e2e/gateway"
	"github.com/iser-blk/iser-blk/test/e2e/tgtd"
)

// restart runs `iser-blk restart` and returns its stderr and exit code.
func restart(t *testing.T, runDir string, args ...string) (string, int) {
	t.Helper()
	cmd := exec.Command(gateway.Binary(t), append(append([]string{"restart"}, args...), "--run-dir", runDir)...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	err := cmd.Run()
	var ee *exec.ExitError
	switch {
	case err == nil:
		return stderr.String(), 0
	case errors.As(err, &ee):
		return stderr.String(), ee.ExitCode()
	}
	t.Fatalf("iser-blk restart: %v", err)
	return "", 0
}

// TestE2ERestartServeIsUnsupported: a serve gateway answers restart with a clear "unsupported"
// (exit 1) and keeps serving with the same PID.
func TestE2ERestartServeIsUnsupported(t *testing.T) {
	tg := tgtd.Start(t, tgtd.Options{Size: 16 << 20})
	runDir := filepath.Join(t.TempDir(), "run")
	s := gateway.Start(t, fmt.Sprintf("iscsi://%s/%s/%d", tg.Portal, tg.Name, tg.LUN), "--name", "srv", "--run-dir", runDir)
	msg, code := restart(t, runDir, "srv")
	if code != 1 || !strings.Contains(msg, "unsupported") || !strings.Contains(msg, "restart applies to attach") {
		t.Fatalf("restart of a serve gateway: exit %d, %q; want exit 1 and unsupported: restart applies to attach", code, msg)
	}
	out, err := exec.Command(gateway.Binary(t), "status", "srv", "--run-dir", runDir).CombinedOutput()
	if err != nil || !strings.Contains(string(out), "ready") {
		t.Fatalf("status after the refused restart: %v\n%s", err, out)
	}
	if strings.Contains(s.Log(), "re-executing") {
		t.Fatalf("the serve gateway re-executed:\n%s", s.Log())
	}
	s.Stop(t)
}

// TestE2ERestartUnknownName: no gateway by that name is exit 4.
func TestE2ERestartUnknownName(t *testing.T) {
	msg, code := restart(t, filepath.Join(t.TempDir(), "run"), "nobody")
	if code != 4 {
		t.Fatalf("restart of an unknown gateway: exit %d (%q), want 4", code, msg)
	}
}
