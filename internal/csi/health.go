package csi

import (
	"context"
	"errors"

	csipb "github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"

	"github.com/iser-blk/iser-blk/internal/control"
	gwstatus "github.com/iser-blk/iser-blk/internal/status"
)

// Health reasons: CamelCase, as the spec asks, one per condition the gateway reports.
const (
	ReasonFenced     = "Fenced"            // the takeover fenced the device: every I/O fails
	ReasonWritesLost = "AckedWritesLost"   // ...because acknowledged writes may be lost
	ReasonFailed     = "GatewayFailed"     // no path past the replacement timeout, or a failed flush
	ReasonNotServing = "GatewayNotServing" // starting, recovering, restarting, stopping: I/O waits
	ReasonPathDown   = "PathDown"          // serving, but a path (portal) is down or recovering
	ReasonNotRunning = "GatewayNotRunning" // no gateway; its device waits for a successor
	ReasonDeviceGone = "DeviceGone"        // no gateway and no device
	ReasonNoAnswer   = "GatewayNoAnswer"   // the gateway holds its name but does not answer
)

// NodeGetVolumeHealth implements csi.NodeServer (GET_VOLUME_HEALTH, CSI v1.13's successor of
// VOLUME_CONDITION): the gateway's health as status.Check judges it, each adverse condition
// one entry with its reason, and the gateway's own words as the message. No entry: healthy.
func (n *Node) NodeGetVolumeHealth(ctx context.Context, req *csipb.NodeGetVolumeHealthRequest) (*csipb.NodeGetVolumeHealthResponse, error) {
	id := req.GetVolumeId()
	if id == "" {
		return nil, errf(codes.InvalidArgument, "volume id is required")
	}
	name := GatewayName(id)
	_, staged, err := n.records.Load(name)
	if err != nil {
		return nil, internalf(ctx, "%v", err)
	}
	if !staged {
		return nil, errf(codes.NotFound, "volume is not staged on this node")
	}
	return &csipb.NodeGetVolumeHealthResponse{VolumeHealth: &csipb.VolumeHealth{VolumeId: id, HealthStatuses: n.health(ctx, name)}}, nil
}

func entry(t csipb.VolumeHealthErrorType, reason, msg string) *csipb.VolumeHealth_VolumeHealthEntry {
	return &csipb.VolumeHealth_VolumeHealthEntry{Status: t, Reason: reason, Message: msg}
}

// health is the adverse conditions of gateway name, none when it serves with every path up.
func (n *Node) health(ctx context.Context, name string) []*csipb.VolumeHealth_VolumeHealthEntry {
	const (
		inaccessible = csipb.VolumeHealthErrorType_INACCESSIBLE
		degraded     = csipb.VolumeHealthErrorType_DEGRADED
		dataLoss     = csipb.VolumeHealthErrorType_DATA_LOSS
	)
	st, err := n.gateways.Status(ctx, name)
	switch {
	case errors.Is(err, control.ErrUnknownGateway) && n.gateways.Waiting(name):
		return []*csipb.VolumeHealth_VolumeHealthEntry{entry(inaccessible, ReasonNotRunning,
			"the gateway is not running; its device waits for a successor (I/O waits)")}
	case errors.Is(err, control.ErrUnknownGateway):
		return []*csipb.VolumeHealth_VolumeHealthEntry{entry(inaccessible, ReasonDeviceGone,
			"the gateway is not running and its device is gone")}
	case err != nil:
		return []*csipb.VolumeHealth_VolumeHealthEntry{entry(inaccessible, ReasonNoAnswer, "the gateway does not answer: "+err.Error())}
	}
	h := gwstatus.Check(st)
	g := st.Gateway
	switch {
	case h.Healthy:
		return nil
	case g.Fenced:
		// The device fails every I/O, and the reason it does is that data may be missing.
		return []*csipb.VolumeHealth_VolumeHealthEntry{entry(inaccessible, ReasonFenced, h.Why), entry(dataLoss, ReasonWritesLost, h.Why)}
	case g.State == "failed":
		return []*csipb.VolumeHealth_VolumeHealthEntry{entry(inaccessible, ReasonFailed, h.Why)}
	case g.State != "ready":
		return []*csipb.VolumeHealth_VolumeHealthEntry{entry(inaccessible, ReasonNotServing, h.Why)}
	}
	return []*csipb.VolumeHealth_VolumeHealthEntry{entry(degraded, ReasonPathDown, h.Why)}
}
