package csi

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	csipb "github.com/container-storage-interface/spec/lib/go/csi"
	"go.uber.org/zap"
	"golang.org/x/sys/unix"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/iser-blk/iser-blk/internal/control"
)

// pluginEnv makes the test binary a plugin process serving on the socket it names, whose
// gateways are the test binary again in the "serve" role.
const pluginEnv = "ISERBLK_CSI_TEST_PLUGIN"

func runTestPlugin(sock, runDir string) int {
	os.Setenv(gatewayEnv, "serve") // inherited by the gateways it starts, not by itself
	err := Serve(context.Background(), Options{Endpoint: "unix://" + sock, NodeID: "node-1", RunDir: runDir,
		Gateways: &ExecGateways{Binary: os.Args[0], RunDir: runDir, Poll: 10 * time.Millisecond},
		Mounter:  newFakeMounter()})
	fmt.Fprintln(os.Stderr, "test plugin:", err)
	return 1
}

// TestPluginKillLeavesGateway: the data plane outlives the plugin. A plugin process stages a
// volume (its gateway is a separate process), its process group is killed with SIGKILL, and the gateway goes on
// serving, same PID; a new plugin over the same run directory adopts it without starting
// another, and unstages it through its control socket.
func TestPluginKillLeavesGateway(t *testing.T) {
	dir := t.TempDir()
	runDir, sock := filepath.Join(dir, "run"), filepath.Join(dir, "csi.sock")
	plugin := exec.Command(os.Args[0], "-test.run=^$")
	plugin.Env = append(os.Environ(), pluginEnv+"="+sock, "RUN_DIR="+runDir)
	plugin.Stderr = os.Stderr
	plugin.SysProcAttr = &unix.SysProcAttr{Setpgid: true} // a group of its own, to kill as a whole
	if err := plugin.Start(); err != nil {
		t.Fatal(err)
	}
	pluginDone := make(chan error, 1)
	go func() { pluginDone <- plugin.Wait() }()
	t.Cleanup(func() { _ = plugin.Process.Kill(); <-pluginDone })

	conn, err := grpc.NewClient("unix://"+sock, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	staging := filepath.Join(dir, "staging")
	_, err = csipb.NewNodeClient(conn).NodeStageVolume(ctx, &csipb.NodeStageVolumeRequest{VolumeId: "vol-1",
		StagingTargetPath: staging, VolumeCapability: blockCap(), VolumeContext: map[string]string{KeyTargets: testTarget}},
		grpc.WaitForReady(true)) // the plugin's socket appears once it serves
	if err != nil {
		t.Fatalf("stage through the plugin: %v", err)
	}
	name := GatewayName("vol-1")
	gw := &ExecGateways{Binary: os.Args[0], RunDir: runDir, Log: zap.NewNop(), Poll: 10 * time.Millisecond}
	before, err := gw.Status(ctx, name)
	if err != nil {
		t.Fatalf("the volume's gateway: %v", err)
	}
	pid := before.Gateway.PID
	t.Cleanup(func() { _ = unix.Kill(pid, unix.SIGKILL) }) // only if the test failed before its unstage

	// The whole process group, as a Ctrl-C or a supervisor killing the plugin's group would:
	// the gateway, in a session of its own, is not in it.
	if err := unix.Kill(-plugin.Process.Pid, unix.SIGKILL); err != nil {
		t.Fatal(err)
	}
	if err := <-pluginDone; err == nil {
		t.Fatal("the plugin exited 0 after SIGKILL")
	}
	pluginDone <- nil // for the cleanup
	after, err := gw.Status(ctx, name)
	if err != nil || after.Gateway.PID != pid || after.Gateway.State != "ready" {
		t.Fatalf("after the plugin's SIGKILL the gateway answers %+v, %v; want PID %d ready", after.Gateway, err, pid)
	}

	node := NewNode(NodeOptions{NodeID: "node-1", RunDir: runDir, Gateways: gw, Mounter: newFakeMounter()})
	res, err := node.Heal(ctx)
	if err != nil || res != (HealResult{Adopted: 1}) {
		t.Fatalf("the new plugin's heal: %+v %v, want 1 adopted", res, err)
	}
	if st, err := gw.Status(ctx, name); err != nil || st.Gateway.PID != pid {
		t.Errorf("after the heal: PID %d (%v), want the same %d", st.Gateway.PID, err, pid)
	}
	if _, err := node.NodeUnstageVolume(ctx, &csipb.NodeUnstageVolumeRequest{VolumeId: "vol-1", StagingTargetPath: staging}); err != nil {
		t.Fatalf("unstage by the new plugin: %v", err)
	}
	if _, err := gw.Status(ctx, name); !errors.Is(err, control.ErrUnknownGateway) {
		t.Errorf("the gateway survives the unstage: %v", err)
	}
}

// TestHealRestartsDeadGateway: a gateway killed with SIGKILL while its device waits (its state
// file stays) is started again by the next plugin's heal, under the same name, with the secret
// file it was staged with; a killed one whose device is gone is left alone.
func TestHealRestartsDeadGateway(t *testing.T) {
	t.Setenv(gatewayEnv, "serve") // the gateways ExecGateways starts are the test binary
	runDir := filepath.Join(t.TempDir(), "run")
	gw := &ExecGateways{Binary: os.Args[0], RunDir: runDir, Log: zap.NewNop(), Poll: 10 * time.Millisecond}
	node := NewNode(NodeOptions{NodeID: "node-1", RunDir: runDir, Gateways: gw, Mounter: newFakeMounter()})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	staging := filepath.Join(t.TempDir(), "staging")
	_, err := node.NodeStageVolume(ctx, &csipb.NodeStageVolumeRequest{VolumeId: "vol-1", StagingTargetPath: staging,
		VolumeCapability: blockCap(), VolumeContext: map[string]string{KeyTargets: testTarget},
		Secrets: map[string]string{SecretCHAPUser: "alice", SecretCHAPSecret: "pw"}})
	if err != nil {
		t.Fatal(err)
	}
	name := GatewayName("vol-1")
	kill := func() int {
		t.Helper()
		st, err := gw.Status(ctx, name)
		if err != nil {
			t.Fatal(err)
		}
		pid := st.Gateway.PID
		// A pidfd turns readable when the process has exited: the kill is asynchronous, and a
		// heal that ran before the death would adopt the dying gateway.
		fd, err := unix.PidfdOpen(pid, 0)
		if err != nil {
			t.Fatal(err)
		}
		defer unix.Close(fd)
		if err := unix.Kill(pid, unix.SIGKILL); err != nil {
			t.Fatal(err)
		}
		for {
			n, err := unix.Poll([]unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}, 60_000)
			if err == nil && n == 0 {
				t.Fatalf("gateway PID %d still alive a minute after SIGKILL", pid)
			}
			if err == nil {
				break
			}
			if !errors.Is(err, unix.EINTR) {
				t.Fatal(err)
			}
		}
		return pid
	}
	first := kill()
	// the real attach keeps RUNDIR/NAME.json while its device exists; the fake does not
	if err := os.WriteFile(filepath.Join(runDir, name+".json"), []byte("{}"), 0o600); err != nil {
		t.Fatal(err)
	}
	res, err := NewNode(NodeOptions{NodeID: "node-1", RunDir: runDir, Gateways: gw, Mounter: newFakeMounter()}).Heal(ctx)
	if err != nil || res != (HealResult{Restarted: 1}) {
		t.Fatalf("heal: %+v %v, want 1 restarted", res, err)
	}
	st, err := gw.Status(ctx, name)
	if err != nil || st.Gateway.PID == first || st.Gateway.State != "ready" {
		t.Fatalf("after the heal: %+v %v, want a new ready gateway", st.Gateway, err)
	}
	second := st.Gateway.PID
	t.Cleanup(func() { _ = unix.Kill(second, unix.SIGKILL) })

	kill()
	if err := os.Remove(filepath.Join(runDir, name+".json")); err != nil {
		t.Fatal(err)
	}
	res, err = NewNode(NodeOptions{NodeID: "node-1", RunDir: runDir, Gateways: gw, Mounter: newFakeMounter()}).Heal(ctx)
	if err != nil || res != (HealResult{}) {
		t.Errorf("heal with the device gone: %+v %v, want nothing done", res, err)
	}
	if _, err := gw.Status(ctx, name); !errors.Is(err, control.ErrUnknownGateway) {
		t.Errorf("a gateway was started for a device that is gone: %v", err)
	}
}
