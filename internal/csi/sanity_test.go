package csi

import (
	"context"
	"path/filepath"
	"sync"
	"testing"

	csipb "github.com/container-storage-interface/spec/lib/go/csi"
	"github.com/kubernetes-csi/csi-test/v5/pkg/sanity"
	"google.golang.org/grpc/codes"
)

// sanityController is the smallest Controller service csi-sanity's Node tests need: they create
// their volumes through CreateVolume. Every volume it makes names the same LUN, which the fake
// gateways never reach; what is under test is the Node service's handling of the calls.
type sanityController struct {
	csipb.UnimplementedControllerServer
	mu   sync.Mutex
	vols map[string]int64 // name → capacity
}

func (c *sanityController) ControllerGetCapabilities(context.Context, *csipb.ControllerGetCapabilitiesRequest) (*csipb.ControllerGetCapabilitiesResponse, error) {
	return &csipb.ControllerGetCapabilitiesResponse{Capabilities: []*csipb.ControllerServiceCapability{{Type: &csipb.ControllerServiceCapability_Rpc{
		Rpc: &csipb.ControllerServiceCapability_RPC{Type: csipb.ControllerServiceCapability_RPC_CREATE_DELETE_VOLUME}}}}}, nil
}

func (c *sanityController) CreateVolume(_ context.Context, req *csipb.CreateVolumeRequest) (*csipb.CreateVolumeResponse, error) {
	if req.GetName() == "" {
		return nil, errf(codes.InvalidArgument, "name is required")
	}
	if len(req.GetVolumeCapabilities()) == 0 {
		return nil, errf(codes.InvalidArgument, "volume capabilities are required")
	}
	for _, vc := range req.GetVolumeCapabilities() {
		if _, err := parseCapability(vc); err != nil {
			return nil, invalid(err)
		}
	}
	size := req.GetCapacityRange().GetRequiredBytes()
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.vols == nil {
		c.vols = map[string]int64{}
	}
	if have, ok := c.vols[req.GetName()]; ok && have != size {
		return nil, errf(codes.AlreadyExists, "volume %s exists with another size", req.GetName())
	}
	c.vols[req.GetName()] = size
	return &csipb.CreateVolumeResponse{Volume: &csipb.Volume{VolumeId: req.GetName(), CapacityBytes: size,
		VolumeContext: map[string]string{KeyTargets: testTarget, KeyCache: "writethrough"}}}, nil
}

func (c *sanityController) DeleteVolume(_ context.Context, req *csipb.DeleteVolumeRequest) (*csipb.DeleteVolumeResponse, error) {
	if req.GetVolumeId() == "" {
		return nil, errf(codes.InvalidArgument, "volume id is required")
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	delete(c.vols, req.GetVolumeId())
	return &csipb.DeleteVolumeResponse{}, nil
}

func (c *sanityController) ValidateVolumeCapabilities(_ context.Context, req *csipb.ValidateVolumeCapabilitiesRequest) (*csipb.ValidateVolumeCapabilitiesResponse, error) {
	switch {
	case req.GetVolumeId() == "":
		return nil, errf(codes.InvalidArgument, "volume id is required")
	case len(req.GetVolumeCapabilities()) == 0:
		return nil, errf(codes.InvalidArgument, "volume capabilities are required")
	}
	c.mu.Lock()
	_, ok := c.vols[req.GetVolumeId()]
	c.mu.Unlock()
	if !ok {
		return nil, errf(codes.NotFound, "no volume %s", req.GetVolumeId())
	}
	for _, vc := range req.GetVolumeCapabilities() {
		if _, err := parseCapability(vc); err != nil {
			return &csipb.ValidateVolumeCapabilitiesResponse{Message: err.Error()}, nil
		}
	}
	return &csipb.ValidateVolumeCapabilitiesResponse{Confirmed: &csipb.ValidateVolumeCapabilitiesResponse_Confirmed{
		VolumeContext: req.GetVolumeContext(), VolumeCapabilities: req.GetVolumeCapabilities(), Parameters: req.GetParameters()}}, nil
}

// TestSanity runs csi-sanity (kubernetes-csi/csi-test) against the plugin's gRPC server, with
// the fake gateways and mounter: the CSI contract of every call (codes, idempotency, paths
// created and removed). Real devices are the VM tier's.
func TestSanity(t *testing.T) {
	conn := serve(t, Options{Controller: &sanityController{}})
	dir := t.TempDir()
	cfg := sanity.NewTestConfig()
	cfg.Address = conn.Target()
	cfg.TargetPath = filepath.Join(dir, "target")
	cfg.StagingPath = filepath.Join(dir, "staging")
	cfg.IdempotentCount = 3
	sanity.Test(t, cfg)
}
