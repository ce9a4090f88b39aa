//go:build e2e

// Package nbd_test is the host end-to-end test of `iser-blk serve`: the real binary, real NBD
// clients (libnbd's nbdinfo and nbdcopy, qemu-img, fio's nbd engine), a unix socket, SIGTERM.
// Each backend is one entry in backends: the in-memory device (the cost of the NBD protocol
// alone) and a private tgtd LUN on loopback behind the iSCSI/TCP backend.
package nbd_test

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/iser-blk/iser-blk/test/e2e/gateway"
	"github.com/iser-blk/iser-blk/test/e2e/tgtd"
)

const exportSize = 256 << 20

// backends maps a name to a function returning the --target URL. Switching the whole test to
// another target is one line here.
var backends = []struct {
	name   string
	target func(t *testing.T) string
}{
	{"memdev", func(t *testing.T) string { return fmt.Sprintf("mem://%d", exportSize) }},
	{"tgtd", func(t *testing.T) string {
		tg := tgtd.Start(t, tgtd.Options{Size: exportSize})
		// A thin-provisioned LUN, so that UNMAP (and with it NBD TRIM) is available.
		if out, err := tg.TGTAdm("--mode", "logicalunit", "--op", "update", "--tid", strconv.Itoa(tg.TID),
			"--lun", "1", "--params", "thin_provisioning=1"); err != nil {
			t.Fatalf("tgtadm thin_provisioning: %v %s", err, out)
		}
		return fmt.Sprintf("iscsi://%s/%s/%d", tg.Portal, tg.Name, tg.LUN)
	}},
}

// startServe runs the gateway in front of target.
func startServe(t *testing.T, target string, extra ...string) *gateway.Server {
	t.Helper()
	return gateway.Start(t, target, extra...)
}

// stopServe sends SIGTERM, requires exit 0 and the final flush in the log.
func stopServe(t *testing.T, s *gateway.Server) {
	t.Helper()
	s.Stop(t)
	if !strings.Contains(s.Log(), "device flushed") {
		t.Errorf("no final flush logged: %s", s.Log())
	}
}

func run(t *testing.T, name string, args ...string) []byte {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	out, err := exec.CommandContext(ctx, name, args...).CombinedOutput()
	if err != nil {
		t.Fatalf("%s %s: %v\n%s", name, strings.Join(args, " "), err, out)
	}
	return out
}

func TestServeWithNBDClients(t *testing.T) {
	for _, b := range backends {
		t.Run(b.name, func(t *testing.T) {
			srv := startServe(t, b.target(t))
			checkNBDInfo(t, srv.URI)
			checkCopyRoundTrip(t, srv.URI)
			checkFio(t, srv.URI)
			stopServe(t, srv)
		})
	}
}

// checkNBDInfo: the export's size and every capability the device has are advertised.
func checkNBDInfo(t *testing.T, uri string) {
	var info struct {
		Exports []map[string]any `json:"exports"`
	}
	out := run(t, "nbdinfo", "--json", uri)
	if err := json.Unmarshal(out, &info); err != nil || len(info.Exports) != 1 {
		t.Fatalf("nbdinfo --json: %v\n%s", err, out)
	}
	e := info.Exports[0]
	if size, _ := e["export-size"].(float64); int64(size) != exportSize {
		t.Errorf("export-size %v, want %d", e["export-size"], exportSize)
	}
	for _, k := range []string{"can_flush", "can_fua", "can_trim", "can_zero", "can_multi_conn"} {
		if v, _ := e[k].(bool); !v {
			t.Errorf("nbdinfo: %s = %v, want true", k, e[k])
		}
	}
	t.Logf("nbdinfo: size %v flush %v fua %v trim %v zero %v multi_conn %v", e["export-size"], e["can_flush"],
		e["can_fua"], e["can_trim"], e["can_zero"], e["can_multi_conn"])
}

// checkCopyRoundTrip: 256 MiB of random data in with nbdcopy, out with nbdcopy, equal; and
// qemu-img compare agrees.
func checkCopyRoundTrip(t *testing.T, uri string) {
	dir := t.TempDir()
	in := filepath.Join(dir, "in.img")
	out := filepath.Join(dir, "out.img")
	data := make([]byte, exportSize)
	if _, err := rand.Read(data); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(in, data, 0o600); err != nil {
		t.Fatal(err)
	}
	t0 := time.Now()
	run(t, "nbdcopy", in, uri)
	tIn := time.Since(t0)
	t0 = time.Now()
	run(t, "nbdcopy", uri, out)
	tOut := time.Since(t0)
	got, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, data) {
		t.Fatal("nbdcopy round trip: data differs")
	}
	t.Logf("nbdcopy 256 MiB: in %v, out %v", tIn.Round(time.Millisecond), tOut.Round(time.Millisecond))
	// And qemu-img, a different client, agrees.
	cmp := run(t, "qemu-img", "compare", "-f", "raw", "-F", "raw", in, uri)
	if !strings.Contains(string(cmp), "identical") {
		t.Fatalf("qemu-img compare: %s", cmp)
	}
}

type fioResult struct {
	Jobs []struct {
		Error int `json:"error"`
		Read  struct {
			IOBytes int64   `json:"io_bytes"`
			IOPS    float64 `json:"iops"`
		} `json:"read"`
		Write struct {
			IOBytes int64   `json:"io_bytes"`
			IOPS    float64 `json:"iops"`
		} `json:"write"`
	} `json:"jobs"`
}

// checkFio: 4 jobs (4 connections), iodepth 32: random writes with crc32c verification headers,
// then random reads of the same blocks verifying every checksum. Zero errors in fio's JSON.
func checkFio(t *testing.T, uri string) {
	dir := t.TempDir()
	job := filepath.Join(dir, "nbd.fio")
	spec := fmt.Sprintf(`[global]
ioengine=nbd
uri=%s
bs=4k
iodepth=32
numjobs=4
size=32m
offset_increment=64m
rw=randwrite
verify=crc32c
verify_state_save=0
randrepeat=1
group_reporting=1
[job]
`, uri)
	if err := os.WriteFile(job, []byte(spec), 0o600); err != nil {
		t.Fatal(err)
	}
	phase := func(name string, extra ...string) fioResult {
		args := append([]string{"--output-format=json"}, extra...)
		out := run(t, "fio", append(args, job)...)
		i := bytes.IndexByte(out, '{') // the nbd engine prints "connected" lines first
		var r fioResult
		if i < 0 || json.Unmarshal(out[i:], &r) != nil || len(r.Jobs) != 1 {
			t.Fatalf("fio %s: cannot parse output:\n%s", name, out)
		}
		if r.Jobs[0].Error != 0 {
			t.Fatalf("fio %s: error %d", name, r.Jobs[0].Error)
		}
		return r
	}
	w := phase("randwrite", "--do_verify=0")
	if w.Jobs[0].Write.IOBytes != 4*32<<20 {
		t.Fatalf("fio randwrite wrote %d bytes", w.Jobs[0].Write.IOBytes)
	}
	r := phase("randread+verify", "--verify_only=1")
	if r.Jobs[0].Read.IOBytes != 4*32<<20 {
		t.Fatalf("fio verify read %d bytes, want %d", r.Jobs[0].Read.IOBytes, 4*32<<20)
	}
	t.Logf("fio 4 jobs x iodepth 32, 4 KiB: randwrite %.0f IOPS, randread+crc32c verify %.0f IOPS, 0 errors",
		w.Jobs[0].Write.IOPS, r.Jobs[0].Read.IOPS)
}

// TestServeSocketHandling: a stale socket file is replaced, a live server's socket and a regular
// file are not, and a read-only export refuses writes.
func TestServeSocketHandling(t *testing.T) {
	dir := t.TempDir()
	sock := filepath.Join(dir, "s.sock")
	// A stale socket: bound, then its listener gone without unlinking.
	fd, err := syscall.Socket(syscall.AF_UNIX, syscall.SOCK_STREAM, 0)
	if err != nil {
		t.Fatal(err)
	}
	if err := syscall.Bind(fd, &syscall.SockaddrUnix{Name: sock}); err != nil {
		t.Fatal(err)
	}
	syscall.Close(fd)
	cmd := exec.Command(gateway.Binary(t), "serve", "--target", "mem://16MiB", "--listen", "unix://"+sock, "--read-only")
	stdout, _ := cmd.StdoutPipe()
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { cmd.Process.Signal(syscall.SIGTERM); cmd.Wait() }()
	line, err := bufio.NewReader(stdout).ReadString('\n')
	if err != nil {
		t.Fatalf("serve over a stale socket: %v %s", err, stderr.String())
	}
	uri := strings.TrimSpace(line)
	out := run(t, "nbdinfo", "--json", uri)
	if !strings.Contains(string(out), `"is_read_only": true`) {
		t.Errorf("read-only export not advertised:\n%s", out)
	}
	if o, err := exec.Command("nbdcopy", "/dev/zero", "--length", "4096", uri).CombinedOutput(); err == nil {
		t.Errorf("write to a read-only export succeeded: %s", o)
	}
	// A second server on the live socket must refuse, not steal it (in another run directory:
	// in the same one its name, the socket's base name, is refused first).
	o, err := exec.Command(gateway.Binary(t), "serve", "--target", "mem://1MiB", "--listen", "unix://"+sock,
		"--run-dir", t.TempDir()).CombinedOutput()
	if err == nil || !strings.Contains(string(o), "another server") {
		t.Errorf("second server on a live socket: %v %s", err, o)
	}
	// A regular file is never removed.
	file := filepath.Join(dir, "file")
	os.WriteFile(file, []byte("keep"), 0o600)
	o, err = exec.Command(gateway.Binary(t), "serve", "--target", "mem://1MiB", "--listen", "unix://"+file).CombinedOutput()
	if b, _ := os.ReadFile(file); err == nil || string(b) != "keep" {
		t.Errorf("regular file at the socket path: %v %s", err, o)
	}
}
