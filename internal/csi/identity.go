package csi

import (
	"context"

	csipb "github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/iser-blk/iser-blk/internal/buildinfo"
)

// Identity is the CSI Identity service.
type Identity struct {
	csipb.UnimplementedIdentityServer
	controller bool // a Controller service is served beside the Node service
}

// GetPluginInfo implements csi.IdentityServer: DriverName and iser-blk's version.
func (i *Identity) GetPluginInfo(context.Context, *csipb.GetPluginInfoRequest) (*csipb.GetPluginInfoResponse, error) {
	return &csipb.GetPluginInfoResponse{Name: DriverName, VendorVersion: buildinfo.Version()}, nil
}

// GetPluginCapabilities implements csi.IdentityServer: CONTROLLER_SERVICE only when a
// Controller service is registered.
func (i *Identity) GetPluginCapabilities(context.Context, *csipb.GetPluginCapabilitiesRequest) (*csipb.GetPluginCapabilitiesResponse, error) {
	resp := &csipb.GetPluginCapabilitiesResponse{}
	if i.controller {
		resp.Capabilities = append(resp.Capabilities, &csipb.PluginCapability{Type: &csipb.PluginCapability_Service_{
			Service: &csipb.PluginCapability_Service{Type: csipb.PluginCapability_Service_CONTROLLER_SERVICE}}})
	}
	return resp, nil
}

// Probe implements csi.IdentityServer. The plugin is ready once it serves: it needs no
// connection of its own (each gateway has its sessions).
func (i *Identity) Probe(context.Context, *csipb.ProbeRequest) (*csipb.ProbeResponse, error) {
	return &csipb.ProbeResponse{Ready: wrapperspb.Bool(true)}, nil
}
