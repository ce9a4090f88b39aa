//go:build vm

package ublk

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/iser-blk/iser-blk/test/vm/vmtest"
)

// requireCLI returns $ISERBLK_BIN: the shutdown tests are about the CLI's final flush, which
// the test-binary server does not have (test/vm/gotest.sh always builds the CLI).
func requireCLI(t *testing.T) string {
	t.Helper()
	bin := cliAttach()
	if bin == "" {
		t.Fatal("ISERBLK_BIN with `attach --ublk` is required (test/vm/gotest.sh builds it)")
	}
	return bin
}

// ddDirect writes mib MiB of random data to path with O_DIRECT and no FLUSH, so that a write-back
// cache holds it dirty.
func ddDirect(t *testing.T, path string, mib int) {
	t.Helper()
	run(t, "dd", "if=/dev/urandom", "of="+path, "bs=1M", fmt.Sprintf("count=%d", mib), "oflag=direct", "status=none")
}

// logIndex is where the first line containing msg starts in the server's log, or -1.
func logIndex(log, msg string) int { return strings.Index(log, msg) }

// TestVMSigtermDetachesThenFlushes: on SIGTERM the ublk disk is drained and deleted first, and
// only then is the device stack flushed, by the CLI's shutdown flush (the one that reports
// progress and honours a second signal); the process exits 0.
func TestVMSigtermDetachesThenFlushes(t *testing.T) {
	requireCLI(t)
	p := startServer(t, memTarget(t), 2, 64, "--cache", "writeback", "--cache-dirty", "100%", "--cache-write-around", "0")
	ddDirect(t, p.path, 64)
	took := p.terminate(t, 60*time.Second)
	log := p.stderr.String()
	deleted, flushed := logIndex(log, "ublk device deleted"), logIndex(log, "device flushed")
	if deleted < 0 || flushed < 0 {
		t.Fatalf("want 'ublk device deleted' and 'device flushed' in the log; got deleted at %d, flushed at %d", deleted, flushed)
	}
	if flushed < deleted {
		t.Fatal("the device stack was flushed before the ublk device was deleted: the flush did not run in the CLI's shutdown flush")
	}
	if strings.Contains(log, "ublk: final flush") {
		t.Fatal("the ublk server flushed by itself")
	}
	t.Logf("exit 0 %v after SIGTERM; ublk device deleted, then the stack flushed", took)
}

// TestVMSecondSignalAbortsUblkFlush: with the target gone and dirty data in the write-back cache,
// the shutdown flush cannot finish; it reports progress, a second SIGTERM aborts it, and the
// process says how much acknowledged data was not written and exits 1, with the disk removed
// before the flush began.
func TestVMSecondSignalAbortsUblkFlush(t *testing.T) {
	requireCLI(t)
	lio := vmtest.StartLIO(t, vmtest.LIOOptions{SizeMiB: 256, NoISER: true})
	// --replacement-timeout -1s: I/O waits for the lost session for ever, so only the second
	// signal can end the flush.
	p := startServer(t, lio.URL("iscsi"), 2, 64, "--cache", "writeback", "--cache-dirty", "100%", "--cache-write-around", "0",
		"--replacement-timeout", "-1s")
	lio.Teardown(t)
	ddDirect(t, p.path, 16) // absorbed by the write-back cache: nothing can reach the target
	p.cmd.Process.Signal(syscall.SIGTERM)
	// STOP_DEV may wait up to the 30 s drain timeout for a read udev's probe sent to the dead target.
	waitLog(t, p, "flush progress", 90*time.Second)
	p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.exited:
	case <-time.After(60 * time.Second):
		t.Fatal("server still running 60 s after the second SIGTERM")
	}
	var ee *exec.ExitError
	if !errors.As(p.err, &ee) || ee.ExitCode() != 1 {
		t.Fatalf("exit after an aborted flush: %v, want status 1", p.err)
	}
	log := p.stderr.String()
	for _, msg := range []string{"second signal: aborting the shutdown flush", "FINAL FLUSH FAILED", "dirty_bytes_lost"} {
		if !strings.Contains(log, msg) {
			t.Fatalf("the log lacks %q", msg)
		}
	}
	if deleted, flushing := logIndex(log, "ublk device deleted"), logIndex(log, "flushing dirty data"); deleted < 0 || flushing < deleted {
		t.Fatalf("the ublk device must be deleted before the flush starts (deleted at %d, flushing at %d)", deleted, flushing)
	}
	if _, err := os.Stat(p.path); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("%s still exists after the server exited (%v)", p.path, err)
	}
}

// waitLog waits until the server's log contains msg.
func waitLog(t *testing.T, p *serverProc, msg string, within time.Duration) {
	t.Helper()
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	deadline := time.After(within)
	for !strings.Contains(p.stderr.String(), msg) {
		select {
		case <-tick.C:
		case <-p.exited:
			t.Fatalf("server exited (%v) before logging %q", p.err, msg)
		case <-deadline:
			t.Fatalf("no %q in the server's log within %v", msg, within)
		}
	}
}
