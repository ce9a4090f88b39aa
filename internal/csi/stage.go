package csi

import (
	"context"
	"errors"
	"io/fs"
	"os"
	"path/filepath"

	csipb "github.com/container-storage-interface/spec/lib/go/csi"
	"go.uber.org/zap"
	"google.golang.org/grpc/codes"

	gwstatus "github.com/iser-blk/iser-blk/internal/status"
)

// NodeStageVolume implements csi.NodeServer: record the volume, start (or find) its gateway,
// and for a filesystem volume format the device if it is empty and mount it at the staging path.
// Each step checks what is already done, so a repeated call, or one after a crash of the plugin
// half-way, completes the stage without redoing it.
func (n *Node) NodeStageVolume(ctx context.Context, req *csipb.NodeStageVolumeRequest) (*csipb.NodeStageVolumeResponse, error) {
	id, staging := req.GetVolumeId(), req.GetStagingTargetPath()
	if id == "" {
		return nil, errf(codes.InvalidArgument, "volume id is required")
	}
	if staging == "" {
		return nil, errf(codes.InvalidArgument, "staging target path is required")
	}
	cp, err := parseCapability(req.GetVolumeCapability())
	if err != nil {
		return nil, invalid(err)
	}
	vol, err := ParseVolumeContext(req.GetVolumeContext())
	if err != nil {
		return nil, invalid(err)
	}
	chap, err := ParseSecrets(req.GetSecrets())
	if err != nil {
		return nil, invalid(err)
	}
	name := GatewayName(id)
	unlock, err := n.locks.tryLock(name)
	if err != nil {
		return nil, err
	}
	defer unlock()

	want := Record{VolumeID: id, Name: name, Targets: vol.Targets, Frontend: vol.Frontend, Cache: vol.Cache,
		CHAPUser: chap.User, TargetUser: chap.TargetUser, MutualCHAP: chap.TargetSecret != "",
		Block: cp.block, FSType: cp.fsType, MountFlags: cp.flags, StagingPath: filepath.Clean(staging)}
	if vol.CacheDevSize > 0 {
		if n.cacheDir == "" {
			return nil, errf(codes.FailedPrecondition, "volume context %q asks for a cache device, but this node's plugin has no --cache-dev-dir", KeyCacheDevSize)
		}
		if err := os.MkdirAll(n.cacheDir, 0o700); err != nil {
			return nil, internalf(ctx, "the cache device directory: %v", err)
		}
		want.CacheDev, want.CacheDevSize = filepath.Join(n.cacheDir, name+".cache"), vol.CacheDevSize
	}
	have, staged, err := n.records.Load(name)
	if err != nil {
		return nil, internalf(ctx, "%v", err)
	}
	if staged {
		switch {
		case have.VolumeID != id:
			return nil, errf(codes.Internal, "gateway name %s is taken by volume %q", name, have.VolumeID)
		case have.StagingPath != want.StagingPath:
			return nil, errf(codes.FailedPrecondition, "volume is staged at %s on this node", have.StagingPath)
		case !have.sameVolume(want):
			return nil, errf(codes.AlreadyExists, "volume is staged with another capability or volume context")
		}
		want.Device, want.SizeBytes, want.Served = have.Device, have.SizeBytes, have.Served
		if have.CacheDev != "" {
			want.CacheDev = have.CacheDev // where its log is, whatever --cache-dev-dir says now
		}
	}
	// The secrets and the record go first: a plugin that dies from here on leaves what the
	// healer and NodeUnstage need to find and undo the gateway.
	if err := n.record(ctx, want, chap, !staged); err != nil {
		return nil, err
	}
	st, err := n.gateways.Ensure(ctx, n.spec(want))
	if err != nil {
		return nil, internalf(ctx, "%v", err)
	}
	if h := gwstatus.Check(st); !h.Healthy && (st.Gateway.Fenced || st.Gateway.State == "failed") {
		// Left staged: NodeUnstage detaches it, and NodeGetVolumeHealth says why meanwhile.
		return nil, errf(codes.FailedPrecondition, "gateway %s does not serve: %s", name, h.Why)
	}
	device := st.Gateway.FrontendPath
	if device == "" {
		return nil, errf(codes.Internal, "gateway %s serves no device", name)
	}
	size, served := want.SizeBytes, want.Served
	if st.LUN != nil {
		size = int64(st.LUN.SizeBytes)
	}
	if st.Gateway.FrontendKind.KernelDevice() {
		served = st.Gateway.FrontendKind
	}
	if want.Device != device || want.SizeBytes != size || want.Served != served {
		want.Device, want.SizeBytes, want.Served = device, size, served
		if err := n.records.Save(want); err != nil {
			return nil, internalf(ctx, "%v", err)
		}
	}
	if cp.block {
		return &csipb.NodeStageVolumeResponse{}, nil // NodePublish binds the device itself
	}
	if err := n.mountStaging(ctx, want, cp, device); err != nil {
		return nil, err
	}
	return &csipb.NodeStageVolumeResponse{}, nil
}

// record saves r's secrets and r. A volume that is not staged yet (admit) is refused as
// ResourceExhausted, with nothing written, when maxVolumes are: each gateway was given its share of
// the memory budget for at most that many, and NodeGetInfo told the CO so.
func (n *Node) record(ctx context.Context, r Record, chap CHAP, admit bool) error {
	if admit {
		n.admit.Lock()
		defer n.admit.Unlock()
		if n.maxVolumes > 0 {
			names, err := n.records.Names()
			if err != nil {
				return internalf(ctx, "%v", err)
			}
			if int64(len(names)) >= n.maxVolumes {
				return errf(codes.ResourceExhausted, "this node has %d volumes staged, its most (--max-volumes)", len(names))
			}
		}
	}
	if err := n.saveSecrets(r.Name, chap); err != nil {
		return internalf(ctx, "%v", err)
	}
	if err := n.records.Save(r); err != nil {
		return internalf(ctx, "%v", err)
	}
	return nil
}

// mountStaging mounts device's filesystem at the staging path, formatting the device first
// only when it holds neither a filesystem nor a partition table (SafeFormatAndMount).
func (n *Node) mountStaging(ctx context.Context, r Record, cp capability, device string) error {
	mounted, err := n.mounter.Mounted(r.StagingPath)
	if err != nil {
		return internalf(ctx, "%v", err)
	}
	if mounted {
		return nil
	}
	if err := os.MkdirAll(r.StagingPath, 0o750); err != nil {
		return internalf(ctx, "staging path: %v", err)
	}
	fsType, partitioned, err := n.mounter.Probe(ctx, device)
	if err != nil {
		return internalf(ctx, "probe %s: %v", device, err)
	}
	switch {
	case fsType == "" && partitioned:
		return errf(codes.FailedPrecondition, "%s holds a partition table and no filesystem: not formatting it", device)
	case fsType == "":
		fsType = r.FSType
		if fsType == "" {
			fsType = SupportedFSTypes[0]
		}
		n.log.Info("formatting an empty device", zap.String("volume_id", r.VolumeID), zap.String("device", device), zap.String("fs_type", fsType))
		if err := n.mounter.Format(ctx, device, fsType); err != nil {
			return internalf(ctx, "format %s: %v", device, err)
		}
	case r.FSType != "" && fsType != r.FSType:
		return errf(codes.FailedPrecondition, "%s holds a %s filesystem, the volume asks for %s: not reformatting it", device, fsType, r.FSType)
	}
	opts := cp.flags
	if cp.readOnly {
		opts = append(append([]string(nil), opts...), "ro")
	}
	if err := n.mounter.Mount(ctx, device, r.StagingPath, fsType, opts); err != nil {
		return internalf(ctx, "mount %s at %s: %v", device, r.StagingPath, err)
	}
	return nil
}

// saveSecrets writes chap's secrets into name's secret files, and removes one no longer given.
func (n *Node) saveSecrets(name string, chap CHAP) error {
	for which, secret := range map[string]string{SecretCHAPSecret: chap.Secret, SecretTargetSecret: chap.TargetSecret} {
		if secret == "" {
			if err := os.Remove(n.records.SecretFile(name, which)); err != nil && !os.IsNotExist(err) {
				return err
			}
			continue
		}
		if err := n.records.SaveSecret(name, which, secret); err != nil {
			return err
		}
	}
	return nil
}

// spec is the gateway of record r.
func (n *Node) spec(r Record) GatewaySpec {
	s := GatewaySpec{Name: r.Name, Targets: r.Targets, Frontend: r.Frontend, Cache: r.Cache,
		CacheDev: r.CacheDev, CacheDevSize: r.CacheDevSize}
	if r.Served != "" {
		s.Frontend = r.Served // the kind the waiting device is
	}
	if r.CHAPUser != "" {
		s.CHAPUser, s.CHAPSecretFile = r.CHAPUser, n.records.SecretFile(r.Name, SecretCHAPSecret)
	}
	if r.MutualCHAP {
		s.TargetUser, s.TargetSecretFile = r.TargetUser, n.records.SecretFile(r.Name, SecretTargetSecret)
	}
	return s
}

// cacheDevLeft says whether r's cache device file is still there when no gateway ran to detach:
// its log may hold acknowledged writes the target lacks (the gateway died, and its device did
// not wait for a successor), so a gateway is started to recover and write it back.
func cacheDevLeft(r Record) bool {
	if r.CacheDev == "" {
		return false
	}
	_, err := os.Stat(r.CacheDev)
	return err == nil
}

// NodeUnstageVolume implements csi.NodeServer: unmount the staging path, detach the gateway
// (its write-back, then the device's removal) and forget the volume. Nothing staged is success.
func (n *Node) NodeUnstageVolume(ctx context.Context, req *csipb.NodeUnstageVolumeRequest) (*csipb.NodeUnstageVolumeResponse, error) {
	id, staging := req.GetVolumeId(), req.GetStagingTargetPath()
	if id == "" {
		return nil, errf(codes.InvalidArgument, "volume id is required")
	}
	if staging == "" {
		return nil, errf(codes.InvalidArgument, "staging target path is required")
	}
	name := GatewayName(id)
	unlock, err := n.locks.tryLock(name)
	if err != nil {
		return nil, err
	}
	defer unlock()
	rec, staged, err := n.records.Load(name)
	if err != nil {
		return nil, internalf(ctx, "%v", err)
	}
	if mounted, err := n.mounter.Mounted(staging); err != nil {
		return nil, internalf(ctx, "%v", err)
	} else if mounted {
		if err := n.mounter.Unmount(staging); err != nil {
			return nil, internalf(ctx, "%v", err)
		}
	}
	// The gateway is detached by name even without a record: the name is the volume's.
	_, err = n.gateways.Status(ctx, name)
	ran := err == nil
	if err := n.gateways.Detach(ctx, name); err != nil {
		return nil, detachErr(ctx, name, err)
	}
	if n.gateways.Waiting(name) || (staged && !ran && cacheDevLeft(rec)) {
		// The gateway died and its device waits for a successor (a ublk device waits forever),
		// or left a cache device whose log the target may lack: one is started to take it over
		// (recovering the log), only to detach it (writing the log back).
		if !staged {
			return nil, errf(codes.Internal, "the device of gateway %s waits for a successor, but the volume's record is gone: "+
				"run `iser-blk attach --name %s` with its target and detach it", name, name)
		}
		n.log.Info("starting the gateway to remove its waiting device", zap.String("volume_id", id), zap.String("name", name))
		if _, err := n.gateways.Ensure(ctx, n.spec(rec)); err != nil {
			return nil, errf(codes.Unavailable, "the device of gateway %s waits for a successor that could not start: %v", name, err)
		}
		if err := n.gateways.Detach(ctx, name); err != nil {
			return nil, detachErr(ctx, name, err)
		}
	}
	// A detach wrote the cache device's log back: its file goes with the volume.
	if staged && rec.CacheDev != "" {
		if err := os.Remove(rec.CacheDev); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return nil, internalf(ctx, "removing the cache device: %v", err)
		}
	}
	if err := n.records.Remove(name); err != nil {
		return nil, internalf(ctx, "%v", err)
	}
	return &csipb.NodeUnstageVolumeResponse{}, nil
}
