//go:build vm

package systemd_test

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	csipb "github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/iser-blk/iser-blk/internal/csi"
	"github.com/iser-blk/iser-blk/internal/status"
	"github.com/iser-blk/iser-blk/test/vm/vmtest"
)

// The CSI plugin's gateway launcher (internal/csi, launch.go) against the real thing: the plugin
// runs in a transient service, csi-plugin-test.service, which stands for its pod's container
// cgroup, and `systemctl kill --signal=SIGKILL` of that unit kills every process in the cgroup,
// as a container runtime does when it stops the container.

// pluginUnit is the transient service the plugin runs in.
const pluginUnit = "csi-plugin-test.service"

// csiVolume is one Block volume staged through the plugin on an LIO LUN.
type csiVolume struct {
	id, name, runDir, sock, staging, launcher string
	lio                                       vmtest.LIOTarget
	invocation                                string // the plugin unit's InvocationID: its journal
}

func newCSIVolume(t *testing.T, launcher string) *csiVolume {
	t.Helper()
	dir := t.TempDir()
	v := &csiVolume{id: "vol-launcher-" + launcher, runDir: filepath.Join(dir, "run"), sock: filepath.Join(dir, "csi.sock"),
		staging: filepath.Join(dir, "staging"), launcher: launcher}
	v.name = csi.GatewayName(v.id)
	v.lio = target(t, vmtest.LIOOptions{}) // first: torn down after the gateway (cleanups run LIFO)
	if err := os.MkdirAll(v.staging, 0o750); err != nil {
		t.Fatal(err)
	}
	// registered before the plugin's: runs after it (LIFO), with the journal while it is there
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("journal of %s:\n%s", pluginUnit, lastLines(v.journal(), 60))
			log, _ := os.ReadFile(filepath.Join(v.runDir, "csi", v.name+".log"))
			t.Logf("gateway log:\n%s", lastLines(string(log), 40))
		}
		run("systemctl", "stop", pluginUnit)
		run("systemctl", "stop", v.scope()) // a gateway the test left: SIGTERM detaches it
	})
	return v
}

func (v *csiVolume) scope() string { return "iser-blk-" + v.name + ".scope" }

// startPlugin runs `iser-blk csi --launcher L` in pluginUnit and returns a Node client once it
// answers.
func (v *csiVolume) startPlugin(t *testing.T) csipb.NodeClient {
	t.Helper()
	bin := os.Getenv("ISERBLK_BIN")
	if bin == "" {
		t.Fatal("ISERBLK_BIN is not set")
	}
	// KillMode=control-group (the default, spelled out): stopping or killing the unit reaches
	// every process in its cgroup, as a runtime's stop of a container does
	must(t, "systemd-run", "--unit="+pluginUnit, "--collect", "--property=KillMode=control-group",
		"--", bin, "csi", "--endpoint", "unix://"+v.sock, "--node-id", "vm", "--run-dir", v.runDir,
		"--launcher", v.launcher, "--debug")
	conn, err := grpc.NewClient("unix://"+v.sock, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	v.invocation = unitProps(t, pluginUnit, "InvocationID")["InvocationID"]
	node := csipb.NewNodeClient(conn)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if _, err := node.NodeGetInfo(ctx, &csipb.NodeGetInfoRequest{}, grpc.WaitForReady(true)); err != nil {
		t.Fatalf("the plugin does not answer: %v", err)
	}
	return node
}

// killPlugin is the runtime's end of the container: SIGKILL to every process in the plugin's
// cgroup, and the unit gone.
func killPlugin(t *testing.T) {
	t.Helper()
	must(t, "systemctl", "kill", "--signal=SIGKILL", pluginUnit)
	pluginGone(t)
}

// pluginGone waits for pluginUnit to end and be collected, so that its name is free again.
func pluginGone(t *testing.T) {
	t.Helper()
	waitFor(t, pluginUnit+" to end", time.Minute, func() (bool, string) {
		out, _ := run("systemctl", "is-active", pluginUnit)
		s := strings.TrimSpace(out)
		return s == "inactive" || s == "failed", s
	})
	run("systemctl", "reset-failed", pluginUnit) // collected already, or now: its name is free again
	waitFor(t, pluginUnit+" to be collected", time.Minute, func() (bool, string) {
		p := unitProps(t, pluginUnit, "LoadState")
		return p["LoadState"] == "not-found", fmt.Sprint(p)
	})
}

// journal is the current (or last) plugin's journal.
func (v *csiVolume) journal() string {
	if v.invocation == "" {
		return ""
	}
	out, _ := run("journalctl", "_SYSTEMD_INVOCATION_ID="+v.invocation, "-o", "cat", "--no-pager")
	return out
}

func (v *csiVolume) stage(t *testing.T, node csipb.NodeClient) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	_, err := node.NodeStageVolume(ctx, &csipb.NodeStageVolumeRequest{
		VolumeId: v.id, StagingTargetPath: v.staging,
		VolumeCapability: &csipb.VolumeCapability{
			AccessType: &csipb.VolumeCapability_Block{Block: &csipb.VolumeCapability_BlockVolume{}},
			AccessMode: &csipb.VolumeCapability_AccessMode{Mode: csipb.VolumeCapability_AccessMode_SINGLE_NODE_WRITER},
		},
		VolumeContext: map[string]string{csi.KeyTargets: v.lio.URL("iscsi"), csi.KeyCache: "writeback", csi.KeyFrontend: "ublk"},
	})
	if err != nil {
		t.Fatalf("NodeStageVolume: %v", err)
	}
}

func (v *csiVolume) unstage(t *testing.T, node csipb.NodeClient) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	if _, err := node.NodeUnstageVolume(ctx, &csipb.NodeUnstageVolumeRequest{VolumeId: v.id, StagingTargetPath: v.staging}); err != nil {
		t.Fatalf("NodeUnstageVolume: %v", err)
	}
}

// status is `iser-blk status NAME --json` of the volume's gateway.
func (v *csiVolume) status(t *testing.T) status.Status {
	t.Helper()
	out := must(t, os.Getenv("ISERBLK_BIN"), "status", "--run-dir", v.runDir, v.name, "--json")
	var st status.Status
	if err := json.Unmarshal([]byte(out), &st); err != nil {
		t.Fatalf("status %s: %v\n%s", v.name, err, out)
	}
	return st
}

// cgroupOf is pid's cgroup v2 path.
func cgroupOf(pid int) string {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/cgroup", pid))
	if err != nil {
		return "(" + err.Error() + ")"
	}
	for _, l := range strings.Split(string(b), "\n") {
		if p, ok := strings.CutPrefix(l, "0::"); ok {
			return p
		}
	}
	return "(no cgroup v2 line in " + strings.TrimSpace(string(b)) + ")"
}

// alive reports whether pid runs (a zombie does not).
func alive(pid int) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	_, after, ok := strings.Cut(string(b), ") ")
	return ok && !strings.HasPrefix(after, "Z") && syscall.Kill(pid, 0) == nil
}

// TestCSILauncherScopeSurvivesPluginCgroup: with --launcher systemd-scope the gateway of a
// staged write-back volume is in its own scope, iser-blk-csi-HASH.scope in system.slice, not in
// the plugin's cgroup. SIGKILL to the plugin's whole cgroup (a runtime stopping its container)
// leaves it running while fio writes and verifies on the device without an error; the plugin
// started again adopts it (same PID, healthy, stats answer), and NodeUnstage detaches it and the
// scope is gone.
func TestCSILauncherScopeSurvivesPluginCgroup(t *testing.T) {
	requirePID1(t)
	vmtest.LoadModules(t, "ublk")
	v := newCSIVolume(t, "systemd-scope")
	node := v.startPlugin(t)
	v.stage(t, node)
	st := v.status(t)
	pid, dev := st.Gateway.PID, st.Gateway.FrontendPath
	if cg := cgroupOf(pid); cg != "/system.slice/"+v.scope() {
		t.Fatalf("gateway PID %d is in cgroup %s, want /system.slice/%s", pid, cg, v.scope())
	}
	p := unitProps(t, v.scope(), "ActiveState", "CollectMode", "KillMode", "Slice", "TimeoutStopUSec", "After", "Before")
	after, before := strings.Fields(p["After"]), strings.Fields(p["Before"])
	if p["ActiveState"] != "active" || p["CollectMode"] != "inactive-or-failed" || p["KillMode"] != "control-group" ||
		p["Slice"] != "system.slice" || p["TimeoutStopUSec"] != "10min" ||
		!slices.Contains(after, "network.target") || !slices.Contains(after, "network-online.target") ||
		!slices.Contains(before, "remote-fs-pre.target") {
		t.Errorf("scope %s: %v", v.scope(), p)
	}
	t.Logf("gateway PID %d serves %s in %s", pid, dev, cgroupOf(pid))

	run("dmesg", "-C")
	fio := startFio(t, dev, 32)
	w0 := writes(dev)
	waitFor(t, "fio to write", 2*time.Minute, func() (bool, string) {
		return writes(dev) > w0+500, fmt.Sprintf("%d writes", writes(dev)-w0)
	})
	killPlugin(t)
	if !alive(pid) {
		t.Fatalf("gateway PID %d died with the plugin's cgroup", pid)
	}
	w1 := writes(dev)
	waitFor(t, "writes after the plugin's cgroup was killed", 2*time.Minute, func() (bool, string) {
		return writes(dev) > w1+500, fmt.Sprintf("%d writes", writes(dev)-w1)
	})
	fio.wait(t, 5*time.Minute)
	noKernelIOErrors(t, dev)
	if !alive(pid) || cgroupOf(pid) != "/system.slice/"+v.scope() {
		t.Fatalf("gateway PID %d: alive %v, cgroup %s", pid, alive(pid), cgroupOf(pid))
	}

	node = v.startPlugin(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	waitFor(t, "the healer to adopt the gateway", time.Minute, func() (bool, string) {
		out := v.journal()
		return strings.Contains(out, "adopted a running gateway"), lastLines(out, 3)
	})
	if got := v.status(t).Gateway.PID; got != pid {
		t.Fatalf("gateway PID %d after the plugin's restart, want the same %d", got, pid)
	}
	h, err := node.NodeGetVolumeHealth(ctx, &csipb.NodeGetVolumeHealthRequest{VolumeId: v.id})
	if err != nil || len(h.GetVolumeHealth().GetHealthStatuses()) != 0 {
		t.Fatalf("health after the plugin's restart: %v, %v; want healthy", h, err)
	}
	stats, err := node.NodeGetVolumeStats(ctx, &csipb.NodeGetVolumeStatsRequest{VolumeId: v.id, VolumePath: v.staging})
	if err != nil {
		t.Fatalf("NodeGetVolumeStats after the plugin's restart: %v", err)
	}
	t.Logf("adopted; stats %v", stats.GetUsage())

	v.unstage(t, node)
	waitFor(t, "the gateway to exit", time.Minute, func() (bool, string) { return !alive(pid), "alive" })
	waitFor(t, "the scope to be collected", time.Minute, func() (bool, string) {
		p := unitProps(t, v.scope(), "LoadState", "ActiveState")
		return p["LoadState"] == "not-found", fmt.Sprint(p)
	})
	if _, err := os.Stat(dev); err == nil {
		t.Errorf("%s still there after NodeUnstage", dev)
	}
}

// TestCSILauncherProcessDiesWithPluginCgroup: the test's premise, with --launcher process: the
// gateway is in the plugin's cgroup and SIGKILL to that cgroup kills it too; its device is left
// waiting, and the plugin started again restarts it (the healer) so that NodeUnstage detaches.
func TestCSILauncherProcessDiesWithPluginCgroup(t *testing.T) {
	requirePID1(t)
	vmtest.LoadModules(t, "ublk")
	v := newCSIVolume(t, "process")
	node := v.startPlugin(t)
	v.stage(t, node)
	st := v.status(t)
	pid, dev := st.Gateway.PID, st.Gateway.FrontendPath
	if cg := cgroupOf(pid); cg != "/system.slice/"+pluginUnit {
		t.Fatalf("gateway PID %d is in cgroup %s, want the plugin's /system.slice/%s", pid, cg, pluginUnit)
	}
	must(t, "dd", "if=/dev/urandom", "of="+dev, "bs=64k", "count=64", "oflag=direct", "conv=fsync", "status=none")
	killPlugin(t)
	waitFor(t, "the gateway to die with the plugin's cgroup", time.Minute, func() (bool, string) {
		return !alive(pid), "alive in " + cgroupOf(pid)
	})
	if _, err := os.Stat(dev); err != nil {
		t.Fatalf("the device went with its gateway (%v): it must wait for a successor", err)
	}

	node = v.startPlugin(t) // its healer starts a successor that takes the device over
	waitFor(t, "the healer to restart the gateway", 2*time.Minute, func() (bool, string) {
		out := v.journal()
		return strings.Contains(out, "gateway restarted"), lastLines(out, 3)
	})
	v.unstage(t, node)
	if _, err := os.Stat(dev); err == nil {
		t.Errorf("%s still there after NodeUnstage", dev)
	}
}

// unitProps is `systemctl show UNIT -p ...`.
func unitProps(t *testing.T, unit string, props ...string) map[string]string {
	t.Helper()
	args := []string{"show", unit}
	for _, p := range props {
		args = append(args, "-p", p)
	}
	m := map[string]string{}
	for _, l := range strings.Split(must(t, "systemctl", args...), "\n") {
		if k, val, ok := strings.Cut(l, "="); ok {
			m[k] = val
		}
	}
	return m
}

// TestCSILauncherHealerRestartsIntoScope: a scoped gateway killed on its own (a crash) takes
// its scope along and leaves its device waiting; the plugin started again heals the volume with
// a successor that the healer's start puts in a scope of the same name, serving the same
// device, healthy; NodeUnstage then removes both.
func TestCSILauncherHealerRestartsIntoScope(t *testing.T) {
	requirePID1(t)
	vmtest.LoadModules(t, "ublk")
	v := newCSIVolume(t, "systemd-scope")
	node := v.startPlugin(t)
	v.stage(t, node)
	st := v.status(t)
	pid, dev := st.Gateway.PID, st.Gateway.FrontendPath
	must(t, "dd", "if=/dev/urandom", "of="+dev, "bs=64k", "count=64", "oflag=direct", "conv=fsync", "status=none")
	must(t, "systemctl", "stop", pluginUnit) // SIGTERM: the plugin ends, its gateways stay
	pluginGone(t)
	if !alive(pid) {
		t.Fatalf("gateway PID %d ended with the plugin", pid)
	}
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the killed gateway's scope to be collected", time.Minute, func() (bool, string) {
		p := unitProps(t, v.scope(), "LoadState", "ActiveState")
		return p["LoadState"] == "not-found", fmt.Sprint(p)
	})
	if _, err := os.Stat(dev); err != nil {
		t.Fatalf("the device went with its gateway (%v): it must wait for a successor", err)
	}

	node = v.startPlugin(t)
	waitFor(t, "the healer to restart the gateway", 2*time.Minute, func() (bool, string) {
		out := v.journal()
		return strings.Contains(out, "gateway restarted"), lastLines(out, 3)
	})
	st = v.status(t)
	if st.Gateway.PID == pid || st.Gateway.FrontendPath != dev {
		t.Fatalf("successor PID %d serving %s; want a new PID serving %s", st.Gateway.PID, st.Gateway.FrontendPath, dev)
	}
	if cg := cgroupOf(st.Gateway.PID); cg != "/system.slice/"+v.scope() {
		t.Fatalf("the healer's gateway PID %d is in cgroup %s, want /system.slice/%s", st.Gateway.PID, cg, v.scope())
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	h, err := node.NodeGetVolumeHealth(ctx, &csipb.NodeGetVolumeHealthRequest{VolumeId: v.id})
	if err != nil || len(h.GetVolumeHealth().GetHealthStatuses()) != 0 {
		t.Fatalf("health after the healer's restart: %v, %v; want healthy (the device was clean)", h, err)
	}
	must(t, "dd", "if="+dev, "of=/dev/null", "bs=64k", "count=64", "iflag=direct", "status=none")
	v.unstage(t, node)
	waitFor(t, "the scope to be collected", time.Minute, func() (bool, string) {
		p := unitProps(t, v.scope(), "LoadState", "ActiveState")
		return p["LoadState"] == "not-found", fmt.Sprint(p)
	})
}
