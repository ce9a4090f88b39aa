package csi

import (
	"context"
	"net"
	"os"
	"path/filepath"
	"testing"

	csipb "github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/iser-blk/iser-blk/internal/buildinfo"
)

// fakeController is the Controller service a --pool build registers.
type fakeController struct {
	csipb.UnimplementedControllerServer
}

func (fakeController) ControllerGetCapabilities(context.Context, *csipb.ControllerGetCapabilitiesRequest) (*csipb.ControllerGetCapabilitiesResponse, error) {
	return &csipb.ControllerGetCapabilitiesResponse{Capabilities: []*csipb.ControllerServiceCapability{{Type: &csipb.ControllerServiceCapability_Rpc{
		Rpc: &csipb.ControllerServiceCapability_RPC{Type: csipb.ControllerServiceCapability_RPC_CREATE_DELETE_VOLUME}}}}}, nil
}

// serve runs Serve in the background with fakes and returns a client connection; the server is
// stopped (and its return checked) at the test's end.
func serve(t *testing.T, o Options) *grpc.ClientConn {
	t.Helper()
	dir := t.TempDir()
	sock := filepath.Join(dir, "csi.sock")
	o.Endpoint = "unix://" + sock
	o.NodeID = "node-1"
	if o.RunDir == "" {
		o.RunDir = filepath.Join(dir, "run")
	}
	if o.Gateways == nil {
		o.Gateways = newFakeGateways()
	}
	if o.Mounter == nil {
		o.Mounter = newFakeMounter()
	}
	listening := make(chan string, 1)
	o.Listening = func(p string) { listening <- p }
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- Serve(ctx, o) }()
	select {
	case p := <-listening:
		if p != sock {
			t.Errorf("listening on %s, want %s", p, sock)
		}
	case err := <-done:
		cancel()
		t.Fatalf("Serve: %v", err)
	}
	conn, err := grpc.NewClient("unix://"+sock, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		conn.Close()
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Serve after cancel: %v", err)
		}
		if _, err := os.Stat(sock); !os.IsNotExist(err) {
			t.Errorf("the socket survives the stop: %v", err)
		}
	})
	if fi, err := os.Stat(sock); err != nil {
		t.Error(err)
	} else if fi.Mode().Perm() != 0o600 {
		t.Errorf("socket mode %v, want 0600", fi.Mode().Perm())
	}
	return conn
}

// TestIdentity: the plugin's name and version, ready, and CONTROLLER_SERVICE only with a
// Controller service.
func TestIdentity(t *testing.T) {
	ctx := context.Background()
	id := csipb.NewIdentityClient(serve(t, Options{}))
	info, err := id.GetPluginInfo(ctx, &csipb.GetPluginInfoRequest{})
	if err != nil || info.Name != DriverName || info.VendorVersion != buildinfo.Version() {
		t.Errorf("plugin info %v %v", info, err)
	}
	probe, err := id.Probe(ctx, &csipb.ProbeRequest{})
	if err != nil || !probe.GetReady().GetValue() {
		t.Errorf("probe %v %v", probe, err)
	}
	caps, err := id.GetPluginCapabilities(ctx, &csipb.GetPluginCapabilitiesRequest{})
	if err != nil || len(caps.Capabilities) != 0 {
		t.Errorf("capabilities without a controller: %v %v", caps, err)
	}
	_, err = csipb.NewControllerClient(serve(t, Options{})).ControllerGetCapabilities(ctx, &csipb.ControllerGetCapabilitiesRequest{})
	wantCode(t, "controller call without a controller", err, codes.Unimplemented)

	conn := serve(t, Options{Controller: &fakeController{}})
	caps, err = csipb.NewIdentityClient(conn).GetPluginCapabilities(ctx, &csipb.GetPluginCapabilitiesRequest{})
	if err != nil || len(caps.Capabilities) != 1 || caps.Capabilities[0].GetService().GetType() != csipb.PluginCapability_Service_CONTROLLER_SERVICE {
		t.Errorf("capabilities with a controller: %v %v", caps, err)
	}
	ccaps, err := csipb.NewControllerClient(conn).ControllerGetCapabilities(ctx, &csipb.ControllerGetCapabilitiesRequest{})
	if err != nil || len(ccaps.GetCapabilities()) != 1 {
		t.Errorf("the controller's capabilities: %v %v", ccaps, err)
	}
}

// TestNodeOverGRPC: capabilities and info, and a stage/unstage round trip through the server.
func TestNodeOverGRPC(t *testing.T) {
	ctx := context.Background()
	gw := newFakeGateways()
	node := csipb.NewNodeClient(serve(t, Options{Gateways: gw}))
	caps, err := node.NodeGetCapabilities(ctx, &csipb.NodeGetCapabilitiesRequest{})
	if err != nil {
		t.Fatal(err)
	}
	got := map[csipb.NodeServiceCapability_RPC_Type]bool{}
	for _, c := range caps.Capabilities {
		got[c.GetRpc().GetType()] = true
	}
	for _, want := range []csipb.NodeServiceCapability_RPC_Type{csipb.NodeServiceCapability_RPC_STAGE_UNSTAGE_VOLUME,
		csipb.NodeServiceCapability_RPC_GET_VOLUME_STATS, csipb.NodeServiceCapability_RPC_GET_VOLUME_HEALTH} {
		if !got[want] {
			t.Errorf("capability %v missing from %v", want, caps.Capabilities)
		}
	}
	if len(got) != 3 {
		t.Errorf("capabilities %v, want 3", caps.Capabilities)
	}
	info, err := node.NodeGetInfo(ctx, &csipb.NodeGetInfoRequest{})
	if err != nil || info.NodeId != "node-1" || info.MaxVolumesPerNode != 0 {
		t.Errorf("node info %v %v", info, err)
	}
	staging := filepath.Join(t.TempDir(), "staging")
	_, err = node.NodeStageVolume(ctx, &csipb.NodeStageVolumeRequest{VolumeId: "vol-1", StagingTargetPath: staging,
		VolumeCapability: blockCap(), VolumeContext: map[string]string{KeyTargets: testTarget},
		Secrets: map[string]string{SecretCHAPUser: "alice", SecretCHAPSecret: "pw"}})
	if err != nil {
		t.Fatalf("stage: %v", err)
	}
	_, err = node.NodeStageVolume(ctx, &csipb.NodeStageVolumeRequest{VolumeId: "vol-1", StagingTargetPath: staging,
		VolumeCapability: blockCap(), VolumeContext: map[string]string{"bogus": "1"}})
	wantCode(t, "stage with an unknown key", err, codes.InvalidArgument)
	if _, err := node.NodeUnstageVolume(ctx, &csipb.NodeUnstageVolumeRequest{VolumeId: "vol-1", StagingTargetPath: staging}); err != nil {
		t.Fatalf("unstage: %v", err)
	}
	if gw.count(gw.starts, GatewayName("vol-1")) != 1 || gw.count(gw.detaches, GatewayName("vol-1")) != 1 {
		t.Errorf("starts %v detaches %v", gw.starts, gw.detaches)
	}
}

// TestServeStaleSocket: a socket file nobody listens on is replaced; a live plugin's socket, or
// a file that is no socket, is not.
func TestServeStaleSocket(t *testing.T) {
	dir := t.TempDir()
	sock := filepath.Join(dir, "csi.sock")
	l, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	l.(*net.UnixListener).SetUnlinkOnClose(false)
	l.Close() // a dead plugin's socket
	o := Options{Endpoint: "unix://" + sock, NodeID: "n", RunDir: filepath.Join(dir, "run"), Gateways: newFakeGateways(), Mounter: newFakeMounter()}
	ctx, cancel := context.WithCancel(context.Background())
	listening := make(chan struct{})
	o.Listening = func(string) { close(listening) }
	done := make(chan error, 1)
	go func() { done <- Serve(ctx, o) }()
	select {
	case <-listening:
	case err := <-done:
		t.Fatalf("Serve over a stale socket: %v", err)
	}
	o2 := o
	o2.Listening = nil
	if err := Serve(context.Background(), o2); err == nil {
		t.Error("a second plugin took a live plugin's socket")
	}
	cancel()
	if err := <-done; err != nil {
		t.Errorf("Serve: %v", err)
	}
	file := filepath.Join(dir, "file")
	if err := os.WriteFile(file, []byte("data"), 0o600); err != nil {
		t.Fatal(err)
	}
	o.Endpoint, o.Listening = "unix://"+file, nil
	if err := Serve(context.Background(), o); err == nil {
		t.Error("Serve replaced a regular file")
	}
	if b, _ := os.ReadFile(file); string(b) != "data" {
		t.Errorf("the file was touched: %q", b)
	}
}

// TestSocketPath: unix:// endpoints only, absolute.
func TestSocketPath(t *testing.T) {
	for in, want := range map[string]string{"unix:///csi/csi.sock": "/csi/csi.sock", "unix:/csi/csi.sock": "/csi/csi.sock", "unix:///a/../b.sock": "/b.sock"} {
		if got, err := SocketPath(in); err != nil || got != want {
			t.Errorf("%s: %q %v, want %q", in, got, err, want)
		}
	}
	for _, in := range []string{"", "/csi/csi.sock", "tcp://127.0.0.1:10000", "unix://csi.sock", "unix:csi.sock", "unix:///csi.sock?x=1"} {
		if got, err := SocketPath(in); err == nil {
			t.Errorf("%q accepted as %q", in, got)
		}
	}
}
