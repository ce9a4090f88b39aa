//go:build vm

package systemd_test

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	csipb "github.com/container-storage-interface/spec/lib/go/csi"
	"golang.org/x/sys/unix"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	grpcstatus "google.golang.org/grpc/status"

	"github.com/iser-blk/iser-blk/internal/csi"
	"github.com/iser-blk/iser-blk/internal/syncbuf"
	"github.com/iser-blk/iser-blk/test/vm/vmtest"
)

// manyVolumes is issue 38's count: a node with 16 LUNs staged at once.
const manyVolumes = 16

// TestCSIManyVolumes: the CSI plugin stages 16 volumes at once over 16 LIO targets, each gateway
// started with its share of --memory-budget 1792MiB (csi.MinShare each: a 64 MiB pool, a 16 MiB
// cache); after each volume has taken 1 MiB writes and 4 KiB writes, each gateway's resident
// memory is within its share and all of them within the budget; every device is
// /dev/iser-blk/NAME under the udev rule; a 17th volume is RESOURCE_EXHAUSTED; unstaging all
// leaves no gateway and no link.
func TestCSIManyVolumes(t *testing.T) {
	requireSystemd(t)
	vmtest.LoadModules(t, "ublk_drv")
	startUdev(t)
	const budget = manyVolumes * csi.MinShare
	share, err := csi.ShareOf(budget, manyVolumes, 0)
	if err != nil {
		t.Fatal(err)
	}

	var cleanupBegan time.Time // the last cleanup registered, run first, sets it
	t.Cleanup(func() {
		if !cleanupBegan.IsZero() {
			t.Logf("cleanup (unstage, plugin, %d targets) took %v", manyVolumes+1, time.Since(cleanupBegan).Round(time.Millisecond))
		}
	})
	began := time.Now()
	opts := make([]vmtest.LIOOptions, manyVolumes+1)
	for i := range opts {
		opts[i] = vmtest.LIOOptions{IQN: fmt.Sprintf("iqn.2003-01.org.linux-iscsi.iserblk-vm:many%02d", i), SizeMiB: 16, NoISER: true}
	}
	targets := make([]string, len(opts))
	for i, tg := range vmtest.StartLIOs(t, opts) {
		targets[i] = tg.URL("iscsi")
	}
	t.Logf("%d LIO targets (16 MiB RAM LUNs, TCP) set up in %v", len(targets), time.Since(began).Round(time.Millisecond))
	dir := t.TempDir()
	sock := filepath.Join(dir, "csi.sock")
	var stderr syncbuf.Buffer
	plugin := exec.Command("/usr/local/bin/iser-blk", "csi", "--endpoint", "unix://"+sock, "--node-id", "vm",
		"--memory-budget", fmt.Sprintf("%dMiB", budget>>20), "--max-volumes", strconv.Itoa(manyVolumes), "--run-dir", "/run/iser-blk")
	plugin.Stdout, plugin.Stderr = &stderr, &stderr
	if err := plugin.Start(); err != nil {
		t.Fatal(err)
	}
	// ctx ends when the plugin does, so that no call waits for a socket that will never be
	// (cleanups, not defers: the unstage cleanup below needs ctx and conn)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	t.Cleanup(cancel)
	exited := make(chan struct{})
	go func() {
		plugin.Wait()
		close(exited)
		cancel()
	}()
	t.Cleanup(func() {
		plugin.Process.Kill()
		<-exited
		if t.Failed() {
			t.Logf("plugin:\n%s", lastLines(stderr.String(), 40))
		}
	})
	conn, err := grpc.NewClient("unix://"+sock, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	node := csipb.NewNodeClient(conn)
	info, err := node.NodeGetInfo(ctx, &csipb.NodeGetInfoRequest{}, grpc.WaitForReady(true))
	if err != nil || info.MaxVolumesPerNode != manyVolumes {
		t.Fatalf("NodeGetInfo %v %v; want %d volumes", info, err, manyVolumes)
	}

	blockCap := &csipb.VolumeCapability{AccessType: &csipb.VolumeCapability_Block{Block: &csipb.VolumeCapability_BlockVolume{}},
		AccessMode: &csipb.VolumeCapability_AccessMode{Mode: csipb.VolumeCapability_AccessMode_SINGLE_NODE_WRITER}}
	stage := func(i int) error {
		_, err := node.NodeStageVolume(ctx, &csipb.NodeStageVolumeRequest{VolumeId: volumeID(i),
			StagingTargetPath: filepath.Join(dir, "staging", volumeID(i)), VolumeCapability: blockCap,
			VolumeContext: map[string]string{csi.KeyTargets: targets[i], csi.KeyFrontend: "ublk", csi.KeyCache: "writeback"}})
		return err
	}
	unstage := func(i int) error {
		_, err := node.NodeUnstageVolume(ctx, &csipb.NodeUnstageVolumeRequest{VolumeId: volumeID(i),
			StagingTargetPath: filepath.Join(dir, "staging", volumeID(i))})
		return err
	}
	t.Cleanup(func() {
		for i := range targets {
			unstage(i)
		}
	})
	t.Cleanup(func() { cleanupBegan = time.Now() })
	began = time.Now()
	errs := make(chan error, manyVolumes)
	for i := range manyVolumes {
		go func() { errs <- stage(i) }()
	}
	for range manyVolumes {
		if err := <-errs; err != nil {
			t.Fatalf("stage: %v", err)
		}
	}
	if err := stage(manyVolumes); grpcstatus.Code(err) != codes.ResourceExhausted {
		t.Fatalf("a 17th volume: %v, want ResourceExhausted", err)
	}

	must(t, "udevadm", "settle", "--timeout=120")
	t.Logf("%d volumes staged in %v", manyVolumes, time.Since(began).Round(time.Millisecond))
	pids := make([]int, manyVolumes)
	devs := make([]string, manyVolumes)
	for i := range manyVolumes {
		name := csi.GatewayName(volumeID(i))
		link := "/dev/iser-blk/" + name
		var dev string
		waitFor(t, link, time.Minute, func() (bool, string) {
			d, err := filepath.EvalSymlinks(link)
			dev = d
			return err == nil && strings.HasPrefix(d, "/dev/ublkb"), d + " " + errString(err)
		})
		pids[i] = gatewayPID(t, name)
		args := cmdline(t, pids[i])
		if !strings.Contains(args, fmt.Sprintf(" --buffer-memory %dMiB ", share.BufferMemory>>20)) ||
			!strings.Contains(args, fmt.Sprintf(" --cache-size %dMiB ", share.CacheSize>>20)) {
			t.Fatalf("gateway %s: %q lacks its share %+v", name, args, share)
		}
		devs[i] = dev
	}
	writeEach(t, devs)
	var total int64
	for i, pid := range pids {
		rss := residentBytes(t, pid)
		total += rss
		if rss > share.Total() {
			t.Errorf("gateway %d holds %d MiB, its share is %d MiB", i, rss>>20, share.Total()>>20)
		}
	}
	t.Logf("%d gateways hold %d MiB resident together; budget %d MiB (share %d MiB: pool %d, cache %d)",
		manyVolumes, total>>20, budget>>20, share.Total()>>20, share.BufferMemory>>20, share.CacheSize>>20)
	if total > budget {
		t.Fatalf("the gateways hold %d MiB, above the budget of %d MiB", total>>20, budget>>20)
	}

	began = time.Now()
	for i := range manyVolumes {
		if err := unstage(i); err != nil {
			t.Fatalf("unstage %d: %v", i, err)
		}
	}
	must(t, "udevadm", "settle", "--timeout=120")
	t.Logf("%d volumes unstaged in %v", manyVolumes, time.Since(began).Round(time.Millisecond))
	for i, pid := range pids {
		if err := unix.Kill(pid, 0); err == nil {
			t.Errorf("gateway %d (PID %d) outlived its unstage", i, pid)
		}
		link := "/dev/iser-blk/" + csi.GatewayName(volumeID(i))
		waitFor(t, link+" removed", time.Minute, func() (bool, string) {
			_, err := os.Lstat(link)
			return os.IsNotExist(err), errString(err)
		})
	}
}

func volumeID(i int) string { return fmt.Sprintf("many-%02d", i) }

// writeEach writes every device: 12 MiB in 1 MiB writes (around the cache, through the pool),
// then the last 4 MiB of the 16 MiB LUN in 4 KiB writes (into the cache), four devices at a time.
func writeEach(t *testing.T, devs []string) {
	t.Helper()
	began := time.Now()
	for i, err := range vmtest.ForEach(len(devs), func(i int) error {
		for _, c := range [][]string{
			{"dd", "if=/dev/urandom", "of=" + devs[i], "bs=1M", "count=12", "oflag=direct", "status=none"},
			{"dd", "if=/dev/urandom", "of=" + devs[i], "bs=4k", "count=1024", "seek=3072", "status=none", "conv=fsync"},
		} {
			if out, code := run(c[0], c[1:]...); code != 0 {
				return fmt.Errorf("%s: exit %d\n%s", strings.Join(c, " "), code, out)
			}
		}
		return nil
	}) {
		if err != nil {
			t.Errorf("volume %d: %v", i, err)
		}
	}
	if t.Failed() {
		t.FailNow()
	}
	t.Logf("%d devices written in %v", len(devs), time.Since(began).Round(time.Millisecond))
}

// gatewayPID is the PID of the process that serves name: `iser-blk attach --name NAME`.
func gatewayPID(t *testing.T, name string) int {
	t.Helper()
	out := must(t, "pgrep", "-f", "--", "attach --name "+name+" ")
	pid, err := strconv.Atoi(strings.Fields(out)[0])
	if err != nil {
		t.Fatalf("pgrep for %s: %q", name, out)
	}
	return pid
}

// cmdline is pid's command line, arguments separated and closed by spaces.
func cmdline(t *testing.T, pid int) string {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
	if err != nil {
		t.Fatal(err)
	}
	return " " + strings.ReplaceAll(string(b), "\x00", " ")
}

// residentBytes is pid's VmRSS: its anonymous memory and the binary's resident pages (shared
// among the gateways, so the sum overstates what they take together).
func residentBytes(t *testing.T, pid int) int64 {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range strings.Split(string(b), "\n") {
		if f := strings.Fields(l); len(f) == 3 && f[0] == "VmRSS:" {
			kb, err := strconv.ParseInt(f[1], 10, 64)
			if err != nil {
				t.Fatal(err)
			}
			return kb << 10
		}
	}
	t.Fatalf("no VmRSS for PID %d", pid)
	return 0
}
