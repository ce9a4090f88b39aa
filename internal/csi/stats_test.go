package csi

import (
	"context"
	"os"
	"strings"
	"testing"

	csipb "github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"

	gwstatus "github.com/iser-blk/iser-blk/internal/status"
)

func (r *rig) stats(id, path string) (*csipb.NodeGetVolumeStatsResponse, error) {
	return r.node.NodeGetVolumeStats(context.Background(), &csipb.NodeGetVolumeStatsRequest{VolumeId: id, VolumePath: path})
}

// TestVolumeStats: a filesystem volume reports statfs's bytes and inodes, a block volume its
// size; an unknown volume or path is NotFound.
func TestVolumeStats(t *testing.T) {
	r := newRig(t)
	_, err := r.stats("vol-1", r.staging)
	wantCode(t, "stats of an unstaged volume", err, codes.NotFound)
	_, err = r.stats("", r.staging)
	wantCode(t, "stats without a volume id", err, codes.InvalidArgument)
	_, err = r.stats("vol-1", "")
	wantCode(t, "stats without a path", err, codes.InvalidArgument)

	r.ok("stage", r.stage(r.stageReq("vol-1", mountCap("ext4"))))
	resp, err := r.stats("vol-1", r.staging) // the fake mount leaves the directory on the host's fs
	r.ok("stats", err)
	if len(resp.Usage) != 2 || resp.Usage[0].Unit != csipb.VolumeUsage_BYTES || resp.Usage[0].Total <= 0 ||
		resp.Usage[1].Unit != csipb.VolumeUsage_INODES || resp.Usage[1].Total <= 0 {
		t.Errorf("usage %v", resp.Usage)
	}
	_, err = r.stats("vol-1", r.staging+"-gone")
	wantCode(t, "stats of a missing path", err, codes.NotFound)

	r.ok("stage block", r.stage(&csipb.NodeStageVolumeRequest{VolumeId: "vol-2", StagingTargetPath: r.staging + "-2",
		VolumeCapability: blockCap(), VolumeContext: map[string]string{KeyTargets: testTarget}}))
	if err := os.MkdirAll(r.staging+"-2", 0o750); err != nil {
		t.Fatal(err)
	}
	resp, err = r.stats("vol-2", r.staging+"-2")
	r.ok("block stats", err)
	if len(resp.Usage) != 1 || resp.Usage[0].Total != 1<<30 || resp.Usage[0].Unit != csipb.VolumeUsage_BYTES {
		t.Errorf("block usage %v, want 1 GiB", resp.Usage)
	}
}

func (r *rig) health(id string) ([]*csipb.VolumeHealth_VolumeHealthEntry, error) {
	resp, err := r.node.NodeGetVolumeHealth(context.Background(), &csipb.NodeGetVolumeHealthRequest{VolumeId: id})
	if err != nil {
		return nil, err
	}
	if resp.GetVolumeHealth().GetVolumeId() != id {
		r.t.Errorf("health of %q answered for %q", id, resp.GetVolumeHealth().GetVolumeId())
	}
	return resp.GetVolumeHealth().GetHealthStatuses(), nil
}

// TestVolumeHealth: a serving gateway is healthy (no entry); a fenced, failed, not serving or
// degraded one, or none, is reported with its reason and the gateway's words.
func TestVolumeHealth(t *testing.T) {
	r := newRig(t)
	_, err := r.health("vol-1")
	wantCode(t, "health of an unstaged volume", err, codes.NotFound)
	_, err = r.health("")
	wantCode(t, "health without a volume id", err, codes.InvalidArgument)
	r.ok("stage", r.stage(r.stageReq("vol-1", mountCap("ext4"))))
	if h, err := r.health("vol-1"); err != nil || len(h) != 0 {
		t.Errorf("serving gateway: %v %v, want healthy", h, err)
	}
	name := GatewayName("vol-1")
	const (
		inaccessible = csipb.VolumeHealthErrorType_INACCESSIBLE
		degraded     = csipb.VolumeHealthErrorType_DEGRADED
		dataLoss     = csipb.VolumeHealthErrorType_DATA_LOSS
	)
	type want struct {
		status csipb.VolumeHealthErrorType
		reason string
	}
	for _, tt := range []struct {
		what string
		st   gwstatus.Status
		want []want
		msg  string
	}{
		{"fenced", gwstatus.Status{Gateway: gwstatus.Gateway{State: "failed", Fenced: true, StateReason: gwstatus.FencedReason + "dirty at takeover"}},
			[]want{{inaccessible, ReasonFenced}, {dataLoss, ReasonWritesLost}}, "fenced: dirty at takeover"},
		{"failed", gwstatus.Status{Gateway: gwstatus.Gateway{State: "failed", StateReason: "no path to the target"}},
			[]want{{inaccessible, ReasonFailed}}, "failed: no path to the target"},
		{"recovering", gwstatus.Status{Gateway: gwstatus.Gateway{State: "recovering"}},
			[]want{{inaccessible, ReasonNotServing}}, "not serving: recovering"},
		{"degraded", gwstatus.Status{Gateway: gwstatus.Gateway{State: "ready"}, Paths: []gwstatus.Path{{Portal: "192.0.2.10:3260", State: "up"}, {Portal: "192.0.2.11:3260", State: "down"}}},
			[]want{{degraded, ReasonPathDown}}, "degraded: 1 of 2 paths"},
	} {
		r.gw.statusHook = func(string) (gwstatus.Status, bool, error) { return tt.st, true, nil }
		h, err := r.health("vol-1")
		r.ok(tt.what, err)
		if len(h) != len(tt.want) {
			t.Errorf("%s: %v, want %v", tt.what, h, tt.want)
			continue
		}
		for i, w := range tt.want {
			if h[i].Status != w.status || h[i].Reason != w.reason || !strings.Contains(h[i].Message, tt.msg) {
				t.Errorf("%s: entry %d %v, want %v %s with %q", tt.what, i, h[i], w.status, w.reason, tt.msg)
			}
		}
	}
	r.gw.statusHook = func(string) (gwstatus.Status, bool, error) { return gwstatus.Status{}, true, context.DeadlineExceeded }
	if h, err := r.health("vol-1"); err != nil || len(h) != 1 || h[0].Reason != ReasonNoAnswer {
		t.Errorf("unresponsive gateway: %v %v", h, err)
	}
	r.gw.statusHook = nil
	r.gw.kill(name)
	if h, err := r.health("vol-1"); err != nil || len(h) != 1 || h[0].Reason != ReasonNotRunning || h[0].Status != inaccessible {
		t.Errorf("dead gateway, device waiting: %v %v", h, err)
	}
	r.gw.mu.Lock()
	delete(r.gw.waiting, name)
	r.gw.mu.Unlock()
	if h, err := r.health("vol-1"); err != nil || len(h) != 1 || h[0].Reason != ReasonDeviceGone {
		t.Errorf("dead gateway, device gone: %v %v", h, err)
	}
}
