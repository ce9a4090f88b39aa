package csi

import (
	"context"
	"errors"
	"testing"

	"github.com/iser-blk/iser-blk/internal/modes"
	gwstatus "github.com/iser-blk/iser-blk/internal/status"
)

// TestHeal: a new plugin over the same run directory adopts the running gateways, starts again
// the ones whose devices wait (with the recorded spec), and leaves a volume whose gateway and
// device are both gone to the CO.
func TestHeal(t *testing.T) {
	r := newRig(t)
	req := r.stageReq("running", mountCap("ext4"))
	r.ok("stage running", r.stage(req))
	req = r.stageReq("died", blockCap())
	req.StagingTargetPath += "-died"
	req.Secrets = map[string]string{SecretCHAPUser: "alice", SecretCHAPSecret: "pw"}
	r.ok("stage died", r.stage(req))
	req = r.stageReq("gone", blockCap())
	req.StagingTargetPath += "-gone"
	r.ok("stage gone", r.stage(req))
	died, gone := GatewayName("died"), GatewayName("gone")
	r.gw.kill(died)
	r.gw.kill(gone)
	r.gw.mu.Lock()
	delete(r.gw.waiting, gone) // its device was removed by hand
	r.gw.mu.Unlock()
	before := r.gw.specs[died]

	// the plugin restarts: a new Node over the same run directory and the same gateways
	n := NewNode(NodeOptions{NodeID: "node-1", RunDir: r.runDir, Gateways: r.gw, Mounter: r.mnt})
	res, err := n.Heal(context.Background())
	if err != nil {
		t.Fatalf("heal: %v", err)
	}
	if res != (HealResult{Adopted: 1, Restarted: 1}) {
		t.Errorf("heal %+v, want 1 adopted, 1 restarted", res)
	}
	if r.gw.count(r.gw.starts, died) != 2 || r.gw.count(r.gw.starts, GatewayName("running")) != 1 || r.gw.count(r.gw.starts, gone) != 1 {
		t.Errorf("starts %v", r.gw.starts)
	}
	after := r.gw.specs[died]
	if after.Frontend != modes.Ublk {
		t.Errorf("restarted with frontend %q, want the ublk the device is", after.Frontend)
	}
	if after.CHAPUser != "alice" || after.CHAPSecretFile != before.CHAPSecretFile || after.Cache != before.Cache || after.Targets[0] != before.Targets[0] {
		t.Errorf("restarted with %+v, staged with %+v", after, before)
	}

	r.gw.ensureErr = errors.New("target unreachable")
	r.gw.kill(died)
	res, err = n.Heal(context.Background())
	if err == nil || res.Failed != 1 {
		t.Errorf("heal with a gateway that cannot start: %+v, %v", res, err)
	}
}

// TestHealLeavesUnresponsive: a gateway that holds its name but does not answer is neither
// adopted nor started a second time.
func TestHealLeavesUnresponsive(t *testing.T) {
	r := newRig(t)
	r.ok("stage", r.stage(r.stageReq("vol-1", blockCap())))
	r.gw.statusHook = func(string) (gwstatus.Status, bool, error) {
		return gwstatus.Status{}, true, context.DeadlineExceeded
	}
	res, err := r.node.Heal(context.Background())
	if err == nil || res.Failed != 1 || r.gw.count(r.gw.starts, GatewayName("vol-1")) != 1 {
		t.Errorf("heal %+v %v, starts %d", res, err, r.gw.starts[GatewayName("vol-1")])
	}
}
