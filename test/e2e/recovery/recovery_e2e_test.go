//go:build e2e

// Package recovery_test is the host end-to-end test of the gateway's reliability (issue 8):
// the real `iser-blk serve` binary in front of a private tgtd, real NBD clients (fio with
// crc32c verification, qemu-io, nbdcopy), and the target killed, restarted or kept away.
//
// The binary is $ISERBLK_BIN or bin/iser-blk at the module root (`make build`).
package recovery_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/iser-blk/iser-blk/backend/iser/iscsitest"
	"github.com/iser-blk/iser-blk/backend/iser/scsi/scsitest"
	"github.com/iser-blk/iser-blk/test/e2e/gateway"
	"github.com/iser-blk/iser-blk/test/e2e/netns"
	"github.com/iser-blk/iser-blk/test/e2e/tgtd"
)

// startServe runs the gateway in front of tg's LUN.
func startServe(t *testing.T, tg *tgtd.Target, extra ...string) *gateway.Server {
	t.Helper()
	return gateway.Start(t, fmt.Sprintf("iscsi://%s/%s/%d", tg.Portal, tg.Name, tg.LUN), extra...)
}

type fioResult struct {
	Jobs []struct {
		Error int `json:"error"`
		Read  struct {
			IOBytes int64 `json:"io_bytes"`
		} `json:"read"`
		Write struct {
			IOBytes int64 `json:"io_bytes"`
		} `json:"write"`
	} `json:"jobs"`
}

// TestGatewayTargetKilledAndRestarted (acceptance 1): fio writes with crc32c verify headers
// through the gateway while tgtd is SIGKILLed and restarted 10 s later on the same port and
// backing file; fio then reads every block back and verifies it. Zero fio errors; the gateway
// logs the path down, the reconnect and the replay.
//
// Fairness: tgt's rdwr backing store writes with pwrite into the backing file, so data it
// acknowledged is in the page cache and survives killing the process (only a host crash could
// lose it); the gateway runs --cache off so every acknowledged write has reached tgtd.
func TestGatewayTargetKilledAndRestarted(t *testing.T) {
	tg := tgtd.Start(t, tgtd.Options{Size: 256 << 20})
	srv := startServe(t, tg, "--cache", "off", "--sessions", "2", "--noop-interval", "1s", "--noop-timeout", "2s")
	fioDone, fioOut := startFio(t, srv.URI)

	srv.WaitWritten(t, 8<<20, time.Minute) // fio is writing through the gateway
	tg.Kill()
	killed := time.Now()
	<-time.After(10 * time.Second) // the outage
	if err := tg.Restart(); err != nil {
		t.Fatal(err)
	}
	t.Logf("tgtd killed and restarted after %v", time.Since(killed).Round(time.Millisecond))
	checkFio(t, fioDone, fioOut)
	down, restored := srv.LogLines("\tpath down\t"), srv.LogLines("\tsession restored\t")
	reconnecting := srv.LogLines("\treconnecting\t")
	if len(down) == 0 || len(restored) == 0 || len(reconnecting) == 0 {
		t.Fatalf("the log does not show the outage: %d path down, %d reconnecting, %d session restored lines", len(down), len(reconnecting), len(restored))
	}
	for _, l := range append(down[:1], restored...) {
		t.Logf("gateway: %s", l)
	}
	t.Logf("fio: 128 MiB written across the restart, 128 MiB read back with crc32c verification, 0 errors")
	srv.Stop(t)
}

// startFio starts fio through the export: 4 jobs x 32 MiB of 4 KiB random writes with crc32c
// verify headers, writes paced at 1000 IOPS per job so that the run lasts about 8 s, then the
// verify pass reading every block back.
func startFio(t *testing.T, uri string) (<-chan error, *bytes.Buffer) {
	t.Helper()
	job := filepath.Join(t.TempDir(), "verify.fio")
	spec := fmt.Sprintf(`[global]
ioengine=nbd
uri=%s
bs=4k
iodepth=16
numjobs=4
size=32m
offset_increment=64m
rw=randwrite
verify=crc32c
do_verify=1
verify_fatal=1
rate_iops=,1000
verify_state_save=0
randrepeat=1
group_reporting=1
[job]
`, uri)
	if err := os.WriteFile(job, []byte(spec), 0o600); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	t.Cleanup(cancel)
	fio := exec.CommandContext(ctx, "fio", "--output-format=json", job)
	fio.Dir = t.TempDir() // fio drops state files in its working directory
	var out bytes.Buffer
	fio.Stdout, fio.Stderr = &out, &out
	if err := fio.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- fio.Wait() }()
	return done, &out
}

// checkFio waits for fio and requires exit 0, zero errors and every byte written and verified.
func checkFio(t *testing.T, done <-chan error, fioOut *bytes.Buffer) {
	t.Helper()
	if err := <-done; err != nil {
		t.Fatalf("fio: %v\n%s", err, fioOut.String())
	}
	out := fioOut.Bytes()
	var r fioResult
	i := bytes.IndexByte(out, '{')
	if i < 0 || json.Unmarshal(out[i:], &r) != nil || len(r.Jobs) != 1 {
		t.Fatalf("fio: cannot parse output:\n%s", out)
	}
	if r.Jobs[0].Error != 0 {
		t.Fatalf("fio error %d:\n%s", r.Jobs[0].Error, out)
	}
	if r.Jobs[0].Write.IOBytes != 4*32<<20 || r.Jobs[0].Read.IOBytes != 4*32<<20 {
		t.Fatalf("fio wrote %d and verified %d bytes, want %d each", r.Jobs[0].Write.IOBytes, r.Jobs[0].Read.IOBytes, 4*32<<20)
	}
}

// timedRead reads 4 KiB at 0 through the export with qemu-io and returns how long it took and
// whether it failed with EIO.
func timedRead(t *testing.T, uri string) (time.Duration, bool, string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	start := time.Now()
	out, err := exec.CommandContext(ctx, "qemu-io", "-f", "raw", "-c", "read -P 0x5a 0 4k", uri).CombinedOutput()
	took := time.Since(start)
	s := string(out)
	if err == nil && !strings.Contains(s, "failed") && !strings.Contains(s, "Pattern verification") {
		return took, false, s
	}
	if strings.Contains(s, "Input/output error") {
		return took, true, s
	}
	t.Fatalf("qemu-io read: %v\n%s", err, s)
	return 0, false, ""
}

// TestGatewayReplacementTimeout (acceptance 2): with the target gone longer than
// --replacement-timeout 5s, a read fails with EIO after about 5 s (not hanging), new reads fail
// at once, and reads succeed again once the target is back.
func TestGatewayReplacementTimeout(t *testing.T) {
	tg := tgtd.Start(t, tgtd.Options{Size: 16 << 20})
	srv := startServe(t, tg, "--cache", "off", "--replacement-timeout", "5s")
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if out, err := exec.CommandContext(ctx, "qemu-io", "-f", "raw", "-c", "write -P 0x5a 0 4k", srv.URI).CombinedOutput(); err != nil || strings.Contains(string(out), "failed") {
		t.Fatalf("qemu-io write: %v %s", err, out)
	}
	if took, eio, out := timedRead(t, srv.URI); eio {
		t.Fatalf("read before the outage failed after %v: %s", took, out)
	}

	tg.Kill()
	took, eio, out := timedRead(t, srv.URI)
	t.Logf("read with the target gone: EIO=%v after %v", eio, took.Round(time.Millisecond))
	if !eio || took < 4500*time.Millisecond || took > 8*time.Second {
		t.Fatalf("read with the target gone: EIO=%v after %v (replacement timeout 5 s): %s", eio, took, out)
	}
	took2, eio2, _ := timedRead(t, srv.URI)
	t.Logf("next read: EIO=%v after %v", eio2, took2.Round(time.Millisecond))
	if !eio2 || took2 > 2*time.Second {
		t.Fatalf("read after the replacement timeout: EIO=%v after %v, want EIO at once", eio2, took2)
	}

	if err := tg.Restart(); err != nil {
		t.Fatal(err)
	}
	restarted := time.Now()
	for {
		took, eio, _ := timedRead(t, srv.URI)
		if !eio {
			t.Logf("read succeeds %v after the restart (took %v), data intact", time.Since(restarted).Round(time.Millisecond), took.Round(time.Millisecond))
			break
		}
		if time.Since(restarted) > 20*time.Second {
			t.Fatal("reads still fail 20 s after the target came back")
		}
		time.Sleep(200 * time.Millisecond) // polling for the background reconnect
	}
	srv.Stop(t)
}

// TestGatewaySIGTERMFlushesDirtyCache (acceptance 6): 256 MiB written into the write-back cache,
// then SIGTERM: the process writes all of it to the target (checked on the backing file),
// reports the flush, logs out and exits 0.
func TestGatewaySIGTERMFlushesDirtyCache(t *testing.T) {
	const size = 256 << 20
	tg := tgtd.Start(t, tgtd.Options{Size: size})
	srv := startServe(t, tg, "--cache", "writeback", "--cache-size", "1GiB", "--cache-dirty", "100%",
		"--cache-write-around", "0") // nbdcopy's 256 KiB writes would go around the cache: nothing dirty to flush
	data := make([]byte, size)
	if _, err := rand.Read(data); err != nil {
		t.Fatal(err)
	}
	in := filepath.Join(t.TempDir(), "in.img")
	if err := os.WriteFile(in, data, 0o600); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	if out, err := exec.CommandContext(ctx, "nbdcopy", in, srv.URI).CombinedOutput(); err != nil {
		t.Fatalf("nbdcopy: %v %s", err, out)
	}
	start := time.Now()
	srv.Stop(t)
	t.Logf("SIGTERM to exit 0: %v", time.Since(start).Round(time.Millisecond))
	flushing := srv.LogLines("\tflushing dirty data to the target")
	progress := srv.LogLines("\tflush progress")
	for _, l := range append(flushing, progress...) {
		t.Logf("gateway: %s", l)
	}
	if len(flushing) != 1 {
		t.Fatalf("no 'flushing dirty data' line: the cache held nothing dirty at SIGTERM?")
	}
	if len(srv.LogLines("\tdevice flushed")) != 1 || len(srv.LogLines("logout complete")) == 0 {
		t.Fatalf("no 'device flushed' or no logout in the log")
	}
	f, err := os.Open(tg.BackingFile)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	got := make([]byte, size)
	if _, err := io.ReadFull(f, got); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, data) {
		for i := 0; i < size; i += 4096 {
			if !bytes.Equal(got[i:i+4096], data[i:i+4096]) {
				t.Fatalf("backing file differs from what was written, first at offset %d", i)
			}
		}
	}
}

// logFields decodes the JSON fields at the end of a console log line.
func logFields(t *testing.T, line string) map[string]any {
	t.Helper()
	i := strings.IndexByte(line, '{')
	var m map[string]any
	if i < 0 || json.Unmarshal([]byte(line[i:]), &m) != nil {
		t.Fatalf("cannot decode the fields of log line %q", line)
	}
	return m
}

// TestGatewayTwoPortalsFailover (acceptance 4): one tgtd in a network namespace listening on
// two addresses, each behind its own veth pair; the gateway gets both as --target. During fio
// (crc32c verify) the first link is cut silently and restored 4 s later: fio sees zero errors,
// the gateway logs the path down and restored, and the per-path counters it logs show traffic on
// both portals, and on the cut one again after it came back.
func TestGatewayTwoPortalsFailover(t *testing.T) {
	ns := netns.New(t)
	l1, l2 := ns.AddLink(t), ns.AddLink(t)
	tg := tgtd.Start(t, tgtd.Options{Size: 256 << 20, NetNS: ns.Name, Addr: l1.NSIP})
	p2 := l2.NSIP + ":3260"
	if err := tg.AddPortal(p2); err != nil {
		t.Fatal(err)
	}
	url2 := fmt.Sprintf("iscsi://%s/%s/%d", p2, tg.Name, tg.LUN)
	srv := startServe(t, tg, "--target", url2, "--cache", "off", "--noop-interval", "1s", "--noop-timeout", "1s",
		"--login-timeout", "2s")
	fioDone, fioOut := startFio(t, srv.URI)
	srv.WaitWritten(t, 8<<20, time.Minute) // fio is writing through the gateway
	if err := l1.Cut(); err != nil {
		t.Fatal(err)
	}
	cut := time.Now()
	<-time.After(4 * time.Second) // the outage
	if err := l1.Restore(); err != nil {
		t.Fatal(err)
	}
	checkFio(t, fioDone, fioOut)
	srv.Stop(t)

	down := srv.LogLines("\tpath down\t")
	restored := srv.LogLines("\tsession restored\t")
	if len(down) != 1 || len(restored) != 1 {
		t.Fatalf("want one path down and one session restored line, got %d and %d", len(down), len(restored))
	}
	t.Logf("gateway: %s", down[0])
	t.Logf("gateway: %s", restored[0])
	downAt, err := time.Parse("2006-01-02T15:04:05.000Z0700", strings.Fields(down[0])[0])
	if err != nil {
		t.Fatalf("log timestamp: %v", err)
	}
	detect := downAt.Sub(cut)
	t.Logf("failover: the cut path was declared down %v after the cut (keepalive 1 s + 1 s)", detect.Round(time.Millisecond))
	if detect > 5*time.Second {
		t.Fatalf("failover took %v", detect)
	}
	p1 := tg.Portal
	if f := logFields(t, down[0]); f["portal"] != p1 {
		t.Fatalf("the path that went down is %v, want %s", f["portal"], p1)
	}
	atRestore := logFields(t, restored[0])["path_commands"].(float64)
	final := map[string]float64{}
	for _, l := range srv.LogLines("\tpath stats\t") {
		t.Logf("gateway: %s", l)
		f := logFields(t, l)
		final[f["portal"].(string)] = f["commands"].(float64)
	}
	if final[p2] == 0 || final[p1] <= atRestore {
		t.Fatalf("per-path commands: %v; %s had %v when it came back: traffic did not return to it", final, p1, atRestore)
	}
	t.Logf("%s: %v commands (%v of them after it came back); %s: %v commands; fio 0 errors",
		p1, final[p1], final[p1]-atRestore, p2, final[p2])
}

// TestGatewayGarbageFromTheTarget (acceptance 5, through the gateway): `iser-blk serve` in front
// of an in-process fake target that answers one READ with a bad PDU. Each time the gateway drops
// the connection, logs in again, re-issues the read, and the client (qemu-io, verifying the
// pattern of every byte) gets the right data; the server keeps serving and exits 0.
func TestGatewayGarbageFromTheTarget(t *testing.T) {
	lun := scsitest.New(scsitest.Config{Blocks: 8192})
	tg, err := iscsitest.Start(lun, iscsitest.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { tg.Close() })
	srv := gateway.Start(t, tg.URL(0), "--cache", "off", "--command-timeout", "1s")
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if out, err := exec.CommandContext(ctx, "qemu-io", "-f", "raw", "-c", "write -P 0x5a 0 64k", srv.URI).CombinedOutput(); err != nil || strings.Contains(string(out), "failed") {
		t.Fatalf("qemu-io write: %v %s", err, out)
	}
	for _, f := range []iscsitest.Fault{iscsitest.FaultWrongITT, iscsitest.FaultDataBeyondBuffer, iscsitest.FaultWrongOpcode,
		iscsitest.FaultWrongDataSN, iscsitest.FaultHang} {
		logins := tg.Logins()
		tg.Inject(f)
		out, err := exec.CommandContext(ctx, "qemu-io", "-f", "raw", "-c", "read -P 0x5a 0 64k", srv.URI).CombinedOutput()
		if err != nil || strings.Contains(string(out), "failed") || strings.Contains(string(out), "Pattern verification") {
			t.Fatalf("read answered with %v: %v\n%s", f, err, out)
		}
		wantLogins := logins + 1
		if f == iscsitest.FaultHang {
			wantLogins = logins // ABORT TASK ends it; the connection stays
		}
		if tg.Logins() != wantLogins {
			t.Fatalf("%v: logins %d -> %d", f, logins, tg.Logins())
		}
		t.Logf("%v: read verified (64 KiB of 0x5a), logins %d -> %d", f, logins, tg.Logins())
	}
	if tg.BadPDUs() != 5 { // the hang counts as one fault
		t.Fatalf("%d faults injected, want 5", tg.BadPDUs())
	}
	srv.Stop(t)
	if n := len(srv.LogLines("\tiSCSI connection failed\t")); n != 4 {
		t.Fatalf("%d connection failures logged, want 4", n)
	}
	if strings.Contains(srv.Log(), "panic") {
		t.Fatal("the server log mentions a panic")
	}
}
