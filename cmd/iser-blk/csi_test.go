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
		{[]string{"csi", "--endpoint", "unix://" + dir + "/csi.sock", "--node-id", "n", "--memory-budget", "lots"}, "--memory-budget"},
		// an explicit count the budget cannot hold is refused, not lowered
		{[]string{"csi", "--endpoint", "unix://" + dir + "/csi.sock", "--node-id", "n", "--memory-budget", "1GiB", "--max-volumes", "16"}, "holds 9 volumes"},
		{[]string{"csi", "--endpoint", "unix://" + dir + "/csi.sock", "--node-id", "n", "--pool", dir + "/pool.json"}, "--pool"}, // missing
		{[]string{"csi", "--endpoint", "unix://" + dir + "/csi.sock", "--node-id", "n", "--pool-erase", "shred"}, "--pool-erase"},
		{[]string{"csi", "--endpoint", "unix://" + dir + "/csi.sock", "--node-id", "n", "--launcher", "fork"}, "--launcher"},
		{[]string{"csi", "extra", "--endpoint", "unix://" + dir + "/csi.sock", "--node-id", "n"}, "argument"},
	} {
		code, _, stderr := runOut(tt.args...)
		if code != exitUsage || !strings.Contains(stderr, tt.want) {
			t.Errorf("%q: exit %d, stderr %q; want exit %d naming %s", tt.args, code, stderr, exitUsage, tt.want)
		}
	}
	_, _, help := runOut("csi", "--help")
	for _, s := range []string{groupCSI + ":", "--endpoint", "--node-id", "--pool", "--pool-claims", "--pool-erase", "--initiator-name", "--run-dir", "--max-volumes", "--memory-budget", "--launcher"} {
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
	p := startCSI(t, sock, "--run-dir", filepath.Join(dir, "run"),
		"--pool", pool, "--pool-claims", claims, "--initiator-name", "iqn.2026-12.io.iser-blk.test:csi")
	caps, err := csipb.NewIdentityClient(p.conn).GetPluginCapabilities(p.ctx, &csipb.GetPluginCapabilitiesRequest{}, grpc.WaitForReady(true))
	if err != nil {
		t.Fatalf("plugin capabilities: %v; stderr: %s", err, p.stderr.String())
	}
	controller := false
	for _, c := range caps.Capabilities {
		controller = controller || c.GetService().GetType() == csipb.PluginCapability_Service_CONTROLLER_SERVICE
	}
	if !controller {
		t.Errorf("--pool given but CONTROLLER_SERVICE not advertised: %v", caps)
	}
	capResp, err := csipb.NewControllerClient(p.conn).GetCapacity(p.ctx, &csipb.GetCapacityRequest{})
	if err != nil || capResp.AvailableCapacity != 0 {
		t.Errorf("capacity of a pool whose only LUN cannot be probed: %v, %v", capResp, err)
	}
	if _, err := os.Stat(claims); err != nil {
		t.Errorf("claims file: %v", err)
	}
	p.stop(t)
}

func TestCSIServes(t *testing.T) {
	dir := t.TempDir()
	sock := filepath.Join(dir, "csi.sock")
	// a 1 GiB budget holds 9 gateways of csi.MinShare: without --max-volumes that is the node's most
	p := startCSI(t, sock, "--run-dir", filepath.Join(dir, "run"), "--memory-budget", "1GiB")
	// WaitForReady: the call waits for the socket to accept instead of failing before it exists.
	info, err := csipb.NewIdentityClient(p.conn).GetPluginInfo(p.ctx, &csipb.GetPluginInfoRequest{}, grpc.WaitForReady(true))
	if err != nil || info.Name != csi.DriverName {
		t.Fatalf("plugin info %v %v; stderr: %s", info, err, p.stderr.String())
	}
	node, err := csipb.NewNodeClient(p.conn).NodeGetInfo(p.ctx, &csipb.NodeGetInfoRequest{})
	if err != nil || node.NodeId != "node-1" || node.MaxVolumesPerNode != 1<<30/csi.MinShare {
		t.Errorf("node info %v %v; want %d volumes", node, err, 1<<30/csi.MinShare)
	}
	p.stop(t)
	if _, err := os.Stat(sock); !os.IsNotExist(err) {
		t.Errorf("the socket survives the plugin: %v", err)
	}
}

// csiPlugin is `iser-blk csi` run in-process for a test, and a client connection to it.
type csiPlugin struct {
	ctx    context.Context // the calls' context: ends a minute after the start at the latest
	conn   *grpc.ClientConn
	stderr *syncbuf.Buffer
	cancel context.CancelFunc // ends the plugin (its SIGTERM)
	exited chan int
}

// startCSI runs `iser-blk csi --endpoint unix://SOCK --node-id node-1 ARGS...` until the test
// ends or stop; its calls wait for the socket (grpc.WaitForReady) rather than poll for it.
func startCSI(t *testing.T, sock string, args ...string) *csiPlugin {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	p := &csiPlugin{stderr: new(syncbuf.Buffer), cancel: cancel, exited: make(chan int, 1)}
	argv := append([]string{"csi", "--endpoint", "unix://" + sock, "--node-id", "node-1"}, args...)
	go func() { p.exited <- run(ctx, argv, io.Discard, p.stderr) }()
	conn, err := grpc.NewClient("unix://"+sock, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	callCtx, callCancel := context.WithTimeout(ctx, time.Minute)
	p.ctx, p.conn = callCtx, conn
	t.Cleanup(func() { callCancel(); conn.Close(); cancel() })
	return p
}

// stop ends the plugin and requires it to exit 0.
func (p *csiPlugin) stop(t *testing.T) {
	t.Helper()
	p.cancel()
	if code := <-p.exited; code != exitOK {
		t.Errorf("exit %d after the context ended; stderr: %s", code, p.stderr.String())
	}
}
