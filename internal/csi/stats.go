package csi

import (
	"context"
	"errors"
	"io/fs"
	"os"

	csipb "github.com/container-storage-interface/spec/lib/go/csi"
	"golang.org/x/sys/unix"
	"google.golang.org/grpc/codes"
)

// NodeGetVolumeStats implements csi.NodeServer: the filesystem's bytes and inodes (statfs of
// the volume path) or a block volume's size. The gateway's health is NodeGetVolumeHealth's
// (health.go): CSI v1.13 moved the volume condition there.
func (n *Node) NodeGetVolumeStats(ctx context.Context, req *csipb.NodeGetVolumeStatsRequest) (*csipb.NodeGetVolumeStatsResponse, error) {
	id, path := req.GetVolumeId(), req.GetVolumePath()
	switch {
	case id == "":
		return nil, errf(codes.InvalidArgument, "volume id is required")
	case path == "":
		return nil, errf(codes.InvalidArgument, "volume path is required")
	}
	name := GatewayName(id)
	rec, staged, err := n.records.Load(name)
	if err != nil {
		return nil, internalf(ctx, "%v", err)
	}
	if !staged {
		return nil, errf(codes.NotFound, "volume is not staged on this node")
	}
	if _, err := os.Stat(path); errors.Is(err, fs.ErrNotExist) {
		return nil, errf(codes.NotFound, "volume path %s does not exist", path)
	} else if err != nil {
		return nil, internalf(ctx, "volume path: %v", err)
	}
	resp := &csipb.NodeGetVolumeStatsResponse{}
	if rec.Block {
		resp.Usage = []*csipb.VolumeUsage{{Unit: csipb.VolumeUsage_BYTES, Total: rec.SizeBytes}}
		return resp, nil
	}
	var sf unix.Statfs_t
	if err := unix.Statfs(path, &sf); err != nil {
		return nil, internalf(ctx, "statfs %s: %v", path, err)
	}
	bs := int64(sf.Bsize)
	resp.Usage = []*csipb.VolumeUsage{
		{Unit: csipb.VolumeUsage_BYTES, Total: int64(sf.Blocks) * bs, Available: int64(sf.Bavail) * bs, Used: int64(sf.Blocks-sf.Bfree) * bs},
		{Unit: csipb.VolumeUsage_INODES, Total: int64(sf.Files), Available: int64(sf.Ffree), Used: int64(sf.Files - sf.Ffree)},
	}
	return resp, nil
}
