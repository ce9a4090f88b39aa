package csi

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	csipb "github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/iser-blk/iser-blk/internal/control"
	"github.com/iser-blk/iser-blk/internal/modes"
)

// rig is a Node over fakes, with its run directory and the CO's paths in a temporary directory.
type rig struct {
	t       *testing.T
	node    *Node
	gw      *fakeGateways
	mnt     *fakeMounter
	runDir  string
	staging string
	target  string
}

func newRig(t *testing.T) *rig {
	dir := t.TempDir()
	r := &rig{t: t, gw: newFakeGateways(), mnt: newFakeMounter(), runDir: filepath.Join(dir, "run"),
		staging: filepath.Join(dir, "staging"), target: filepath.Join(dir, "pods", "target")}
	r.node = NewNode(NodeOptions{NodeID: "node-1", RunDir: r.runDir, Gateways: r.gw, Mounter: r.mnt})
	return r
}

func mountCap(fsType string, flags ...string) *csipb.VolumeCapability {
	return &csipb.VolumeCapability{
		AccessType: &csipb.VolumeCapability_Mount{Mount: &csipb.VolumeCapability_MountVolume{FsType: fsType, MountFlags: flags}},
		AccessMode: &csipb.VolumeCapability_AccessMode{Mode: csipb.VolumeCapability_AccessMode_SINGLE_NODE_WRITER},
	}
}

func blockCap() *csipb.VolumeCapability {
	return &csipb.VolumeCapability{
		AccessType: &csipb.VolumeCapability_Block{Block: &csipb.VolumeCapability_BlockVolume{}},
		AccessMode: &csipb.VolumeCapability_AccessMode{Mode: csipb.VolumeCapability_AccessMode_SINGLE_NODE_WRITER},
	}
}

func (r *rig) stageReq(id string, vc *csipb.VolumeCapability) *csipb.NodeStageVolumeRequest {
	return &csipb.NodeStageVolumeRequest{VolumeId: id, StagingTargetPath: r.staging, VolumeCapability: vc,
		VolumeContext: map[string]string{KeyTargets: testTarget, KeyCache: "writethrough"}}
}

func (r *rig) stage(req *csipb.NodeStageVolumeRequest) error {
	_, err := r.node.NodeStageVolume(context.Background(), req)
	return err
}

func (r *rig) unstage(id string) error {
	_, err := r.node.NodeUnstageVolume(context.Background(), &csipb.NodeUnstageVolumeRequest{VolumeId: id, StagingTargetPath: r.staging})
	return err
}

func (r *rig) publish(id string, vc *csipb.VolumeCapability, readOnly bool) error {
	_, err := r.node.NodePublishVolume(context.Background(), &csipb.NodePublishVolumeRequest{VolumeId: id,
		StagingTargetPath: r.staging, TargetPath: r.target, VolumeCapability: vc, Readonly: readOnly})
	return err
}

func (r *rig) unpublish(id string) error {
	_, err := r.node.NodeUnpublishVolume(context.Background(), &csipb.NodeUnpublishVolumeRequest{VolumeId: id, TargetPath: r.target})
	return err
}

// wantCode fails unless err is a gRPC status with code c.
func wantCode(t *testing.T, what string, err error, c codes.Code) {
	t.Helper()
	if got := status.Code(err); got != c {
		t.Errorf("%s: code %v (%v), want %v", what, got, err, c)
	}
}

func (r *rig) ok(what string, err error) {
	r.t.Helper()
	if err != nil {
		r.t.Fatalf("%s: %v", what, err)
	}
}

// TestStageIdempotent: a filesystem volume staged twice starts one gateway, formats its empty
// device once and mounts it once; the record names the device the gateway serves.
func TestStageIdempotent(t *testing.T) {
	r := newRig(t)
	name := GatewayName("vol-1")
	for i := range 3 {
		r.ok("stage", r.stage(r.stageReq("vol-1", mountCap("xfs", "noatime"))))
		if got := r.gw.count(r.gw.starts, name); got != 1 {
			t.Fatalf("stage #%d: %d gateway starts, want 1", i+1, got)
		}
	}
	if got := r.mnt.formats["/dev/ublkb0"]; got != 1 {
		t.Errorf("device formatted %d times, want 1", got)
	}
	if r.mnt.fs["/dev/ublkb0"] != "xfs" || r.mnt.mounts[r.staging] != "/dev/ublkb0" {
		t.Errorf("fs %q, staging mount %q", r.mnt.fs["/dev/ublkb0"], r.mnt.mounts[r.staging])
	}
	if got := r.mnt.options[r.staging]; len(got) != 1 || got[0] != "noatime" {
		t.Errorf("mount options %q, want [noatime]", got)
	}
	rec, ok, err := r.node.records.Load(name)
	if err != nil || !ok {
		t.Fatalf("record: %v %v", ok, err)
	}
	if rec.Device != "/dev/ublkb0" || rec.SizeBytes != 1<<30 || rec.VolumeID != "vol-1" || rec.Cache != modes.WriteThrough {
		t.Errorf("record %+v", rec)
	}
	spec := r.gw.specs[name]
	if len(spec.Targets) != 1 || spec.Targets[0] != testTargetNorm || spec.Cache != modes.WriteThrough || spec.CHAPUser != "" {
		t.Errorf("gateway spec %+v", spec)
	}
}

// TestStageNeverReformats: a device with a filesystem is mounted as it is (and refused when the
// volume asks for another type); one with a partition table and no filesystem is never formatted.
func TestStageNeverReformats(t *testing.T) {
	r := newRig(t)
	r.mnt.fs["/dev/ublkb0"] = "ext4"
	r.ok("stage ext4 device, no fs asked", r.stage(r.stageReq("vol-1", mountCap(""))))
	if r.mnt.formats["/dev/ublkb0"] != 0 || r.mnt.mounts[r.staging] != "/dev/ublkb0" {
		t.Errorf("formats %d, mount %q", r.mnt.formats["/dev/ublkb0"], r.mnt.mounts[r.staging])
	}

	r = newRig(t)
	r.mnt.fs["/dev/ublkb0"] = "ext4"
	wantCode(t, "stage xfs on an ext4 device", r.stage(r.stageReq("vol-1", mountCap("xfs"))), codes.FailedPrecondition)
	if r.mnt.fs["/dev/ublkb0"] != "ext4" || r.mnt.mounted() != 0 {
		t.Errorf("the ext4 device was touched: fs %q, %d mounts", r.mnt.fs["/dev/ublkb0"], r.mnt.mounted())
	}

	r = newRig(t)
	r.mnt.parted["/dev/ublkb0"] = true
	wantCode(t, "stage a partitioned device", r.stage(r.stageReq("vol-1", mountCap("ext4"))), codes.FailedPrecondition)
	if r.mnt.formats["/dev/ublkb0"] != 0 {
		t.Error("a partitioned device was formatted")
	}

	r = newRig(t)
	r.ok("stage with the default fs", r.stage(r.stageReq("vol-1", mountCap(""))))
	if r.mnt.fs["/dev/ublkb0"] != "ext4" {
		t.Errorf("default fs %q, want ext4", r.mnt.fs["/dev/ublkb0"])
	}
}

// TestStageConflicts: the same volume staged again with another capability or context is
// AlreadyExists, at another path FailedPrecondition; neither touches the first stage.
func TestStageConflicts(t *testing.T) {
	r := newRig(t)
	r.ok("stage", r.stage(r.stageReq("vol-1", mountCap("ext4"))))
	wantCode(t, "restage as xfs", r.stage(r.stageReq("vol-1", mountCap("xfs"))), codes.AlreadyExists)
	req := r.stageReq("vol-1", mountCap("ext4"))
	req.VolumeContext[KeyCache] = "off"
	wantCode(t, "restage with another cache", r.stage(req), codes.AlreadyExists)
	req = r.stageReq("vol-1", mountCap("ext4"))
	req.StagingTargetPath = r.staging + "-2"
	wantCode(t, "restage elsewhere", r.stage(req), codes.FailedPrecondition)
	if r.gw.count(r.gw.starts, GatewayName("vol-1")) != 1 || r.mnt.mounted() != 1 {
		t.Errorf("conflicting stages changed something: %d starts, %d mounts", r.gw.starts[GatewayName("vol-1")], r.mnt.mounted())
	}
}

// TestStageInvalid: every malformed request is InvalidArgument and starts nothing.
func TestStageInvalid(t *testing.T) {
	r := newRig(t)
	for what, mutate := range map[string]func(*csipb.NodeStageVolumeRequest){
		"no volume id":    func(q *csipb.NodeStageVolumeRequest) { q.VolumeId = "" },
		"no staging path": func(q *csipb.NodeStageVolumeRequest) { q.StagingTargetPath = "" },
		"no capability":   func(q *csipb.NodeStageVolumeRequest) { q.VolumeCapability = nil },
		"no access mode":  func(q *csipb.NodeStageVolumeRequest) { q.VolumeCapability.AccessMode = nil },
		"multi-node": func(q *csipb.NodeStageVolumeRequest) {
			q.VolumeCapability.AccessMode.Mode = csipb.VolumeCapability_AccessMode_MULTI_NODE_MULTI_WRITER
		},
		"btrfs":               func(q *csipb.NodeStageVolumeRequest) { q.VolumeCapability = mountCap("btrfs") },
		"mount flag w/ comma": func(q *csipb.NodeStageVolumeRequest) { q.VolumeCapability = mountCap("ext4", "ro,exec") },
		"no access type":      func(q *csipb.NodeStageVolumeRequest) { q.VolumeCapability.AccessType = nil },
		"unknown context key": func(q *csipb.NodeStageVolumeRequest) { q.VolumeContext["portal"] = "192.0.2.1" },
		"no targets":          func(q *csipb.NodeStageVolumeRequest) { delete(q.VolumeContext, KeyTargets) },
		"unknown secret key":  func(q *csipb.NodeStageVolumeRequest) { q.Secrets = map[string]string{"password": "hunter2"} },
		"secret without user": func(q *csipb.NodeStageVolumeRequest) { q.Secrets = map[string]string{SecretCHAPSecret: "hunter2"} },
	} {
		req := r.stageReq("vol-1", mountCap("ext4"))
		mutate(req)
		err := r.stage(req)
		wantCode(t, what, err, codes.InvalidArgument)
		if err != nil && strings.Contains(err.Error(), "hunter2") {
			t.Errorf("%s: the error shows the secret: %v", what, err)
		}
	}
	if len(r.gw.starts) != 0 || r.mnt.mounted() != 0 {
		t.Errorf("invalid requests started %d gateways, %d mounts", len(r.gw.starts), r.mnt.mounted())
	}
	if names, _ := r.node.records.Names(); len(names) != 0 {
		t.Errorf("invalid requests left records %q", names)
	}
}

// TestStageCHAP: the secrets go to 0600 files the gateway is pointed at, never into its spec's
// command line or the record; NodeUnstage removes them.
func TestStageCHAP(t *testing.T) {
	r := newRig(t)
	req := r.stageReq("vol-1", blockCap())
	req.Secrets = map[string]string{SecretCHAPUser: "alice", SecretCHAPSecret: "s3cret-initiator",
		SecretTargetUser: "tgt", SecretTargetSecret: "s3cret-target"}
	r.ok("stage", r.stage(req))
	name := GatewayName("vol-1")
	spec := r.gw.specs[name]
	if spec.CHAPUser != "alice" || spec.TargetUser != "tgt" {
		t.Errorf("spec users %q %q", spec.CHAPUser, spec.TargetUser)
	}
	for file, want := range map[string]string{spec.CHAPSecretFile: "s3cret-initiator\n", spec.TargetSecretFile: "s3cret-target\n"} {
		b, err := os.ReadFile(file)
		if err != nil || string(b) != want {
			t.Errorf("secret file %s: %q %v", file, b, err)
			continue
		}
		if fi, _ := os.Stat(file); fi.Mode().Perm() != 0o600 {
			t.Errorf("secret file %s has mode %v", file, fi.Mode().Perm())
		}
	}
	args := strings.Join((&ExecGateways{RunDir: r.runDir, HasUblk: func() bool { return true }}).Args(spec), " ")
	rec, _ := os.ReadFile(filepath.Join(r.runDir, "csi", name+".volume.json"))
	for _, s := range []string{args, string(rec)} {
		if strings.Contains(s, "s3cret") {
			t.Errorf("a secret is in %s", s)
		}
	}
	if !strings.Contains(args, "--chap-secret-file "+spec.CHAPSecretFile) || !strings.Contains(args, "--target-secret-file "+spec.TargetSecretFile) {
		t.Errorf("attach args %q do not name the secret files", args)
	}
	r.ok("unstage", r.unstage("vol-1"))
	for _, f := range []string{spec.CHAPSecretFile, spec.TargetSecretFile} {
		if _, err := os.Stat(f); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("secret file %s survives the unstage: %v", f, err)
		}
	}
}

// TestUnstage: NodeUnstage unmounts, detaches the gateway and forgets the volume; repeating it,
// or unstaging a volume never staged, succeeds and does nothing.
func TestUnstage(t *testing.T) {
	r := newRig(t)
	r.ok("unstage of nothing", r.unstage("never-staged"))
	r.ok("stage", r.stage(r.stageReq("vol-1", mountCap("ext4"))))
	name := GatewayName("vol-1")
	for range 2 {
		r.ok("unstage", r.unstage("vol-1"))
	}
	if r.mnt.mounted() != 0 || r.gw.count(r.gw.detaches, name) != 1 || r.gw.Waiting(name) {
		t.Errorf("after unstage: %d mounts, %d detaches, waiting %v", r.mnt.mounted(), r.gw.detaches[name], r.gw.Waiting(name))
	}
	if _, ok, _ := r.node.records.Load(name); ok {
		t.Error("the record survives the unstage")
	}
	r.ok("stage again", r.stage(r.stageReq("vol-1", mountCap("ext4"))))
	if r.gw.count(r.gw.starts, name) != 2 || r.mnt.formats["/dev/ublkb1"] != 1 {
		t.Errorf("second stage: %d starts, formats %v", r.gw.starts[name], r.mnt.formats)
	}
}

// TestUnstageWaitingDevice: a gateway that died leaves its device waiting; NodeUnstage starts one
// under the same name to take it over, then detaches it, so no device is left waiting forever.
func TestUnstageWaitingDevice(t *testing.T) {
	r := newRig(t)
	r.ok("stage", r.stage(r.stageReq("vol-1", blockCap())))
	name := GatewayName("vol-1")
	r.gw.kill(name)
	r.ok("unstage", r.unstage("vol-1"))
	if r.gw.count(r.gw.starts, name) != 2 || r.gw.count(r.gw.detaches, name) != 1 || r.gw.Waiting(name) {
		t.Errorf("%d starts, %d detaches, waiting %v; want 2, 1, false", r.gw.starts[name], r.gw.detaches[name], r.gw.Waiting(name))
	}
}

// TestUnstageRefused: a gateway that refuses the detach (its device is held) fails the unstage
// with FailedPrecondition and keeps the record, so a retry can finish.
func TestUnstageRefused(t *testing.T) {
	r := newRig(t)
	r.ok("stage", r.stage(r.stageReq("vol-1", blockCap())))
	r.gw.detachErr = &control.Error{Code: control.CodeRefused, Message: "/dev/ublkb0 is mounted at /mnt"}
	wantCode(t, "unstage of a held device", r.unstage("vol-1"), codes.FailedPrecondition)
	if _, ok, _ := r.node.records.Load(GatewayName("vol-1")); !ok {
		t.Error("the record went with a refused detach")
	}
	r.gw.detachErr = &control.Error{Code: control.CodeBusy, Message: "a detach is already running"}
	wantCode(t, "unstage of a busy gateway", r.unstage("vol-1"), codes.Aborted)
	r.gw.detachErr = nil
	r.ok("unstage", r.unstage("vol-1"))
}

// TestPublishFilesystem: NodePublish bind-mounts the staging mount (read-only when asked), once;
// NodeUnpublish unmounts and removes the target, and succeeds again when repeated.
func TestPublishFilesystem(t *testing.T) {
	r := newRig(t)
	wantCode(t, "publish unstaged", r.publish("vol-1", mountCap("ext4"), false), codes.FailedPrecondition)
	r.ok("stage", r.stage(r.stageReq("vol-1", mountCap("ext4"))))
	for range 2 {
		r.ok("publish", r.publish("vol-1", mountCap("ext4"), true))
	}
	if r.mnt.mounts[r.target] != r.staging || !r.mnt.ro[r.target] {
		t.Errorf("target mount %q ro %v", r.mnt.mounts[r.target], r.mnt.ro[r.target])
	}
	wantCode(t, "publish as block", r.publish("vol-1", blockCap(), false), codes.InvalidArgument)
	for range 2 {
		r.ok("unpublish", r.unpublish("vol-1"))
	}
	if _, ok := r.mnt.mounts[r.target]; ok {
		t.Error("target still mounted")
	}
	if _, err := os.Stat(r.target); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("target still there: %v", err)
	}
	r.ok("unpublish of a never-published volume", r.unpublish("vol-2"))
}

// TestPublishBlock: a block volume is bound onto a file the plugin creates; no filesystem is
// made or mounted at the staging path.
func TestPublishBlock(t *testing.T) {
	r := newRig(t)
	r.ok("stage", r.stage(r.stageReq("vol-1", blockCap())))
	if r.mnt.mounted() != 0 || len(r.mnt.formats) != 0 {
		t.Fatalf("block stage mounted %d, formatted %v", r.mnt.mounted(), r.mnt.formats)
	}
	for range 2 {
		r.ok("publish", r.publish("vol-1", blockCap(), false))
	}
	fi, err := os.Stat(r.target)
	if err != nil || !fi.Mode().IsRegular() {
		t.Fatalf("target %s: %v %v", r.target, fi, err)
	}
	if r.mnt.mounts[r.target] != "/dev/ublkb0" || r.mnt.ro[r.target] {
		t.Errorf("target mount %q ro %v", r.mnt.mounts[r.target], r.mnt.ro[r.target])
	}
	r.ok("unpublish", r.unpublish("vol-1"))
	r.ok("unstage", r.unstage("vol-1"))
	if r.mnt.mounted() != 0 {
		t.Errorf("%d mounts left", r.mnt.mounted())
	}
}

// TestConcurrentCallAborted: a second call for a volume while one runs answers Aborted at once.
func TestConcurrentCallAborted(t *testing.T) {
	r := newRig(t)
	r.gw.inEnsure, r.gw.release = make(chan struct{}), make(chan struct{})
	done := make(chan error, 1)
	go func() { done <- r.stage(r.stageReq("vol-1", mountCap("ext4"))) }()
	<-r.gw.inEnsure // the first stage holds the volume
	wantCode(t, "stage during a stage", r.stage(r.stageReq("vol-1", mountCap("ext4"))), codes.Aborted)
	wantCode(t, "unstage during a stage", r.unstage("vol-1"), codes.Aborted)
	close(r.gw.release)
	r.gw.inEnsure = nil
	if err := <-done; err != nil {
		t.Fatalf("first stage: %v", err)
	}
	r.ok("stage after", r.stage(r.stageReq("vol-1", mountCap("ext4"))))
}

// TestStageFenced: a gateway that comes up fenced fails the stage with the reason and stays
// recorded, so NodeUnstage removes it.
func TestStageFenced(t *testing.T) {
	r := newRig(t)
	r.gw.fenced = true
	err := r.stage(r.stageReq("vol-1", mountCap("ext4")))
	wantCode(t, "stage fenced", err, codes.FailedPrecondition)
	if err == nil || !strings.Contains(err.Error(), "fenced") {
		t.Errorf("error %v does not say fenced", err)
	}
	if r.mnt.mounted() != 0 || len(r.mnt.formats) != 0 {
		t.Error("a fenced device was formatted or mounted")
	}
	r.ok("unstage", r.unstage("vol-1"))
	if r.gw.count(r.gw.detaches, GatewayName("vol-1")) != 1 {
		t.Error("the fenced gateway was not detached")
	}
}

// TestStageGatewayFails: a gateway that does not come up is Internal, or DeadlineExceeded when
// the CO's deadline ended the wait.
func TestStageGatewayFails(t *testing.T) {
	r := newRig(t)
	r.gw.ensureErr = errors.New("gateway exited (exit status 5) before it served")
	wantCode(t, "stage", r.stage(r.stageReq("vol-1", mountCap("ext4"))), codes.Internal)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	r.gw.ensureErr = ctx.Err()
	_, err := r.node.NodeStageVolume(ctx, r.stageReq("vol-1", mountCap("ext4")))
	wantCode(t, "stage, context canceled", err, codes.Canceled)
}
