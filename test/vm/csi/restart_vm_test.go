//go:build vm

package csivm

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	csipb "github.com/container-storage-interface/spec/lib/go/csi"

	"github.com/iser-blk/iser-blk/internal/csi"
	"github.com/iser-blk/iser-blk/internal/csipool"
	"github.com/iser-blk/iser-blk/internal/statefile"
	"github.com/iser-blk/iser-blk/test/vm/vmtest"
)

// TestVMPluginKill9MidIO: the data plane outlives the plugin on real devices. A Filesystem
// volume (ext4) is staged and published, fio writes and verifies a file on it, and the plugin is
// killed with SIGKILL while fio's writes go on; a plugin started again with the same flags
// adopts the gateway. fio finishes with every block verified and no error; the device, the
// gateway process and both mounts are the ones from before; NodeUnpublish and NodeUnstage then
// leave no mount, no device, no LIO session, no gateway process and no state file. For ublk over
// iSCSI/TCP and for nbd over iSER.
func TestVMPluginKill9MidIO(t *testing.T) {
	requireModules(t)
	for _, tc := range []struct{ frontend, transport string }{{"ublk", "iscsi"}, {"nbd", "iser"}} {
		t.Run(tc.frontend+"-"+tc.transport, func(t *testing.T) { testKill9MidIO(t, tc.frontend, tc.transport, false) })
	}
}

// TestVMHealerRestartsGateway: the healer on real devices. As TestVMPluginKill9MidIO, but the
// volume's gateway (write-through cache: no acknowledged write lives only in it) is killed with
// SIGKILL too, after the plugin: the restarted plugin finds the device waiting and starts a new
// gateway, which takes the device over; fio finishes with every block verified and no error, on
// the same device under the same mounts.
func TestVMHealerRestartsGateway(t *testing.T) {
	requireModules(t)
	for _, tc := range []struct{ frontend, transport string }{{"ublk", "iscsi"}, {"nbd", "iscsi"}} {
		t.Run(tc.frontend+"-"+tc.transport, func(t *testing.T) { testKill9MidIO(t, tc.frontend, tc.transport, true) })
	}
}

// testKill9MidIO kills the plugin during fio's writes, and its gateway too when gatewayToo.
func testKill9MidIO(t *testing.T, frontend, transport string, gatewayToo bool) {
	const lunMiB, fioMiB = 128, 32
	tg := startPool(t, "kill-"+frontend, 1, lunMiB, transport == "iser")[0]
	dir := t.TempDir()
	p := startPlugin(t, dir, writePool(t, dir, []string{tg.URL(transport)}))
	t.Cleanup(func() {
		if t.Failed() {
			p.detachAll(t, dir)
		}
	})
	logMark := len(kernelLog(t))
	conn := p.dial(t)
	ctl, node := csipb.NewControllerClient(conn), csipb.NewNodeClient(conn)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()

	params := map[string]string{csipool.ContextFrontend: frontend, csipool.ContextTransport: transport}
	if gatewayToo {
		params[csipool.ContextCache] = "writethrough"
	}
	created, err := ctl.CreateVolume(ctx, &csipb.CreateVolumeRequest{Name: "kill9-" + frontend,
		VolumeCapabilities: []*csipb.VolumeCapability{mountCap("ext4")},
		Parameters:         params})
	if err != nil {
		t.Fatalf("CreateVolume: %v", err)
	}
	vol := created.GetVolume()
	staging, target := filepath.Join(dir, "staging"), filepath.Join(dir, "target")
	if _, err := node.NodeStageVolume(ctx, &csipb.NodeStageVolumeRequest{VolumeId: vol.GetVolumeId(), StagingTargetPath: staging,
		VolumeCapability: mountCap("ext4"), VolumeContext: vol.GetVolumeContext()}); err != nil {
		t.Fatalf("NodeStageVolume: %v", err)
	}
	if _, err := node.NodePublishVolume(ctx, &csipb.NodePublishVolumeRequest{VolumeId: vol.GetVolumeId(), StagingTargetPath: staging,
		TargetPath: target, VolumeCapability: mountCap("ext4"), VolumeContext: vol.GetVolumeContext()}); err != nil {
		t.Fatalf("NodePublishVolume: %v", err)
	}

	name := csi.GatewayName(vol.GetVolumeId())
	before := gatewayStatus(t, p.runDir, name)
	dev, pid := before.Gateway.FrontendPath, before.Gateway.PID
	if !strings.HasPrefix(filepath.Base(dev), map[string]string{"ublk": "ublkb", "nbd": "nbd"}[frontend]) {
		t.Fatalf("the gateway serves %q, want a %s device", dev, frontend)
	}
	stagingMount, ok1 := mountAt(t, staging)
	targetMount, ok2 := mountAt(t, target)
	if !ok1 || !ok2 || stagingMount.Source != dev || targetMount.Source != dev || stagingMount.FSType != "ext4" {
		t.Fatalf("mounts: staging %+v (%v), target %+v (%v); want ext4 from %s at both", stagingMount, ok1, targetMount, ok2, dev)
	}
	t.Logf("staged on %s (gateway pid %d), staging mount %s, target mount %s", dev, pid, stagingMount.ID, targetMount.ID)

	// fio writes; once the device has taken writes, the plugin dies in the middle of them.
	writes0 := vmtest.DiskWrites(t, dev)
	fio := startFio(t, filepath.Join(target, "fio.dat"), fioMiB)
	eventually(t, 2*time.Minute, dev+" took no writes from fio", func() bool {
		return vmtest.DiskWrites(t, dev) > writes0+1024 || !fio.running()
	})
	if !fio.running() {
		t.Fatalf("fio ended before the plugin was killed: the kill would not be mid-I/O\n%s", tail(fio.out.String(), 20))
	}
	p.kill9(t)
	killedAt, killTime := vmtest.DiskWrites(t, dev), time.Now()
	if processGone(pid) {
		t.Fatalf("the gateway (pid %d) died with the plugin", pid)
	}
	if gatewayToo {
		if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
			t.Fatalf("kill -9 the gateway: %v", err)
		}
		eventually(t, 30*time.Second, "the killed gateway still runs", func() bool { return processGone(pid) })
	}
	p.start(t)
	conn = p.dial(t)
	node = csipb.NewNodeClient(conn)
	// The healer ran at the start and adopted the gateway, or started a new one for the
	// waiting device.
	healed := "adopted a running gateway"
	if gatewayToo {
		healed = "gateway restarted"
	}
	eventually(t, 2*time.Minute, "the restarted plugin did not log "+healed+" for "+name, func() bool {
		return strings.Count(p.out.String(), healed) == 1
	})
	healTime := time.Since(killTime)
	for _, l := range strings.Split(p.out.String(), "\n") {
		if strings.Contains(l, "healer") || strings.Contains(l, healed) || strings.Contains(l, "gateway started") {
			t.Log(l)
		}
	}
	if !fio.running() {
		t.Logf("note: fio ended while the plugin restarted")
	}
	fio.wait(t, 5*time.Minute)
	t.Logf("the plugin was back %v after the kill (%s), fio done %v after it", healTime.Round(100*time.Millisecond), healed,
		time.Since(killTime).Round(100*time.Millisecond))
	if w := vmtest.DiskWrites(t, dev); w <= killedAt {
		t.Errorf("%s took no writes after the kill (%d before, %d after): the kill was not mid-I/O", dev, killedAt, w)
	}
	noKernelIOErrors(t, dev, logMark)

	after := gatewayStatus(t, p.runDir, name)
	switch {
	case after.Gateway.FrontendPath != dev:
		t.Errorf("after the restart the gateway serves %s, want %s", after.Gateway.FrontendPath, dev)
	case !gatewayToo && after.Gateway.PID != pid:
		t.Errorf("after the restart the gateway is pid %d, want %d (adopted, not replaced)", after.Gateway.PID, pid)
	case gatewayToo && after.Gateway.PID == pid:
		t.Errorf("after the restart the gateway is still pid %d, which was killed", pid)
	}
	pid = after.Gateway.PID
	if m, ok := mountAt(t, staging); !ok || m.ID != stagingMount.ID || m.Source != dev {
		t.Errorf("staging mount after the restart: %+v (%v), want id %s from %s", m, ok, stagingMount.ID, dev)
	}
	if m, ok := mountAt(t, target); !ok || m.ID != targetMount.ID || m.Source != dev {
		t.Errorf("target mount after the restart: %+v (%v), want id %s from %s", m, ok, targetMount.ID, dev)
	}
	// The new plugin answers for the volume it did not stage: its filesystem's usage, and a
	// healthy gateway (no adverse condition).
	if stats, err := node.NodeGetVolumeStats(ctx, &csipb.NodeGetVolumeStatsRequest{VolumeId: vol.GetVolumeId(), VolumePath: target}); err != nil {
		t.Errorf("NodeGetVolumeStats after the restart: %v", err)
	} else if len(stats.GetUsage()) == 0 || stats.GetUsage()[0].GetUsed() < fioMiB<<20 {
		t.Errorf("NodeGetVolumeStats after the restart: %v, want at least fio's %d MiB used", stats.GetUsage(), fioMiB)
	}
	if h, err := node.NodeGetVolumeHealth(ctx, &csipb.NodeGetVolumeHealthRequest{VolumeId: vol.GetVolumeId(), VolumePublishPath: target, StagingTargetPath: staging}); err != nil ||
		len(h.GetVolumeHealth().GetHealthStatuses()) != 0 {
		t.Errorf("NodeGetVolumeHealth after the restart: %v, %v; want healthy (no condition)", h, err)
	}

	if _, err := node.NodeUnpublishVolume(ctx, &csipb.NodeUnpublishVolumeRequest{VolumeId: vol.GetVolumeId(), TargetPath: target}); err != nil {
		t.Fatalf("NodeUnpublishVolume: %v", err)
	}
	if _, err := node.NodeUnstageVolume(ctx, &csipb.NodeUnstageVolumeRequest{VolumeId: vol.GetVolumeId(), StagingTargetPath: staging}); err != nil {
		t.Fatalf("NodeUnstageVolume: %v", err)
	}
	if _, err := ctl.DeleteVolume(ctx, &csipb.DeleteVolumeRequest{VolumeId: vol.GetVolumeId()}); err != nil {
		t.Fatalf("DeleteVolume: %v", err)
	}
	checkGone(t, p, tg.IQN, name, dev, pid, staging, target)
}

// checkGone requires that nothing of the unstaged volume is left: mount, device, LIO session,
// gateway process, control socket, state file or record.
func checkGone(t *testing.T, p *plugin, iqn, name, dev string, pid int, paths ...string) {
	t.Helper()
	for _, m := range mounts(t) {
		for _, path := range paths {
			if m.Point == path {
				t.Errorf("%s is still mounted (%+v)", path, m)
			}
		}
		if m.Source == dev {
			t.Errorf("%s is still mounted at %s", dev, m.Point)
		}
	}
	eventually(t, 30*time.Second, fmt.Sprintf("the gateway (pid %d) still runs", pid), func() bool { return processGone(pid) })
	eventually(t, 30*time.Second, dev+" is still there", func() bool { return deviceGone(dev) })
	eventually(t, 30*time.Second, "a session is left on "+iqn, func() bool { return len(sessions(t, iqn)) == 0 })
	for _, f := range []string{statefile.Path(p.runDir, name), filepath.Join(p.runDir, name+".sock"),
		filepath.Join(p.runDir, "csi", name+".volume.json")} {
		if _, err := os.Stat(f); !os.IsNotExist(err) {
			t.Errorf("%s is left (%v)", f, err)
		}
	}
	// a deleted volume's LUN is erased in the background before it is free again
	claimsEmpty(t, p.claims, "claims left")
}

// deviceGone reports whether dev no longer serves: a ublk disk is removed with its node; an nbd
// node stays, but disconnected (no pid attribute, size 0).
func deviceGone(dev string) bool {
	base := filepath.Base(dev)
	if strings.HasPrefix(base, "ublkb") {
		_, err1 := os.Stat(dev)
		_, err2 := os.Stat(filepath.Join("/sys/block", base))
		return os.IsNotExist(err1) && os.IsNotExist(err2)
	}
	_, err := os.Stat(filepath.Join("/sys/block", base, "pid"))
	size, _ := os.ReadFile(filepath.Join("/sys/block", base, "size"))
	return os.IsNotExist(err) && strings.TrimSpace(string(size)) == "0"
}

// kernelLog returns the kernel log's lines.
func kernelLog(t *testing.T) []string {
	t.Helper()
	out, err := exec.Command("dmesg").Output()
	if err != nil {
		t.Fatalf("dmesg: %v", err)
	}
	return strings.Split(strings.TrimRight(string(out), "\n"), "\n")
}

// noKernelIOErrors requires the kernel log's lines from the since-th on to hold no error for
// dev (earlier lines are other tests' in this guest).
func noKernelIOErrors(t *testing.T, dev string, since int) {
	t.Helper()
	lines := kernelLog(t)
	if since > len(lines) {
		since = 0 // the ring buffer wrapped: check what is there
	}
	re := regexp.MustCompile(`\b` + regexp.QuoteMeta(filepath.Base(dev)) + `\b`)
	for _, l := range lines[since:] {
		if re.MatchString(l) && strings.Contains(strings.ToLower(l), "error") {
			t.Errorf("kernel error on %s: %s", dev, l)
		}
	}
}
