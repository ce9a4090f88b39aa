package csi

import (
	"context"
	"errors"
	"io/fs"
	"os"
	"path/filepath"

	csipb "github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
)

// NodePublishVolume implements csi.NodeServer: a bind mount of the staged filesystem onto the
// target directory, or of the device onto the target file for a Block volume (the CO's target
// for a block volume is a file it hands to the container as the device).
func (n *Node) NodePublishVolume(ctx context.Context, req *csipb.NodePublishVolumeRequest) (*csipb.NodePublishVolumeResponse, error) {
	id, target, staging := req.GetVolumeId(), req.GetTargetPath(), req.GetStagingTargetPath()
	switch {
	case id == "":
		return nil, errf(codes.InvalidArgument, "volume id is required")
	case target == "":
		return nil, errf(codes.InvalidArgument, "target path is required")
	case staging == "":
		return nil, errf(codes.InvalidArgument, "staging target path is required (the plugin has STAGE_UNSTAGE_VOLUME)")
	}
	cp, err := parseCapability(req.GetVolumeCapability())
	if err != nil {
		return nil, invalid(err)
	}
	name := GatewayName(id)
	unlock, err := n.locks.tryLock(name)
	if err != nil {
		return nil, err
	}
	defer unlock()
	rec, staged, err := n.records.Load(name)
	switch {
	case err != nil:
		return nil, internalf(ctx, "%v", err)
	case !staged:
		return nil, errf(codes.FailedPrecondition, "volume is not staged on this node")
	case rec.StagingPath != filepath.Clean(staging):
		return nil, errf(codes.FailedPrecondition, "volume is staged at %s, not %s", rec.StagingPath, staging)
	case rec.Block != cp.block:
		return nil, errf(codes.InvalidArgument, "volume was staged as a %s volume", accessType(rec.Block))
	case rec.Block && rec.Device == "":
		return nil, errf(codes.FailedPrecondition, "volume's gateway has no device yet: stage it again")
	}
	mounted, err := n.mounter.Mounted(target)
	if err != nil {
		return nil, internalf(ctx, "%v", err)
	}
	if mounted {
		return &csipb.NodePublishVolumeResponse{}, nil
	}
	readOnly := req.GetReadonly() || cp.readOnly
	if rec.Block {
		if err := makeFile(target); err != nil {
			return nil, internalf(ctx, "target path: %v", err)
		}
		if err := n.mounter.Bind(ctx, rec.Device, target, readOnly, nil); err != nil {
			return nil, internalf(ctx, "bind %s at %s: %v", rec.Device, target, err)
		}
		return &csipb.NodePublishVolumeResponse{}, nil
	}
	if err := os.MkdirAll(target, 0o750); err != nil {
		return nil, internalf(ctx, "target path: %v", err)
	}
	if err := n.mounter.Bind(ctx, rec.StagingPath, target, readOnly, cp.flags); err != nil {
		return nil, internalf(ctx, "bind %s at %s: %v", rec.StagingPath, target, err)
	}
	return &csipb.NodePublishVolumeResponse{}, nil
}

func accessType(block bool) string {
	if block {
		return "block"
	}
	return "filesystem"
}

// makeFile creates the file a block device is bound onto, and its directory.
func makeFile(path string) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o750); err != nil {
		return err
	}
	f, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY, 0o640)
	if err != nil {
		return err
	}
	return f.Close()
}

// NodeUnpublishVolume implements csi.NodeServer: unmount the target and remove it. A target
// that is not mounted or not there is success: the CO may repeat the call.
func (n *Node) NodeUnpublishVolume(ctx context.Context, req *csipb.NodeUnpublishVolumeRequest) (*csipb.NodeUnpublishVolumeResponse, error) {
	id, target := req.GetVolumeId(), req.GetTargetPath()
	switch {
	case id == "":
		return nil, errf(codes.InvalidArgument, "volume id is required")
	case target == "":
		return nil, errf(codes.InvalidArgument, "target path is required")
	}
	unlock, err := n.locks.tryLock(GatewayName(id))
	if err != nil {
		return nil, err
	}
	defer unlock()
	mounted, err := n.mounter.Mounted(target)
	if err != nil {
		return nil, internalf(ctx, "%v", err)
	}
	if mounted {
		if err := n.mounter.Unmount(target); err != nil {
			return nil, internalf(ctx, "%v", err)
		}
	}
	// os.Remove removes a file or an empty directory only: a directory with content is not
	// the CO's empty mount point, and is kept (an error says so).
	if err := os.Remove(target); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return nil, internalf(ctx, "remove the target path: %v", err)
	}
	return &csipb.NodeUnpublishVolumeResponse{}, nil
}
