//go:build vm

package ublk

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/iser-blk/iser-blk/backend/iser"
	"github.com/iser-blk/iser-blk/backend/memdev"
	"github.com/iser-blk/iser-blk/block"
	"github.com/iser-blk/iser-blk/internal/syncbuf"
	"github.com/iser-blk/iser-blk/pool"
	"github.com/iser-blk/iser-blk/test/vm/vmtest"
)

// The process-level tests attach a memdev LUN and, where marked, the same workload against a LIO
// LUN over iSCSI/TCP in the guest (lioTarget). To move every test to LIO, make memTarget return
// lioTarget(t): that one line is the switch.
func memTarget(*testing.T) string { return "mem://256MiB" }

// lioISERTarget starts a LIO RAM LUN with an iSER portal on soft-RoCE and returns its iser:// URL.
func lioISERTarget(t *testing.T) string {
	t.Helper()
	lio := vmtest.StartLIO(t, vmtest.LIOOptions{SizeMiB: 256})
	if !lio.ISER {
		t.Fatal("LIO target has no iSER portal")
	}
	return fmt.Sprintf("iser://%s/%s/%d", lio.Portal, lio.IQN, lio.LUN)
}

// lioTarget starts a LIO fileio LUN in the guest (TCP portal) with thin provisioning enabled
// (UNMAP and WRITE SAME with UNMAP, so discard and fstrim have something to reach) and returns
// its iscsi:// URL.
func lioTarget(t *testing.T) string {
	t.Helper()
	lio := vmtest.StartLIO(t, vmtest.LIOOptions{File: true, SizeMiB: 256, NoISER: true})
	attrs, _ := filepath.Glob("/sys/kernel/config/target/core/fileio_*/*/attrib")
	if len(attrs) == 0 {
		t.Fatal("no LIO fileio backstore in configfs")
	}
	for _, a := range attrs {
		for _, name := range []string{"emulate_tpu", "emulate_tpws"} {
			if err := os.WriteFile(filepath.Join(a, name), []byte("1"), 0o644); err != nil {
				t.Fatalf("LIO %s/%s: %v", a, name, err)
			}
		}
	}
	return fmt.Sprintf("iscsi://%s/%s/%d", lio.Portal, lio.IQN, lio.LUN)
}

// serveEnv makes the test binary act as the server process (see TestMain) when the CLI's attach
// subcommand is not available.
const serveEnv = "ISERBLK_UBLK_TEST_SERVE"

func TestMain(m *testing.M) {
	if url := os.Getenv(serveEnv); url != "" {
		os.Exit(serveMain(url))
	}
	os.Exit(m.Run())
}

// serveMain is what `iser-blk attach --ublk --target URL` does: open the target (mem:// with
// memdev, iscsi:// with backend/iser), take the per-tag buffers from a pool.Pool, Run until
// SIGINT/SIGTERM, flush, close. It prints the device path on stdout.
func serveMain(url string) int {
	log, _ := zap.NewDevelopment(zap.AddStacktrace(zapcore.DPanicLevel))
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	var dev block.Device
	var err error
	if strings.HasPrefix(url, "mem://") {
		dev, err = memdev.ParseURL(url)
	} else {
		dev, err = iser.Open(ctx, url, iser.Options{InitiatorName: "iqn.2025-01.io.iser-blk:ublk-vm-test", Logger: log})
	}
	if err != nil {
		log.Error("open target", zap.Error(err))
		return 5
	}
	q, _ := strconv.Atoi(os.Getenv(serveEnv + "_QUEUES"))
	d, _ := strconv.Atoi(os.Getenv(serveEnv + "_DEPTH"))
	bufs, err := pool.New(pool.Config{MaxBytes: 256 << 20, MaxClass: 1 << 20})
	if err != nil {
		log.Error("pool", zap.Error(err))
		return 1
	}
	defer bufs.Close()
	err = Run(ctx, dev, Options{Queues: q, Depth: d, Pool: bufs, Logger: log}, func(p string) { fmt.Println(p) })
	// Run detached the disk without flushing: the final flush is the caller's, as in the CLI.
	if ferr := dev.Flush(context.Background()); err == nil && ferr != nil {
		err = fmt.Errorf("final flush: %w", ferr)
	}
	if cerr := dev.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		log.Error("serve", zap.Error(err))
		if errors.Is(err, ErrNoKernel) {
			return 6
		}
		return 1
	}
	return 0
}

type serverProc struct {
	cmd    *exec.Cmd
	path   string // /dev/ublkbN
	id     uint32
	stderr *syncbuf.Buffer
	exited chan struct{}
	err    error // Wait's result, valid after exited
}

// cliAttach reports whether $ISERBLK_BIN has `attach --ublk`.
func cliAttach() string {
	bin := os.Getenv("ISERBLK_BIN")
	if bin == "" {
		return ""
	}
	out, _ := exec.Command(bin, "attach", "--help").CombinedOutput()
	if bytes.Contains(out, []byte("-ublk")) {
		return bin
	}
	return ""
}

// startServer starts the server process and waits for it to print the device path. cliArgs are
// extra `attach` flags, for tests that need the CLI (the test-binary server ignores them).
func startServer(t *testing.T, targetURL string, queues, depth int, cliArgs ...string) *serverProc {
	t.Helper()
	requireUblk(t)
	var cmd *exec.Cmd
	if bin := cliAttach(); bin != "" {
		cmd = exec.Command(bin, append([]string{"attach", "--ublk", "--target", targetURL,
			"--queues", strconv.Itoa(queues), "--depth", strconv.Itoa(depth)}, cliArgs...)...)
		t.Logf("server: %s", strings.Join(cmd.Args, " "))
	} else {
		cmd = exec.Command(os.Args[0], "-test.run=^$")
		cmd.Env = append(os.Environ(), serveEnv+"="+targetURL,
			fmt.Sprintf("%s_QUEUES=%d", serveEnv, queues), fmt.Sprintf("%s_DEPTH=%d", serveEnv, depth))
		t.Logf("server: test binary serving %s (no CLI attach --ublk in $ISERBLK_BIN)", targetURL)
	}
	g := vmtest.StartGateway(t, cmd, vmtest.GatewayOptions{Announce: 90 * time.Second, LogStderr: true})
	p := &serverProc{cmd: cmd, path: g.Device, stderr: g.Stderr, exited: make(chan struct{})}
	go func() { <-g.Exited; p.err = g.Err; close(p.exited) }()
	t.Cleanup(func() {
		g.Stop() // before StartGateway's cleanup: the device is deleted only once its server is gone
		p.deleteLeftover(t)
	})
	n, err := strconv.ParseUint(strings.TrimPrefix(p.path, "/dev/ublkb"), 10, 32)
	if !strings.HasPrefix(p.path, "/dev/ublkb") || err != nil {
		t.Fatalf("server printed %q, want /dev/ublkbN", p.path)
	}
	p.id = uint32(n)
	t.Logf("server created %s", p.path)
	return p
}

// deleteLeftover removes the device of a server that did not shut down cleanly (killed), so
// later tests start from a clean driver.
func (p *serverProc) deleteLeftover(t *testing.T) {
	if p.path == "" {
		return
	}
	if _, err := os.Stat(fmt.Sprintf("/dev/ublkc%d", p.id)); err != nil {
		return
	}
	c, err := OpenControl("")
	if err != nil {
		t.Errorf("cleanup: %v", err)
		return
	}
	defer c.Close()
	_ = c.StopDev(p.id)
	if err := c.DelDev(p.id); err != nil {
		t.Errorf("cleanup: DEL_DEV %d: %v", p.id, err)
	}
}

// terminate sends SIGTERM and requires a clean exit (status 0) and the disk gone.
func (p *serverProc) terminate(t *testing.T, within time.Duration) time.Duration {
	t.Helper()
	t0 := time.Now()
	p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.exited:
	case <-time.After(within):
		t.Fatalf("server still running %v after SIGTERM", within)
	}
	if p.err != nil {
		t.Fatalf("server exit after SIGTERM: %v", p.err)
	}
	if _, err := os.Stat(p.path); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("%s still exists after the server exited (%v)", p.path, err)
	}
	if _, err := os.Stat(fmt.Sprintf("/dev/ublkc%d", p.id)); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("/dev/ublkc%d still exists: the device was not deleted (%v)", p.id, err)
	}
	return time.Since(t0)
}

func run(t *testing.T, name string, args ...string) string {
	t.Helper()
	out, err := exec.Command(name, args...).CombinedOutput()
	if err != nil {
		t.Fatalf("%s %s: %v\n%s", name, strings.Join(args, " "), err, out)
	}
	return string(out)
}

// watchdog dumps what the guest is waiting on if a test step stalls for d: blocked tasks and
// their kernel stacks, the disk's in-flight counters, the kernel log, and the server's goroutines
// (SIGQUIT makes the Go runtime print them to its stderr, which the cleanup logs).
func watchdog(t *testing.T, p *serverProc, d time.Duration) func() {
	timer := time.AfterFunc(d, func() {
		var b strings.Builder
		fmt.Fprintf(&b, "=== watchdog: %s stalled for %v\n", t.Name(), d)
		sh := func(cmd string) {
			out, _ := exec.Command("sh", "-c", cmd).CombinedOutput()
			fmt.Fprintf(&b, "$ %s\n%s\n", cmd, out)
		}
		sh("cat /sys/block/ublkb*/inflight /sys/block/ublkb*/stat")
		sh("for p in $(ps -eo pid=,stat= | awk '$2 ~ /D/ {print $1}'); do echo \"== $p $(cat /proc/$p/comm)\"; cat /proc/$p/stack; done")
		sh("dmesg | tail -60")
		fmt.Fprint(os.Stderr, b.String())
		if p != nil {
			p.cmd.Process.Signal(syscall.SIGQUIT)
			<-p.exited
			fmt.Fprintf(os.Stderr, "=== server stderr after SIGQUIT:\n%s\n", p.stderr.String())
		}
	})
	return func() { timer.Stop() }
}

// TestVMExt4 is acceptance 1: a filesystem on the ublk disk survives umount, fsck and remount
// with every file intact; fstrim works; the kernel sees a write-back cache.
func TestVMExt4(t *testing.T) {
	t.Run("memdev", func(t *testing.T) { testExt4(t, memTarget(t)) })
	t.Run("lio-tcp", func(t *testing.T) { testExt4(t, lioTarget(t)) })
	t.Run("lio-iser", func(t *testing.T) { testExt4(t, lioISERTarget(t)) })
}

func testExt4(t *testing.T, target string) {
	p := startServer(t, target, 2, 64)
	defer watchdog(t, p, 8*time.Minute)()
	base := filepath.Base(p.path)
	wc, err := os.ReadFile("/sys/block/" + base + "/queue/write_cache")
	if err != nil || strings.TrimSpace(string(wc)) != "write back" {
		t.Fatalf("write_cache = %q (%v), want \"write back\"", wc, err)
	}
	run(t, "mkfs.ext4", "-q", "-F", p.path)
	mnt := t.TempDir()
	run(t, "mount", p.path, mnt)
	mounted := true
	defer func() {
		if mounted {
			exec.Command("umount", mnt).Run()
		}
	}()
	const files = 2000
	sums := make(map[string][32]byte, files)
	for i := 0; i < files; i++ {
		size := 512 + int(randUint32()%(32<<10))
		data := make([]byte, size)
		rand.Read(data)
		name := filepath.Join(fmt.Sprintf("d%02d", i%20), fmt.Sprintf("f%04d", i))
		os.MkdirAll(filepath.Join(mnt, filepath.Dir(name)), 0o755)
		if err := os.WriteFile(filepath.Join(mnt, name), data, 0o644); err != nil {
			t.Fatal(err)
		}
		sums[name] = sha256.Sum256(data)
	}
	run(t, "sync")
	run(t, "umount", mnt)
	mounted = false
	t.Logf("fsck: %s", strings.TrimSpace(run(t, "fsck.ext4", "-fn", p.path)))
	run(t, "mount", p.path, mnt)
	mounted = true
	for name, want := range sums {
		data, err := os.ReadFile(filepath.Join(mnt, name))
		if err != nil {
			t.Fatal(err)
		}
		if sha256.Sum256(data) != want {
			t.Fatalf("%s: checksum differs after remount", name)
		}
	}
	t.Logf("all %d files match after umount/fsck/remount", files)
	if dm, _ := os.ReadFile("/sys/block/" + base + "/queue/discard_max_bytes"); strings.TrimSpace(string(dm)) == "0" {
		// A LUN without UNMAP (LIO rd): the disk must say so, and fstrim must refuse.
		if out, err := exec.Command("fstrim", mnt).CombinedOutput(); err == nil {
			t.Fatalf("fstrim succeeded on a disk without discard: %s", out)
		}
		t.Logf("LUN without UNMAP: no discard advertised, fstrim refused")
	} else {
		t.Logf("fstrim: %s", strings.TrimSpace(run(t, "fstrim", "-v", mnt)))
	}
	run(t, "umount", mnt)
	mounted = false
	took := p.terminate(t, 60*time.Second)
	t.Logf("SIGTERM to exit: %v", took)
}

func randUint32() uint32 {
	var b [4]byte
	rand.Read(b[:])
	return uint32(b[0]) | uint32(b[1])<<8 | uint32(b[2])<<16 | uint32(b[3])<<24
}

type fioResult struct {
	Jobs []struct {
		Name  string `json:"jobname"`
		Error int    `json:"error"`
		Read  struct {
			IOPS     float64 `json:"iops"`
			TotalIOs int64   `json:"total_ios"`
		} `json:"read"`
		Write struct {
			IOPS     float64 `json:"iops"`
			TotalIOs int64   `json:"total_ios"`
		} `json:"write"`
	} `json:"jobs"`
}

func fio(t *testing.T, args ...string) fioResult {
	t.Helper()
	args = append(args, "--output-format=json")
	out, err := exec.Command("fio", args...).Output()
	if err != nil {
		t.Fatalf("fio %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	var r fioResult
	if i := bytes.IndexByte(out, '{'); i > 0 {
		out = out[i:]
	}
	if err := json.Unmarshal(out, &r); err != nil {
		t.Fatalf("fio json: %v\n%s", err, out)
	}
	for _, j := range r.Jobs {
		if j.Error != 0 {
			t.Fatalf("fio job %s: error %d", j.Name, j.Error)
		}
	}
	return r
}

// TestVMFioVerify is acceptance 2: random writes then random reads, crc32c-verified, on
// 2 queues × depth 64, with zero errors.
//
// It runs on both of the queue's paths (issue 37): by default reads and writes are served from the
// ring thread (cache hits there, the rest started on the iSCSI or iSER session from there), with
// --ublk-workers-only every request goes through a worker. Each queue logs how many requests
// each path served when it ends; the test requires the path it asked for to have served them.
func TestVMFioVerify(t *testing.T) {
	t.Run("memdev", func(t *testing.T) { testFioVerify(t, memTarget(t), true) })
	t.Run("lio-tcp", func(t *testing.T) { testFioVerify(t, lioTarget(t), true) })
	t.Run("lio-tcp-cache-off", func(t *testing.T) { testFioVerify(t, lioTarget(t), true, "--cache", "off") })
	t.Run("lio-tcp-workers-only", func(t *testing.T) { testFioVerify(t, lioTarget(t), false, "--ublk-workers-only") })
	// over iSER the session starts reads and writes of any size from registered memory too
	t.Run("lio-iser-cache-off", func(t *testing.T) { testFioVerify(t, lioISERTarget(t), true, "--cache", "off") })
}

// ringTally sums the "ublk queue ended" lines of a server's log: requests served on the ring
// thread and by workers.
func ringTally(t *testing.T, log string) (ring, workers int) {
	t.Helper()
	re := regexp.MustCompile(`ublk queue ended.*"served_on_ring": ?(\d+), ?"served_by_workers": ?(\d+)`)
	lines := re.FindAllStringSubmatch(log, -1)
	if len(lines) == 0 {
		t.Fatalf("no \"ublk queue ended\" line in the server's log:\n%s", log)
	}
	for _, m := range lines {
		r, _ := strconv.Atoi(m[1])
		w, _ := strconv.Atoi(m[2])
		ring, workers = ring+r, workers+w
	}
	return ring, workers
}

func testFioVerify(t *testing.T, target string, ringPath bool, cliArgs ...string) {
	if len(cliArgs) > 0 && cliAttach() == "" {
		t.Skip("needs the CLI ($ISERBLK_BIN): the test binary's own server takes no flags")
	}
	p := startServer(t, target, 2, 64, cliArgs...)
	defer watchdog(t, p, 8*time.Minute)()
	common := []string{"--filename=" + p.path, "--ioengine=libaio", "--direct=1", "--bs=4k",
		"--iodepth=64", "--numjobs=2", "--size=32M", "--offset_increment=32M",
		"--verify=crc32c", "--randseed=1234", "--group_reporting=0"}
	w := fio(t, append([]string{"--name=randwrite", "--rw=randwrite", "--do_verify=1"}, common...)...)
	for _, j := range w.Jobs {
		t.Logf("randwrite job %s: %.0f write IOPS, %d writes, %d verify reads", j.Name, j.Write.IOPS, j.Write.TotalIOs, j.Read.TotalIOs)
		if j.Write.TotalIOs != 8192 || j.Read.TotalIOs != 8192 {
			t.Fatalf("job %s: %d writes / %d verified reads, want 8192 each", j.Name, j.Write.TotalIOs, j.Read.TotalIOs)
		}
	}
	// A fresh fio process reads everything back in random order and verifies it again.
	r := fio(t, append([]string{"--name=randread", "--rw=randwrite", "--verify_only"}, common...)...)
	for _, j := range r.Jobs {
		t.Logf("verify-only job %s: %d reads verified", j.Name, j.Read.TotalIOs)
		if j.Read.TotalIOs != 8192 {
			t.Fatalf("job %s verified %d blocks, want 8192", j.Name, j.Read.TotalIOs)
		}
	}
	rr := fio(t, "--name=randread-perf", "--filename="+p.path, "--ioengine=libaio", "--direct=1",
		"--bs=4k", "--iodepth=64", "--numjobs=2", "--size=64M", "--rw=randread", "--runtime=2", "--time_based")
	for _, j := range rr.Jobs {
		t.Logf("randread job %s: %.0f IOPS", j.Name, j.Read.IOPS)
	}
	p.terminate(t, 60*time.Second)
	if cliAttach() == "" {
		return // the test binary's own server logs nothing
	}
	ring, workers := ringTally(t, p.stderr.String())
	t.Logf("requests served on the ring thread: %d, by workers: %d", ring, workers)
	// fio issued 2 × 8192 writes, 2 × 8192 + 2 × 8192 verifying reads and 2 s of reads; a
	// quarter of them is the least the ring thread must have served.
	if ringPath && ring < 12288 {
		t.Fatalf("only %d requests served on the ring thread (workers: %d): the ring path was not taken", ring, workers)
	}
	if !ringPath && ring != 0 {
		t.Fatalf("--ublk-workers-only: %d requests served on the ring thread", ring)
	}
}

// diskStat returns (reads completed, writes completed) of a block device.
func diskStat(name string) (int64, int64, error) {
	b, err := os.ReadFile("/sys/block/" + name + "/stat")
	if err != nil {
		return 0, 0, err
	}
	f := strings.Fields(string(b))
	if len(f) < 5 {
		return 0, 0, fmt.Errorf("short stat %q", b)
	}
	r, _ := strconv.ParseInt(f[0], 10, 64)
	w, _ := strconv.ParseInt(f[4], 10, 64)
	return r, w, nil
}

// waitWrites blocks until the disk has completed at least n writes (fio is really running).
func waitWrites(t *testing.T, name string, n int64) {
	t.Helper()
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	deadline := time.After(60 * time.Second)
	for {
		_, w, err := diskStat(name)
		if err != nil {
			t.Fatal(err)
		}
		if w >= n {
			return
		}
		select {
		case <-tick.C:
		case <-deadline:
			t.Fatalf("%s completed only %d writes in 60 s", name, w)
		}
	}
}

func startFio(t *testing.T, path string) (*exec.Cmd, chan error, *syncbuf.Buffer) {
	t.Helper()
	out := &syncbuf.Buffer{}
	cmd := exec.Command("fio", "--name=load", "--filename="+path, "--ioengine=libaio", "--direct=1",
		"--bs=4k", "--iodepth=64", "--numjobs=2", "--rw=randrw", "--size=64M", "--time_based", "--runtime=120")
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	t.Cleanup(func() {
		cmd.Process.Kill()
	})
	return cmd, done, out
}

// TestVMSigtermUnderLoad is acceptance 4a: SIGTERM while fio runs drains, flushes, stops and
// deletes the device; fio ends (its in-flight I/O completes or fails) and nothing hangs.
func TestVMSigtermUnderLoad(t *testing.T) {
	p := startServer(t, memTarget(t), 2, 64)
	_, fioDone, fioOut := startFio(t, p.path)
	waitWrites(t, filepath.Base(p.path), 2000)
	took := p.terminate(t, 60*time.Second)
	t.Logf("server exited 0 %v after SIGTERM under load; disk and char device gone", took)
	select {
	case err := <-fioDone:
		t.Logf("fio ended after the device went away: %v\n%s", err, lastLines(fioOut.String(), 6))
	case <-time.After(30 * time.Second):
		t.Fatal("fio still running 30 s after the device was removed")
	}
}

// TestVMKill9 is acceptance 4b: after kill -9 of the server the kernel fails I/O (it does not
// hang) within a bounded time; the test then deletes the leftover device.
func TestVMKill9(t *testing.T) {
	p := startServer(t, memTarget(t), 2, 64)
	_, fioDone, fioOut := startFio(t, p.path)
	base := filepath.Base(p.path)
	waitWrites(t, base, 2000)
	// Requests the dead server had taken are failed by the driver's timeout handler (ublk_timeout:
	// "cancelable uring_cmd can't help us if all commands are in-flight"), so the bound is the
	// queue's request timeout plus slack for the emulated guest.
	toText, err := os.ReadFile("/sys/block/" + base + "/queue/io_timeout")
	if err != nil {
		t.Fatal(err)
	}
	ms, err := strconv.Atoi(strings.TrimSpace(string(toText)))
	if err != nil {
		t.Fatal(err)
	}
	bound := time.Duration(ms)*time.Millisecond + 30*time.Second
	t.Logf("request timeout %d ms; I/O must fail within %v of kill -9", ms, bound)
	t0 := time.Now()
	p.cmd.Process.Kill()
	<-p.exited
	select {
	case err := <-fioDone:
		t.Logf("fio ended %v after kill -9: %v\n%s", time.Since(t0), err, lastLines(fioOut.String(), 6))
	case <-time.After(bound):
		t.Fatalf("fio still running %v after the server was killed: I/O hangs", bound)
	}
	// New I/O must fail promptly too (or the disk must be gone).
	ioErr := make(chan error, 1)
	go func() {
		f, err := os.OpenFile(p.path, os.O_RDWR|syscall.O_DIRECT, 0)
		if err != nil {
			ioErr <- err
			return
		}
		defer f.Close()
		buf := alignedBuf(4096)
		_, err = f.ReadAt(buf, 0)
		ioErr <- err
	}()
	select {
	case err := <-ioErr:
		if err == nil {
			t.Fatal("a read succeeded on the disk of a killed server")
		}
		t.Logf("I/O %v after kill -9: %v", time.Since(t0), err)
	case <-time.After(bound):
		t.Fatalf("a read hangs %v after kill -9", bound)
	}
	_, statErr := os.Stat(p.path)
	t.Logf("after kill -9: %s exists: %v", p.path, statErr == nil)

	// Clean up what the dead server left: the control-side device.
	c, err := OpenControl("")
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	info, err := c.DevInfo(p.id)
	if err != nil {
		t.Fatalf("GET_DEV_INFO of the dead server's device: %v", err)
	}
	t.Logf("dead server's device: state %s, pid %d", info.StateName(), info.UblksrvPID)
	_ = c.StopDev(p.id)
	done := make(chan error, 1)
	go func() { done <- c.DelDev(p.id) }()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("DEL_DEV: %v", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("DEL_DEV of the dead server's device hangs")
	}
	if _, err := os.Stat(fmt.Sprintf("/dev/ublkc%d", p.id)); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("/dev/ublkc%d still exists after DEL_DEV", p.id)
	}
	if _, err := os.Stat(p.path); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("%s still exists after DEL_DEV", p.path)
	}
	t.Logf("cleanup done %v after kill -9", time.Since(t0))
}

func lastLines(s string, n int) string {
	l := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(l) > n {
		l = l[len(l)-n:]
	}
	return strings.Join(l, "\n")
}
