//go:build vm

// Package cachedev holds the VM-tier acceptance of issue #39, the persistent write-back log
// (--cache-dev): a gateway under ext4 and fio verify, killed with -9 again and again, resumes the
// same kernel device (ublk user recovery, NBD reconfigure) without a fence, recovers the log and
// loses nothing: fio verifies every block, the kernel logs no I/O error, fsck finds ext4 clean,
// and after a detach the target alone (--cache off) holds the same bytes. A successor without the
// cache device is refused (exit 7), naming it.
package cachedev

import (
	"bytes"
	"crypto/rand"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/iser-blk/iser-blk/internal/syncbuf"
	"github.com/iser-blk/iser-blk/test/vm/vmtest"
)

const (
	lunMiB   = 128
	fioSize  = 16 << 20 // 4096 writes; the kills land by the device's 2,900th write (testKill9Loop)
	fioOps   = fioSize / 4096
	kills    = 3
	cacheDev = "128MiB" // the guest has 1 GiB of RAM, and the LIO LUN is on tmpfs too
)

// frontend is what differs between ublk and NBD: the attach flags and the log line of a
// successor that took the kernel device over.
type frontend struct {
	name    string
	module  string
	args    []string
	resumed string
}

var frontends = []frontend{
	{"ublk", "ublk", []string{"--ublk", "--queues", "2", "--depth", "64"}, "ublk device recovered"},
	{"nbd", "nbd", []string{"--nbd", "/dev/nbd6", "--connections", "2"}, "nbd device reattached"},
}

func bin(t *testing.T) string {
	t.Helper()
	vmtest.Require(t)
	b := os.Getenv("ISERBLK_BIN")
	if b == "" {
		t.Fatal("ISERBLK_BIN is not set (make vm-go-test builds the CLI)")
	}
	return b
}

// setup starts a LIO fileio LUN (its data outlives any gateway) and returns the attach arguments
// of a named gateway with a cache device, and its run directory.
func setup(t *testing.T, fe frontend, name string) (args []string, runDir, cachePath string) {
	t.Helper()
	vmtest.LoadModules(t, fe.module)
	lio := vmtest.StartLIO(t, vmtest.LIOOptions{File: true, SizeMiB: lunMiB, NoISER: true})
	runDir = t.TempDir()
	cachePath = filepath.Join(t.TempDir(), name+".cache")
	args = append([]string{"--target", lio.URL("iscsi")}, fe.args...)
	args = append(args, "--name", name, "--run-dir", runDir, "--cache", "writeback",
		"--cache-size", "64MiB", "--cache-dev", cachePath, "--cache-dev-size", cacheDev)
	return args, runDir, cachePath
}

func start(t *testing.T, args ...string) *vmtest.Gateway {
	t.Helper()
	return vmtest.StartGateway(t, exec.Command(bin(t), append([]string{"attach"}, args...)...),
		vmtest.GatewayOptions{Announce: 2 * time.Minute})
}

// TestVMCacheDevKill9Loop is issue #39's acceptance: kill -9 loops under fio verify on mounted
// ext4: 0 errors, no fence, fsck clean, and the log written back at detach.
func TestVMCacheDevKill9Loop(t *testing.T) {
	for _, fe := range frontends {
		t.Run(fe.name, func(t *testing.T) { testKill9Loop(t, fe) })
	}
}

func testKill9Loop(t *testing.T, fe frontend) {
	t0 := time.Now()
	b := bin(t)
	name := "gw-cd-" + fe.name
	args, runDir, _ := setup(t, fe, name)
	g := start(t, args...)
	dev := g.Device
	run(t, "dmesg", "-C")
	run(t, "mkfs.ext4", "-q", "-F", dev)
	mnt := t.TempDir()
	run(t, "mount", dev, mnt)
	defer exec.Command("umount", "-l", mnt).Run()
	fioDone, fioOut := startFioVerify(t, filepath.Join(mnt, "verify.dat"))
	base := filepath.Base(dev)
	recoveredTotal := 0
	// Kill i comes at the device's (i+1)×900th write since fio started, plus up to 199: counted
	// from one start, so the writes made while a successor resumes count too, and the last kill
	// comes by the 2,899th, leaving fio at least 1,197 of its 4,096 to write through the last
	// successor (ext4's own writes only bring the kills earlier).
	firstWrite := vmtest.DiskWrites(t, base)
	for i := range kills {
		vmtest.WaitWrites(t, base, vmtest.KillAt(firstWrite, i), fioDone)
		g.Stop() // SIGKILL
		tk := time.Now()
		next := start(t, args...)
		if next.Device != dev {
			t.Fatalf("kill %d: the successor serves %s, want the same %s", i+1, next.Device, dev)
		}
		waitLog(t, next, fe.resumed, time.Minute)
		n := recoveredBatches(t, next)
		recoveredTotal += n
		t.Logf("kill %d: %s resumed %v after kill -9; cache device: %d batches recovered", i+1, dev, time.Since(tk), n)
		if strings.Contains(next.Stderr.String(), "NOT resuming") {
			t.Fatalf("kill %d: the successor fenced the device:\n%s", i+1, next.Stderr)
		}
		checkStatus(t, b, name, runDir)
		g = next
	}
	if recoveredTotal == 0 {
		t.Fatalf("no successor recovered a batch from the cache device in %d kills: the test did not exercise the log", kills)
	}
	select {
	case err := <-fioDone:
		checkFioVerify(t, err, fioOut)
	case <-time.After(6 * time.Minute):
		t.Fatal("fio still running 6 min after the last kill")
	}
	checkStatus(t, b, name, runDir)
	checkKernelLog(t, base)
	run(t, "umount", mnt)
	run(t, "fsck.ext4", "-fn", dev)
	sum := deviceSum(t, dev)
	if out, err := exec.Command(b, "detach", name, "--run-dir", runDir).CombinedOutput(); err != nil {
		t.Fatalf("detach: %v\n%s", err, out)
	}
	select {
	case <-g.Exited:
		if g.Err != nil {
			t.Fatalf("gateway after detach: %v", g.Err)
		}
	case <-time.After(2 * time.Minute):
		t.Fatal("gateway still running 2 min after detach")
	}
	if !strings.Contains(g.Stderr.String(), "cache device") {
		t.Fatalf("the last gateway's log does not mention its cache device:\n%s", g.Stderr)
	}
	// The target alone: what the detach wrote back must be the whole device as served.
	plain := []string{args[0], args[1]}
	plain = append(plain, fe.args...)
	plain = append(plain, "--cache", "off")
	p := start(t, plain...)
	if got := deviceSum(t, p.Device); got != sum {
		t.Fatalf("the LUN read through --cache off differs from what the cache-dev gateway served before detach (%x vs %x)", got, sum)
	}
	run(t, "fsck.ext4", "-fn", p.Device)
	p.Detach(t, "detach of the --cache off gateway")
	t.Logf("%s: %d kills, fio %d writes verified, %d batches recovered in all, the target alone matches, %v",
		fe.name, kills, fioOps, recoveredTotal, time.Since(t0).Round(time.Second))
}

// TestVMCacheDevSuccessorWithoutCacheDev: after a kill -9 the device's data is partly in the
// log only, so a successor without --cache-dev must not take the device over: exit 7, naming the
// cache device; the same command with it then resumes the device without a fence.
func TestVMCacheDevSuccessorWithoutCacheDev(t *testing.T) {
	for _, fe := range frontends {
		t.Run(fe.name, func(t *testing.T) {
			b := bin(t)
			name := "gw-cdr-" + fe.name
			if fe.name == "nbd" {
				fe.args = []string{"--nbd", "/dev/nbd7", "--connections", "2"} // not the loop's device
			}
			args, runDir, cachePath := setup(t, fe, name)
			g := start(t, args...)
			run(t, "dd", "if=/dev/urandom", "of="+g.Device, "bs=64k", "count=64", "oflag=direct", "conv=fsync", "status=none")
			want := deviceSum(t, g.Device)
			g.Stop() // SIGKILL
			var without []string
			for i := 0; i < len(args); i++ {
				if args[i] == "--cache-dev" || args[i] == "--cache-dev-size" {
					i++
					continue
				}
				without = append(without, args[i])
			}
			cmd := exec.Command(b, append([]string{"attach"}, without...)...)
			var out syncbuf.Buffer
			cmd.Stdout, cmd.Stderr = &out, &out
			done := make(chan error, 1)
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			go func() { done <- cmd.Wait() }()
			var err error
			select {
			case err = <-done:
			case <-time.After(2 * time.Minute):
				cmd.Process.Kill()
				t.Fatalf("attach without --cache-dev still running after 2 min:\n%s", out.String())
			}
			var ee *exec.ExitError
			if !errors.As(err, &ee) || ee.ExitCode() != 7 {
				t.Fatalf("attach without --cache-dev: %v, want exit 7:\n%s", err, out.String())
			}
			if !strings.Contains(out.String(), cachePath) {
				t.Fatalf("the refusal does not name the cache device %s:\n%s", cachePath, out.String())
			}
			t.Logf("refused, exit 7: %s", lastLine(out.String(), cachePath))
			next := start(t, args...)
			if next.Device != g.Device {
				t.Fatalf("the successor serves %s, want %s", next.Device, g.Device)
			}
			waitLog(t, next, fe.resumed, time.Minute)
			checkStatus(t, b, name, runDir)
			if got := deviceSum(t, next.Device); got != want {
				t.Fatal("the data written and fsynced before the kill does not read back after the refused successor")
			}
			if out, err := exec.Command(b, "detach", name, "--run-dir", runDir).CombinedOutput(); err != nil {
				t.Fatalf("detach: %v\n%s", err, out)
			}
			<-next.Exited
			if next.Err != nil {
				t.Fatalf("gateway after detach: %v", next.Err)
			}
		})
	}
}

func run(t *testing.T, name string, args ...string) string {
	t.Helper()
	out, err := exec.Command(name, args...).CombinedOutput()
	if err != nil {
		t.Fatalf("%s %s: %v\n%s", name, strings.Join(args, " "), err, out)
	}
	return string(out)
}

// checkStatus requires the gateway to serve (status --check, polled while it still recovers),
// in state ready and not fenced.
func checkStatus(t *testing.T, b, name, runDir string) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for {
		out, err := exec.Command(b, "status", name, "--run-dir", runDir, "--check").CombinedOutput()
		if err == nil {
			break
		}
		if bytes.Contains(out, []byte("fenced")) || time.Now().After(deadline) {
			t.Fatalf("status --check %s: %v\n%s", name, err, out)
		}
		time.Sleep(100 * time.Millisecond) // polling the state (recovering -> ready), not synchronising
	}
	out, err := exec.Command(b, "status", name, "--run-dir", runDir, "--json").Output()
	if err != nil {
		t.Fatalf("status --json %s: %v", name, err)
	}
	var st struct {
		Gateway struct {
			State  string `json:"state"`
			Fenced bool   `json:"fenced"`
		} `json:"gateway"`
	}
	if err := json.Unmarshal(out, &st); err != nil {
		t.Fatalf("status --json: %v\n%s", err, out)
	}
	if st.Gateway.State != "ready" || st.Gateway.Fenced {
		t.Fatalf("status %s: state %q, fenced %v; want ready, not fenced\n%s", name, st.Gateway.State, st.Gateway.Fenced, out)
	}
}

func checkKernelLog(t *testing.T, base string) {
	t.Helper()
	out, _ := exec.Command("dmesg").CombinedOutput()
	for _, l := range strings.Split(string(out), "\n") {
		if strings.Contains(l, base) && (strings.Contains(strings.ToLower(l), "error") || strings.Contains(l, "EXT4-fs")) &&
			!strings.Contains(l, "mounted filesystem") && !strings.Contains(l, "unmounting") {
			t.Fatalf("kernel log for %s:\n%s", base, out)
		}
	}
}

var batchesRe = regexp.MustCompile(`"batches recovered"\s*[:=]\s*(\d+)`)

// recoveredBatches is the "batches recovered" of the gateway's "cache device ready" line.
func recoveredBatches(t *testing.T, g *vmtest.Gateway) int {
	t.Helper()
	waitLog(t, g, "cache device ready", time.Minute)
	for _, l := range strings.Split(g.Stderr.String(), "\n") {
		if strings.Contains(l, "cache device ready") {
			m := batchesRe.FindStringSubmatch(l)
			if m == nil {
				t.Fatalf("no batch count in %q", l)
			}
			n, _ := strconv.Atoi(m[1])
			return n
		}
	}
	return 0
}

func waitLog(t *testing.T, g *vmtest.Gateway, msg string, within time.Duration) {
	t.Helper()
	deadline := time.Now().Add(within)
	for !strings.Contains(g.Stderr.String(), msg) {
		select {
		case <-g.Exited:
			t.Fatalf("gateway exited (%v) before logging %q:\n%s", g.Err, msg, g.Stderr)
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("%q not in the gateway's log within %v:\n%s", msg, within, g.Stderr)
		}
		time.Sleep(50 * time.Millisecond) // polling the log, not synchronising
	}
}

// startFioVerify writes a file with 4 KiB random direct writes at QD16 and then verifies every
// block (crc32c).
func startFioVerify(t *testing.T, file string) (chan error, *syncbuf.Buffer) {
	t.Helper()
	out := &syncbuf.Buffer{}
	cmd := exec.Command("fio", "--name=verify", "--filename="+file, "--size="+strconv.Itoa(fioSize),
		"--rw=randwrite", "--bs=4k", "--ioengine=libaio", "--direct=1", "--iodepth=16",
		"--verify=crc32c", "--do_verify=1", "--verify_fatal=1", "--output-format=json")
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	t.Cleanup(func() { cmd.Process.Kill() })
	return done, out
}

type fioResult struct {
	Jobs []struct {
		Name  string `json:"jobname"`
		Error int    `json:"error"`
		Read  struct {
			TotalIOs int64 `json:"total_ios"`
			IOBytes  int64 `json:"io_bytes"`
		} `json:"read"`
		Write struct {
			TotalIOs int64 `json:"total_ios"`
			IOBytes  int64 `json:"io_bytes"`
		} `json:"write"`
	} `json:"jobs"`
}

func checkFioVerify(t *testing.T, err error, out *syncbuf.Buffer) {
	t.Helper()
	if err != nil {
		t.Fatalf("fio: %v\n%s", err, out.String())
	}
	b := []byte(out.String())
	if i := bytes.IndexByte(b, '{'); i > 0 {
		b = b[i:]
	}
	var r fioResult
	if err := json.Unmarshal(b, &r); err != nil {
		t.Fatalf("fio json: %v\n%s", err, b)
	}
	if len(r.Jobs) == 0 {
		t.Fatalf("fio reported no job:\n%s", b)
	}
	for _, j := range r.Jobs {
		if j.Error != 0 || j.Write.TotalIOs != fioOps || j.Read.TotalIOs != fioOps {
			t.Fatalf("fio job %s: error %d, %d writes, %d verified reads (want 0, %d, %d)",
				j.Name, j.Error, j.Write.TotalIOs, j.Read.TotalIOs, fioOps, fioOps)
		}
		t.Logf("fio: %d writes (%d bytes), %d verified reads (%d bytes), 0 errors",
			j.Write.TotalIOs, j.Write.IOBytes, j.Read.TotalIOs, j.Read.IOBytes)
	}
}

// deviceSum is the SHA-256 of the whole device, read with O_DIRECT (not the page cache).
func deviceSum(t *testing.T, dev string) [32]byte {
	t.Helper()
	out, err := exec.Command("dd", "if="+dev, "bs=1M", "iflag=direct", "status=none").Output()
	if err != nil {
		t.Fatalf("read %s: %v", dev, err)
	}
	if len(out) != lunMiB<<20 {
		t.Fatalf("read %d bytes of %s, want %d", len(out), dev, lunMiB<<20)
	}
	return sha256.Sum256(out)
}

func lastLine(s, sub string) string {
	last := ""
	for _, l := range strings.Split(s, "\n") {
		if strings.Contains(l, sub) {
			last = strings.TrimSpace(l)
		}
	}
	return fmt.Sprint(last)
}

// TestVMCacheDevPlannedRestart: a planned hand-over of a --cache-dev gateway writes nothing back
// (the log is kept, Keep) and the next image recovers it — `iser-blk restart` (the same process
// re-executed) and `stop --keep` followed by the same attach command (a new process): the same
// device, the batches written just before served again from the log, not fenced; a detach then
// writes them back and the target alone reads them.
func TestVMCacheDevPlannedRestart(t *testing.T) {
	for _, fe := range frontends {
		for _, how := range []string{"restart", "stop-keep"} {
			t.Run(fe.name+"/"+how, func(t *testing.T) {
				if fe.name == "nbd" {
					fe.args = []string{"--nbd", "/dev/nbd5", "--connections", "2"} // not the other tests' devices
				}
				testPlannedHandOver(t, fe, how)
			})
		}
	}
}

func testPlannedHandOver(t *testing.T, fe frontend, how string) {
	b := bin(t)
	name := "gw-cdp-" + fe.name
	args, runDir, _ := setup(t, fe, name)
	g := start(t, args...)
	waitLog(t, g, "cache device ready", time.Minute)
	// Written within CleanAfter (10 s) of the hand-over, which follows at once: still in the
	// log when it comes (the write-back starts once the oldest data has waited 10 s).
	data := make([]byte, 4<<20)
	if _, err := rand.Read(data); err != nil {
		t.Fatal(err)
	}
	src := filepath.Join(t.TempDir(), "data")
	if err := os.WriteFile(src, data, 0o600); err != nil {
		t.Fatal(err)
	}
	run(t, "dd", "if="+src, "of="+g.Device, "bs=64k", "oflag=direct", "conv=fsync", "status=none")
	next := g // the image that recovers the log
	var out string
	if how == "restart" {
		out = run(t, b, "restart", name, "--run-dir", runDir)
		deadline := time.Now().Add(time.Minute)
		for strings.Count(g.Stderr.String(), "cache device ready") < 2 {
			if time.Now().After(deadline) {
				t.Fatalf("the restarted image did not open the cache device within a minute:\n%s", g.Stderr)
			}
			time.Sleep(50 * time.Millisecond) // polling the log, not synchronising
		}
	} else {
		out = run(t, b, "stop", "--keep", name, "--run-dir", runDir)
		<-g.Exited
		if g.Err != nil {
			t.Fatalf("the gateway after stop --keep: %v\n%s", g.Err, g.Stderr)
		}
		next = start(t, args...)
		waitLog(t, next, "cache device ready", time.Minute)
	}
	ready := lastLine(next.Stderr.String(), "cache device ready")
	m := batchesRe.FindStringSubmatch(ready)
	if m == nil || m[1] == "0" {
		t.Fatalf("the next image recovered nothing from the log (was it written back at the hand-over?): %s\n%s", ready, next.Stderr)
	}
	t.Logf("%s: %s; the next image: %s", how, strings.TrimSpace(out), ready)
	waitLog(t, next, fe.resumed, time.Minute)
	checkStatus(t, b, name, runDir)
	if next.Device != g.Device {
		t.Fatalf("the next image serves %s, not the device kept for it (%s)", next.Device, g.Device)
	}
	if !bytes.Equal(readHead(t, next.Device, len(data)), data) {
		t.Fatalf("the data written before the %s does not read back after it", how)
	}
	if out, err := exec.Command(b, "detach", name, "--run-dir", runDir).CombinedOutput(); err != nil {
		t.Fatalf("detach: %v\n%s", err, out)
	}
	<-next.Exited
	if next.Err != nil {
		t.Fatalf("gateway after detach: %v", next.Err)
	}
	plain := append(append([]string{args[0], args[1]}, fe.args...), "--cache", "off")
	p := start(t, plain...)
	if !bytes.Equal(readHead(t, p.Device, len(data)), data) {
		t.Fatalf("after detach the target alone does not hold the data written before the %s", how)
	}
	p.Detach(t, "detach of the --cache off gateway")
}

// readHead reads the first n bytes of dev, bypassing the page cache.
func readHead(t *testing.T, dev string, n int) []byte {
	t.Helper()
	out := filepath.Join(t.TempDir(), "head")
	run(t, "dd", "if="+dev, "of="+out, "bs=64k", fmt.Sprintf("count=%d", n/(64<<10)), "iflag=direct", "status=none")
	b, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	return b
}
