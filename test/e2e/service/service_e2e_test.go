//go:build e2e

// Package service_test is the host end-to-end test of a gateway run as a service (issue 16): the
// real binary serving tgtd LUNs, named, listed, inspected through `status` and /metrics, and
// detached through its control socket; sd_notify as systemd would see it.
package service_test

import (
	"bytes"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/iser-blk/iser-blk/internal/sdnotify/sdnotifytest"
	"github.com/iser-blk/iser-blk/internal/status"
	"github.com/iser-blk/iser-blk/test/e2e/gateway"
	"github.com/iser-blk/iser-blk/test/e2e/tgtd"
)

const lunSize = 32 << 20

// fleet is the gateways of one test sharing a run directory.
type fleet struct {
	t      *testing.T
	runDir string
}

func newFleet(t *testing.T) *fleet {
	return &fleet{t: t, runDir: filepath.Join(t.TempDir(), "run")}
}

// serve starts a gateway named name in front of a new tgtd LUN.
func (f *fleet) serve(name string, extra ...string) (*gateway.Server, *tgtd.Target) {
	tg := tgtd.Start(f.t, tgtd.Options{Size: lunSize})
	target := fmt.Sprintf("iscsi://%s/%s/%d", tg.Portal, tg.Name, tg.LUN)
	args := append([]string{"--name", name, "--run-dir", f.runDir}, extra...)
	return gateway.Start(f.t, target, args...), tg
}

// cli runs an iser-blk management command and returns its stdout and exit code.
func (f *fleet) cli(args ...string) (string, int) {
	f.t.Helper()
	cmd := exec.Command(gateway.Binary(f.t), append(args, "--run-dir", f.runDir)...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	var ee *exec.ExitError
	switch {
	case err == nil:
		return stdout.String(), 0
	case errors.As(err, &ee):
		f.t.Logf("iser-blk %s: exit %d: %s", strings.Join(args, " "), ee.ExitCode(), stderr.String())
		return stdout.String(), ee.ExitCode()
	}
	f.t.Fatalf("iser-blk %v: %v", args, err)
	return "", 0
}

func (f *fleet) status(name string) status.Status {
	f.t.Helper()
	out, code := f.cli("status", name, "--json")
	var st status.Status
	if code != 0 || json.Unmarshal([]byte(out), &st) != nil {
		f.t.Fatalf("status %s --json: exit %d, output %q", name, code, out)
	}
	return st
}

func (f *fleet) list() []status.Gateway {
	f.t.Helper()
	out, code := f.cli("list", "--json")
	var gs []status.Gateway
	if code != 0 || json.Unmarshal([]byte(out), &gs) != nil {
		f.t.Fatalf("list --json: exit %d, output %q", code, out)
	}
	return gs
}

func names(gs []status.Gateway) []string {
	var out []string
	for _, g := range gs {
		out = append(out, g.Name)
	}
	return out
}

var metricsListen = regexp.MustCompile(`\tmetrics\t\{"listen": "([^"]+)"`)

// scrape fetches and parses a gateway's /metrics.
func scrape(t *testing.T, s *gateway.Server) map[string]*dto.MetricFamily {
	t.Helper()
	m := metricsListen.FindStringSubmatch(s.Log())
	if m == nil {
		t.Fatalf("no metrics address in the log: %s", s.Log())
	}
	resp, err := http.Get("http://" + m[1] + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	parser := expfmt.NewTextParser(model.UTF8Validation)
	mfs, err := parser.TextToMetricFamilies(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return mfs
}

// metric is the value of family name's series with label op=op ("" for none).
func metric(t *testing.T, mfs map[string]*dto.MetricFamily, name, op string) float64 {
	t.Helper()
	mf := mfs[name]
	if mf == nil {
		t.Fatalf("no metric %s", name)
	}
	for _, m := range mf.GetMetric() {
		match := op == ""
		for _, l := range m.GetLabel() {
			if l.GetName() == "op" && l.GetValue() == op {
				match = true
			}
		}
		if match {
			switch {
			case m.Counter != nil:
				return m.Counter.GetValue()
			case m.Gauge != nil:
				return m.Gauge.GetValue()
			}
		}
	}
	t.Fatalf("no %s{op=%q}", name, op)
	return 0
}

type fioCounts struct {
	Jobs []struct {
		Error int `json:"error"`
		Read  struct {
			IOBytes  uint64 `json:"io_bytes"`
			TotalIOs uint64 `json:"total_ios"`
		} `json:"read"`
		Write struct {
			IOBytes  uint64 `json:"io_bytes"`
			TotalIOs uint64 `json:"total_ios"`
		} `json:"write"`
	} `json:"jobs"`
}

// fio runs a 4 KiB random read/write job with the nbd engine and returns its counts.
func fio(t *testing.T, uri string) fioCounts {
	t.Helper()
	out, err := exec.Command("fio", "--output-format=json", "--name=rw", "--ioengine=nbd", "--uri="+uri,
		"--rw=randrw", "--bs=4k", "--iodepth=16", "--size=16m", "--io_size=16m", "--randrepeat=1",
		"--group_reporting=1").Output()
	if err != nil {
		t.Fatalf("fio: %v\n%s", err, out)
	}
	var r fioCounts
	i := bytes.IndexByte(out, '{')
	if i < 0 || json.Unmarshal(out[i:], &r) != nil || len(r.Jobs) != 1 || r.Jobs[0].Error != 0 {
		t.Fatalf("fio: cannot parse or failed:\n%s", out)
	}
	return r
}

func within1pct(got, want float64) bool { return math.Abs(got-want) <= want/100 }

// TestServiceAcceptance is issue 16's host acceptance list against tgtd.
func TestServiceAcceptance(t *testing.T) {
	f := newFleet(t)
	g1, tg1 := f.serve("g1", "--metrics-listen", "127.0.0.1:0")
	g2, _ := f.serve("g2")

	out, code := f.cli("list")
	if code != 0 || !strings.Contains(out, "g1") || !strings.Contains(out, "g2") {
		t.Fatalf("list: exit %d:\n%s", code, out)
	}
	if got := names(f.list()); strings.Join(got, ",") != "g1,g2" {
		t.Fatalf("list --json names %v, want g1,g2", got)
	}

	// fio's counts equal /metrics' and status' (nothing else does I/O on g1).
	r := fio(t, g1.URI).Jobs[0]
	mfs := scrape(t, g1)
	st := f.status("g1")
	ops := map[string]status.OpStats{}
	for _, o := range st.IO.Ops {
		ops[o.Op] = o
	}
	for _, c := range []struct {
		op          string
		ios, bytes  uint64
		bytesMetric string
	}{
		{"read", r.Read.TotalIOs, r.Read.IOBytes, "iser_blk_read_bytes_total"},
		{"write", r.Write.TotalIOs, r.Write.IOBytes, "iser_blk_written_bytes_total"},
	} {
		if got := metric(t, mfs, "iser_blk_requests_total", c.op); !within1pct(got, float64(c.ios)) {
			t.Errorf("/metrics %s requests %v, fio %d", c.op, got, c.ios)
		}
		if got := metric(t, mfs, c.bytesMetric, ""); !within1pct(got, float64(c.bytes)) {
			t.Errorf("/metrics %s %v, fio %d", c.bytesMetric, got, c.bytes)
		}
		if o := ops[c.op]; !within1pct(float64(o.Requests), float64(c.ios)) || !within1pct(float64(o.Bytes), float64(c.bytes)) {
			t.Errorf("status %s: %d requests %d bytes, fio %d requests %d bytes", c.op, o.Requests, o.Bytes, c.ios, c.bytes)
		}
	}
	t.Logf("fio: %d reads %d writes; metrics and status agree", r.Read.TotalIOs, r.Write.TotalIOs)
	if st.Cache == nil || st.Cache.DirtyBytes == 0 {
		t.Errorf("no dirty bytes after fio's writes: %+v", st.Cache)
	}
	if len(st.Paths) != 1 || st.Paths[0].Portal != tg1.Portal || st.Paths[0].State != "up" || st.Paths[0].Transport != "tcp" ||
		st.Paths[0].Negotiated.MaxBurstLength == 0 || st.Paths[0].Negotiated.MaxRecvDataSegmentLengthTarget == 0 {
		t.Errorf("status paths %+v, want one up tcp path to %s with its negotiated parameters", st.Paths, tg1.Portal)
	}
	if st.LUN == nil || st.LUN.SizeBytes != lunSize || st.LUN.BlockSize != 512 {
		t.Errorf("status lun %+v, want %d bytes of 512-byte blocks", st.LUN, lunSize)
	}

	// Known data over the whole LUN, then a FLUSH: nothing dirty.
	want := make([]byte, lunSize)
	rand.Read(want)
	src := filepath.Join(t.TempDir(), "data")
	if err := os.WriteFile(src, want, 0o600); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command("nbdcopy", src, g1.URI).CombinedOutput(); err != nil {
		t.Fatalf("nbdcopy: %v %s", err, out)
	}
	if out, err := exec.Command("qemu-io", "-f", "raw", "-c", "flush", g1.URI).CombinedOutput(); err != nil {
		t.Fatalf("qemu-io flush: %v %s", err, out)
	}
	if d := f.status("g1").Cache.DirtyBytes; d != 0 {
		t.Errorf("%d dirty bytes after a FLUSH", d)
	}

	checkControlSocket(t, f, g2)

	// Detach g1: exit 0, the process gone, the backing file holds the data.
	if _, code := f.cli("detach", "g1"); code != 0 {
		t.Fatalf("detach g1: exit %d", code)
	}
	if err := g1.Wait(t, 10*time.Second); err != nil {
		t.Fatalf("g1 exited with %v", err)
	}
	got, err := tg1.ReadBacking(0, lunSize)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		t.Fatalf("the backing file does not hold what was written")
	}
	if _, code := f.cli("detach", "nosuch"); code != 4 {
		t.Errorf("detach of an unknown name: exit %d, want 4", code)
	}

	// A second g2 is refused with 2 naming the PID; after kill -9 the name is free again.
	tg3 := tgtd.Start(t, tgtd.Options{Size: lunSize})
	target3 := fmt.Sprintf("iscsi://%s/%s/%d", tg3.Portal, tg3.Name, tg3.LUN)
	dup := exec.Command(gateway.Binary(t), "serve", "--target", target3, "--name", "g2", "--run-dir", f.runDir,
		"--listen", "unix://"+filepath.Join(t.TempDir(), "dup.sock"))
	dupOut, err := dup.CombinedOutput()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != 2 || !strings.Contains(string(dupOut), fmt.Sprint(g2.PID())) {
		t.Fatalf("second g2: %v %s, want exit 2 naming PID %d", err, dupOut, g2.PID())
	}
	if err := syscall.Kill(g2.PID(), syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	g2.Wait(t, 10*time.Second)
	if got := names(f.list()); len(got) != 0 {
		t.Fatalf("list after kill -9 shows %v", got)
	}
	g2b := gateway.Start(t, target3, "--name", "g2", "--run-dir", f.runDir)
	if got := names(f.list()); strings.Join(got, ",") != "g2" {
		t.Fatalf("list shows %v, want the new g2", got)
	}
	g2b.Stop(t)
}

// checkControlSocket: mode 0600, nobody cannot connect, a malformed request gets an error reply
// and the gateway keeps serving.
func checkControlSocket(t *testing.T, f *fleet, g *gateway.Server) {
	sock := filepath.Join(f.runDir, "g2.sock")
	fi, err := os.Stat(sock)
	if err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("control socket %s: %v mode %v, want 0600", sock, err, fi.Mode())
	}
	if out, err := exec.Command("setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups",
		gateway.Binary(t), "status", "g2", "--run-dir", f.runDir).CombinedOutput(); err == nil {
		t.Fatalf("nobody could read the status: %s", out)
	}
	c, err := net.Dial("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := c.Write([]byte("{not json\n")); err != nil {
		t.Fatal(err)
	}
	c.SetReadDeadline(time.Now().Add(10 * time.Second))
	reply, _ := io.ReadAll(io.LimitReader(c, 4096))
	if !strings.Contains(string(reply), `"error"`) {
		t.Fatalf("malformed request got %q, want an error reply", reply)
	}
	if out, err := exec.Command("nbdinfo", "--size", g.URI).CombinedOutput(); err != nil {
		t.Fatalf("I/O after a malformed control request: %v %s", err, out)
	}
	if st := f.status("g2"); st.Gateway.State != "ready" {
		t.Fatalf("g2 is %s after a malformed request", st.Gateway.State)
	}
}

// TestServiceSDNotify: READY=1 only once the socket accepts I/O; STOPPING=1 at SIGTERM and
// EXTEND_TIMEOUT_USEC while the final flush writes back.
func TestServiceSDNotify(t *testing.T) {
	ns := sdnotifytest.Listen(t)
	tg := tgtd.Start(t, tgtd.Options{Size: 256 << 20})
	target := fmt.Sprintf("iscsi://%s/%s/%d", tg.Portal, tg.Name, tg.LUN)
	runDir := filepath.Join(t.TempDir(), "run")
	s := gateway.Start(t, target, "--name", "n1", "--run-dir", runDir)
	for {
		msg := ns.Receive()
		if strings.Contains(msg, "READY=1") {
			break
		}
	}
	// READY=1 came after the socket accepted I/O: it is usable now, with nothing awaited.
	if out, err := exec.Command("nbdinfo", "--size", s.URI).CombinedOutput(); err != nil {
		t.Fatalf("after READY=1 the socket does not serve: %v %s", err, out)
	}
	// Dirty data for the final flush: small writes (large ones go around the cache), fio's nbd
	// engine sends no FLUSH, and 32 MiB stay below the cache's low watermark (128 MiB).
	if out, err := exec.Command("fio", "--name=fill", "--ioengine=nbd", "--uri="+s.URI, "--rw=randwrite",
		"--bs=4k", "--iodepth=16", "--size=32m").CombinedOutput(); err != nil {
		t.Fatalf("fio: %v %s", err, out)
	}
	out, err := exec.Command(gateway.Binary(t), "status", "n1", "--json", "--run-dir", runDir).Output()
	var st status.Status
	if err != nil || json.Unmarshal(out, &st) != nil || st.Cache == nil || st.Cache.DirtyBytes == 0 {
		t.Fatalf("before SIGTERM: status %v %s, want dirty bytes (small writes are cached)", err, out)
	}
	// Read every message up to the last (STATUS=stopped) while the gateway stops: like
	// systemd, so that its notifications never wait for room in the socket.
	s.Signal(t, syscall.SIGTERM)
	var stopping, extend, stopped bool
	for !stopped {
		msg := ns.Receive()
		stopping = stopping || strings.Contains(msg, "STOPPING=1")
		extend = extend || (stopping && strings.Contains(msg, "EXTEND_TIMEOUT_USEC="))
		stopped = strings.Contains(msg, "STATUS=stopped")
	}
	if !stopping || !extend {
		t.Errorf("STOPPING=1 seen: %v; EXTEND_TIMEOUT_USEC during the flush seen: %v", stopping, extend)
	}
	if err := s.Wait(t, 2*time.Minute); err != nil {
		t.Fatalf("serve exited with %v", err)
	}
}

// TestServiceDetachKeepsDataWhenWriteBackFails: with the target gone the write-back before
// detach cannot finish; detach exits 1 and the gateway keeps serving with its dirty data, which a
// detach after the target is back writes to the backing file.
func TestServiceDetachKeepsDataWhenWriteBackFails(t *testing.T) {
	f := newFleet(t)
	g, tg := f.serve("wb")
	// 1 MiB of 0x5a in 4 KiB writes: small writes stay in the cache, and fio sends no FLUSH.
	if out, err := exec.Command("fio", "--name=w", "--ioengine=nbd", "--uri="+g.URI, "--rw=write", "--bs=4k",
		"--size=1m", "--buffer_pattern=0x5a").CombinedOutput(); err != nil {
		t.Fatalf("fio: %v %s", err, out)
	}
	if d := f.status("wb").Cache.DirtyBytes; d == 0 {
		t.Fatal("no dirty data after the writes: the cache wrote them back already")
	}
	dirty := f.status("wb").Cache.DirtyBytes
	tg.Kill()
	if _, code := f.cli("detach", "wb", "--timeout", "3s"); code != 1 {
		t.Fatalf("detach with the target gone: exit %d, want 1", code)
	}
	st := f.status("wb")
	if st.Gateway.State != "ready" || st.Cache.DirtyBytes != dirty {
		t.Fatalf("after the failed detach: state %s, %d dirty bytes; want ready with %d", st.Gateway.State, st.Cache.DirtyBytes, dirty)
	}
	if err := tg.Restart(); err != nil {
		t.Fatal(err)
	}
	if out, code := f.cli("detach", "wb"); code != 0 {
		t.Fatalf("detach with the target back: exit %d %s", code, out)
	}
	if err := g.Wait(t, time.Minute); err != nil {
		t.Fatalf("gateway exited with %v", err)
	}
	got, err := tg.ReadBacking(0, 1<<20)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, bytes.Repeat([]byte{0x5a}, 1<<20)) {
		t.Fatal("the backing file does not hold the data kept through the failed detach")
	}
}
