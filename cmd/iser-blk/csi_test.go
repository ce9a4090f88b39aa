package main

import (
	"context"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	csipb "github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/iser-blk/iser-blk/internal/csi"
	"github.com/iser-blk/iser-blk/internal/syncbuf"
)

// TestCSIUsage: the plugin's flags are checked before anything listens: each mistake is exit 2
// with a message naming the flag.
func TestCSIUsage(t *testing.T) {
	dir := t.TempDir()
	for _, tt := range []struct {
		args []string
		want string
	}{
		{[]string{"csi", "--node-id", "n"}, "--endpoint"},
		{[]string{"csi", "--endpoint", "unix://" + dir + "/csi.sock"}, "--node-id"},
		{[]string{"csi", "--endpoint", "tcp://127.0.0.1:1", "--node-id", "n"}, "--endpoint"},
		{[]string{"csi", "--endpoint", "unix://" + dir + "/csi.sock", "--node-id", "n", "--max-volumes", "-1"}, "--max-volumes"},
		{[]string{"csi", "--endpoint", "unix://" + dir + "/csi.sock", "--node-id", "n", "--pool", dir + "/pool.json"}, "--pool"}, // missing
		{[]string{"csi", "extra", "--endpoint", "unix://" + dir + "/csi.sock", "--node-id", "n"}, "argument"},
	} {
		code, _, stderr := runOut(tt.args...)
		if code != exitUsage || !strings.Contains(stderr, tt.want) {
			t.Errorf("%q: exit %d, stderr %q; want exit %d naming %s", tt.args, code, stderr, exitUsage, tt.want)
		}
	}
	_, _, help := runOut("csi", "--help")
	for _, s := range []string{groupCSI + ":", "--endpoint", "--node-id", "--pool", "--run-dir", "--max-volumes"} {
		if !strings.Contains(help, s) {
			t.Errorf("csi --help lacks %s", s)
		}
	}
}

// TestCSIServes: `iser-blk csi` answers on its socket with the plugin's identity and ends with
// exit 0, its socket removed, when its context ends (main cancels it on SIGTERM).
// TestCSIServesThePool: with --pool the plugin also serves the Controller and says so; a LUN
// that cannot be probed (nothing listens at its portal) is left out, not fatal, and the claims
// file is where --pool-claims says.
func TestCSIServesThePool(t *testing.T) {
	dir := t.TempDir()
	sock, pool, claims := filepath.Join(dir, "csi.sock"), filepath.Join(dir, "pool"), filepath.Join(dir, "state", "claims.json")
	if err := os.WriteFile(pool, []byte("# one LUN nobody serves\niscsi://127.0.0.1:1/iqn.2001-04.com.example:none/0\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	exited := make(chan int, 1)
	var stderr syncbuf.Buffer
	go func() {
		exited <- run(ctx, []string{"csi", "--endpoint", "unix://" + sock, "--node-id", "node-1", "--run-dir", filepath.Join(dir, "run"),
			"--pool", pool, "--pool-claims", claims, "--initiator-name", "iqn.2026-12.io.iser-blk.test:csi"}, io.Discard, &stderr)
	}()
	conn, err := grpc.NewClient("unix://"+sock, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	callCtx, callCancel := context.WithTimeout(ctx, time.Minute)
	defer callCancel()
	caps, err := csipb.NewIdentityClient(conn).GetPluginCapabilities(callCtx, &csipb.GetPluginCapabilitiesRequest{}, grpc.WaitForReady(true))
	if err != nil {
		t.Fatalf("plugin capabilities: %v; stderr: %s", err, stderr.String())
	}
	controller := false
	for _, c := range caps.Capabilities {
		controller = controller || c.GetService().GetType() == csipb.PluginCapability_Service_CONTROLLER_SERVICE
	}
	if !controller {
		t.Errorf("--pool given but CONTROLLER_SERVICE not advertised: %v", caps)
	}
	capResp, err := csipb.NewControllerClient(conn).GetCapacity(callCtx, &csipb.GetCapacityRequest{})
	if err != nil || capResp.AvailableCapacity != 0 {
		t.Errorf("capacity of a pool whose only LUN cannot be probed: %v, %v", capResp, err)
	}
	if _, err := os.Stat(claims); err != nil {
		t.Errorf("claims file: %v", err)
	}
	cancel()
	if code := <-exited; code != exitOK {
		t.Errorf("exit %d after the context ended; stderr: %s", code, stderr.String())
	}
}

func TestCSIServes(t *testing.T) {
	dir := t.TempDir()
	sock := filepath.Join(dir, "csi.sock")
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	exited := make(chan int, 1)
	var stderr syncbuf.Buffer
	go func() {
		exited <- run(ctx, []string{"csi", "--endpoint", "unix://" + sock, "--node-id", "node-1", "--run-dir", filepath.Join(dir, "run")}, io.Discard, &stderr)
	}()
	conn, err := grpc.NewClient("unix://"+sock, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	callCtx, callCancel := context.WithTimeout(ctx, time.Minute)
	defer callCancel()
	// WaitForReady: the call waits for the socket to accept instead of failing before it exists.
	info, err := csipb.NewIdentityClient(conn).GetPluginInfo(callCtx, &csipb.GetPluginInfoRequest{}, grpc.WaitForReady(true))
	if err != nil || info.Name != csi.DriverName {
		t.Fatalf("plugin info %v %v; stderr: %s", info, err, stderr.String())
	}
	node, err := csipb.NewNodeClient(conn).NodeGetInfo(callCtx, &csipb.NodeGetInfoRequest{})
	if err != nil || node.NodeId != "node-1" {
		t.Errorf("node info %v %v", node, err)
	}
	cancel()
	if code := <-exited; code != exitOK {
		t.Errorf("exit %d after the context ended; stderr: %s", code, stderr.String())
	}
	if _, err := os.Stat(sock); !os.IsNotExist(err) {
		t.Errorf("the socket survives the plugin: %v", err)
	}
}
