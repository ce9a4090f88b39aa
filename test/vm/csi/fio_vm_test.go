//go:build vm

package csivm

// fio as the workload that must survive the plugin's kill -9: 4 KiB random direct writes (QD16)
// to a file, then every block read back and checked (crc32c).

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os/exec"
	"testing"
	"time"

	"github.com/iser-blk/iser-blk/internal/syncbuf"
)

type fioVerify struct {
	done chan error
	out  *syncbuf.Buffer
	ios  int64 // 4 KiB blocks written, and to be verified
}

func startFio(t *testing.T, file string, sizeMiB int) *fioVerify {
	t.Helper()
	f := &fioVerify{done: make(chan error, 1), out: &syncbuf.Buffer{}, ios: int64(sizeMiB) << 8}
	cmd := exec.Command("fio", "--name=verify", "--filename="+file, fmt.Sprintf("--size=%dM", sizeMiB),
		"--rw=randwrite", "--bs=4k", "--ioengine=libaio", "--direct=1", "--iodepth=16", "--fsync_on_close=1",
		"--verify=crc32c", "--do_verify=1", "--verify_fatal=1", "--output-format=json")
	cmd.Stdout, cmd.Stderr = f.out, f.out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { f.done <- cmd.Wait() }()
	t.Cleanup(func() { cmd.Process.Kill() })
	return f
}

// running reports whether fio has not ended yet.
func (f *fioVerify) running() bool { return len(f.done) == 0 }

// wait requires fio to end within timeout with exit 0, no job error, and every block written and
// verified.
func (f *fioVerify) wait(t *testing.T, timeout time.Duration) {
	t.Helper()
	var err error
	select {
	case err = <-f.done:
	case <-time.After(timeout):
		t.Fatalf("fio still running after %v:\n%s", timeout, tail(f.out.String(), 20))
	}
	if err != nil {
		t.Fatalf("fio: %v\n%s", err, tail(f.out.String(), 30))
	}
	b := []byte(f.out.String())
	if i := bytes.IndexByte(b, '{'); i > 0 {
		b = b[i:]
	}
	var r struct {
		Jobs []struct {
			Error int `json:"error"`
			Read  struct {
				TotalIOs int64 `json:"total_ios"`
			} `json:"read"`
			Write struct {
				TotalIOs int64 `json:"total_ios"`
			} `json:"write"`
		} `json:"jobs"`
	}
	if err := json.Unmarshal(b, &r); err != nil || len(r.Jobs) != 1 {
		t.Fatalf("fio json (%v):\n%s", err, b)
	}
	j := r.Jobs[0]
	if j.Error != 0 || j.Write.TotalIOs != f.ios || j.Read.TotalIOs != f.ios {
		t.Fatalf("fio: error %d, %d writes, %d verified reads (want 0, %d, %d)", j.Error, j.Write.TotalIOs, j.Read.TotalIOs, f.ios, f.ios)
	}
	t.Logf("fio: %d writes, %d verified reads, 0 errors", j.Write.TotalIOs, j.Read.TotalIOs)
}
