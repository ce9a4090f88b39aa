package csi

import (
	"errors"
	"slices"
	"testing"

	csipb "github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
)

// TestShareOf: each share's bounds and overhead fit in budget/volumes; the pool gets a quarter
// within its limits, the cache the rest up to what a lone gateway of the host takes; a budget
// below MinShare per volume says how many volumes it holds.
func TestShareOf(t *testing.T) {
	const gib, mib = int64(1 << 30), int64(1 << 20)
	cases := []struct {
		budget, volumes, limit int64
		want                   MemoryShare
	}{
		{16 * MinShare, 16, 16 * gib, MemoryShare{BufferMemory: MinBufferMemory, CacheSize: MinCacheSize}},
		{4 * gib, 16, 16 * gib, MemoryShare{BufferMemory: 64 * mib, CacheSize: 160 * mib}},
		{8 * gib, 8, 16 * gib, MemoryShare{BufferMemory: 256 * mib, CacheSize: 736 * mib}},
		{64 * gib, 4, 16 * gib, MemoryShare{BufferMemory: MaxBufferMemory, CacheSize: 1 * gib}}, // capped at a lone gateway's
		{4 * gib, 2, 2 * gib, MemoryShare{BufferMemory: 512 * mib, CacheSize: 128 * mib}},       // a sixteenth of a 2 GiB limit
	}
	for _, c := range cases {
		got, err := ShareOf(c.budget, c.volumes, c.limit)
		if err != nil || got != c.want {
			t.Errorf("ShareOf(%d, %d, %d) = %+v, %v; want %+v", c.budget, c.volumes, c.limit, got, err, c.want)
			continue
		}
		if got.Total()*c.volumes > c.budget {
			t.Errorf("ShareOf(%d, %d): %d volumes × %d exceed the budget", c.budget, c.volumes, c.volumes, got.Total())
		}
		if got.BufferMemory%mib != 0 || got.CacheSize%mib != 0 {
			t.Errorf("ShareOf(%d, %d) = %+v: not whole MiB", c.budget, c.volumes, got)
		}
	}
	_, err := ShareOf(1*gib, 16, 16*gib)
	var be *BudgetError
	if !errors.As(err, &be) || be.Fits != 1*gib/MinShare || be.Volumes != 16 {
		t.Fatalf("1 GiB over 16 volumes: %v", err)
	}
	if _, err := ShareOf(1*gib, 0, 16*gib); err == nil {
		t.Fatal("0 volumes accepted")
	}
}

// TestPlanMemory: without --max-volumes the plan lowers the count to what the budget holds; with
// it, a budget too small is an error, not a smaller count.
func TestPlanMemory(t *testing.T) {
	const gib = int64(1 << 30)
	p, err := PlanMemory(1*gib, DefaultMaxVolumes, true, 2*gib)
	if err != nil || p.Volumes != 1*gib/MinShare || p.Share.Total()*p.Volumes > 1*gib {
		t.Fatalf("fit: %+v %v", p, err)
	}
	if p, err = PlanMemory(8*gib, DefaultMaxVolumes, true, 32*gib); err != nil || p.Volumes != DefaultMaxVolumes {
		t.Fatalf("a budget that holds the default: %+v %v", p, err)
	}
	var be *BudgetError
	if _, err := PlanMemory(1*gib, 16, false, 2*gib); !errors.As(err, &be) {
		t.Fatalf("explicit 16 in 1 GiB: %v", err)
	}
	if _, err := PlanMemory(MinShare-1, DefaultMaxVolumes, true, 2*gib); !errors.As(err, &be) || be.Fits != 0 {
		t.Fatalf("a budget below one share: %v", err)
	}
}

// TestShareArgs: a share reaches attach as exact MiB flags; none gives attach's defaults.
func TestShareArgs(t *testing.T) {
	g := &ExecGateways{RunDir: "/run/x", HasUblk: func() bool { return true },
		Memory: MemoryShare{BufferMemory: 64 << 20, CacheSize: 160 << 20}}
	args := g.Args(GatewaySpec{Name: "csi-0000000000000001", Targets: []string{testTargetNorm}})
	i := slices.Index(args, "--buffer-memory")
	j := slices.Index(args, "--cache-size")
	if i < 0 || j < 0 || args[i+1] != "64MiB" || args[j+1] != "160MiB" {
		t.Fatalf("args %q", args)
	}
	g.Memory = MemoryShare{}
	if args := g.Args(GatewaySpec{Name: "csi-0000000000000001", Targets: []string{testTargetNorm}}); slices.Contains(args, "--buffer-memory") || slices.Contains(args, "--cache-size") {
		t.Fatalf("no share, args %q", args)
	}
}

// TestStageBeyondMaxVolumes: a node of two volumes refuses a third with ResourceExhausted and
// writes nothing for it; a repeated stage of a staged volume is not a new one; once one is
// unstaged, the third is admitted.
func TestStageBeyondMaxVolumes(t *testing.T) {
	r := newRig(t)
	r.node.maxVolumes = 2
	stage := func(id string) error {
		req := r.stageReq(id, blockCap())
		req.StagingTargetPath = r.staging + "-" + id
		return r.stage(req)
	}
	r.ok("stage a", stage("a"))
	r.ok("stage b", stage("b"))
	r.ok("stage a again", stage("a"))
	wantCode(t, "stage c", stage("c"), codes.ResourceExhausted)
	if _, ok, err := r.node.records.Load(GatewayName("c")); ok || err != nil {
		t.Fatalf("refused volume left a record (%v)", err)
	}
	if r.gw.starts[GatewayName("c")] != 0 {
		t.Fatal("refused volume started a gateway")
	}
	_, err := r.node.NodeUnstageVolume(t.Context(), &csipb.NodeUnstageVolumeRequest{VolumeId: "a", StagingTargetPath: r.staging + "-a"})
	r.ok("unstage a", err)
	r.ok("stage c after a left", stage("c"))
}

func TestParseBudget(t *testing.T) {
	for in, want := range map[string]int64{"50%": 1 << 30, "100%": 2 << 30, "3GiB": 3 << 30, " 512MiB ": 512 << 20} {
		if got, err := ParseBudget(in, 2<<30); err != nil || got != want {
			t.Errorf("ParseBudget(%q) = %d, %v; want %d", in, got, err, want)
		}
	}
	for _, in := range []string{"0%", "101%", "lots", "0", "", "x%"} {
		if _, err := ParseBudget(in, 2<<30); err == nil {
			t.Errorf("ParseBudget(%q) accepted", in)
		}
	}
	if _, err := ParseBudget("50%", 0); err == nil {
		t.Error("a percentage of unknown memory accepted")
	}
}
