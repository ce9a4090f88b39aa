//go:build e2e

// Package bench holds the benchmark harness (bench.py, run.sh) and the host test that bounds the
// gateway's memory: issue 18's "memory bounded and measured".
package bench

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/iser-blk/iser-blk/test/e2e/gateway"
	"github.com/iser-blk/iser-blk/test/e2e/tgtd"
)

// TestPeakRSSBounded random-writes 2 GiB (64 KiB requests, which the cache takes: they are below
// the write-around cutoff and not sequential) through a 256 MiB write-back cache in front of a
// 1 GiB tgtd LUN, so that the cache fills, evicts and writes back all the time, and checks the
// serving process's peak resident set (VmHWM) against --cache-size + --buffer-memory + 64 MiB.
func TestPeakRSSBounded(t *testing.T) {
	if _, err := exec.LookPath("fio"); err != nil {
		t.Fatal("fio is required (test/deps.txt)")
	}
	const cacheSize, bufferMemory, slack = 256 << 20, 128 << 20, 64 << 20
	tg := tgtd.Start(t, tgtd.Options{Size: 1 << 30})
	target := fmt.Sprintf("iscsi://%s/%s/%d", tg.Portal, tg.Name, tg.LUN)
	srv := gateway.Start(t, target, "--cache", "writeback", "--cache-size", "256MiB",
		"--buffer-memory", "128MiB")
	sock := strings.TrimPrefix(srv.URI, "nbd+unix:///?socket=")
	pid := pidWithArg(t, "unix://"+sock)
	out := filepath.Join(t.TempDir(), "fio.json")
	fio := exec.Command("fio", "--name=rss", "--ioengine=nbd", "--uri="+srv.URI, "--rw=randwrite",
		"--bs=64k", "--iodepth=16", "--size=1g", "--io_size=2g", "--randrepeat=0",
		"--output-format=json", "--output="+out)
	if b, err := fio.CombinedOutput(); err != nil {
		t.Fatalf("fio: %v: %s", err, b)
	}
	written := fioWritten(t, out)
	peak := vmHWM(t, pid)
	srv.Stop(t)
	bound := int64(cacheSize + bufferMemory + slack)
	t.Logf("wrote %d MiB; peak RSS %d MiB, bound %d MiB", written>>20, peak>>20, bound>>20)
	if written < 2<<30 {
		t.Fatalf("fio wrote %d bytes, want 2 GiB", written)
	}
	if peak > bound {
		t.Fatalf("peak RSS %d MiB above --cache-size + --buffer-memory + 64 MiB = %d MiB", peak>>20, bound>>20)
	}
}

// pidWithArg finds the process (our serve) whose command line holds arg: the socket path is
// unique to this test.
func pidWithArg(t *testing.T, arg string) int {
	t.Helper()
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		cl, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err == nil && bytes.Contains(cl, []byte(arg+"\x00")) {
			return pid
		}
	}
	t.Fatalf("no process serving %s", arg)
	return 0
}

// vmHWM is the peak resident set of pid in bytes (/proc/PID/status, proc(5)).
func vmHWM(t *testing.T, pid int) int64 {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range strings.Split(string(b), "\n") {
		if f := strings.Fields(l); len(f) >= 2 && f[0] == "VmHWM:" {
			kb, err := strconv.ParseInt(f[1], 10, 64)
			if err != nil {
				t.Fatal(err)
			}
			return kb << 10
		}
	}
	t.Fatal("no VmHWM in /proc/PID/status")
	return 0
}

// fioWritten is the bytes fio's JSON report says it wrote.
func fioWritten(t *testing.T, path string) int64 {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var r struct {
		Jobs []struct {
			Error int `json:"error"`
			Write struct {
				IOBytes int64 `json:"io_bytes"`
			} `json:"write"`
		} `json:"jobs"`
	}
	if err := json.Unmarshal(b, &r); err != nil || len(r.Jobs) != 1 || r.Jobs[0].Error != 0 {
		t.Fatalf("fio report %s: %v %+v", path, err, r)
	}
	return r.Jobs[0].Write.IOBytes
}
