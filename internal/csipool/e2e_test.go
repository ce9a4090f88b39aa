//go:build e2e

package csipool

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/iser-blk/iser-blk/backend/iser"
	"github.com/iser-blk/iser-blk/test/e2e/tgtd"
)

// TestE2EPoolSizesFromTgtd: the real prober reads each pool LUN's size from tgtd (READ
// CAPACITY over a login), a portal that refuses connections is skipped with its reason logged,
// and CreateVolume hands out by the sizes read.
func TestE2EPoolSizesFromTgtd(t *testing.T) {
	small := tgtd.Start(t, tgtd.Options{Size: 32 << 20})
	large := tgtd.Start(t, tgtd.Options{Size: 64 << 20})
	dead := tgtd.ClosedPort(t)
	text := fmt.Sprintf("iscsi://%s/%s/1\niscsi://%s/%s/1\n# nobody listens here\niscsi://%s/iqn.2026-12.io.iser-blk:nobody/1\n",
		small.Portal, small.Name, large.Portal, large.Name, dead)
	pool, err := ParsePool([]byte(text))
	if err != nil {
		t.Fatal(err)
	}
	core, logs := observer.New(zapcore.InfoLevel)
	c, err := New(Config{
		Pool: pool, ClaimsFile: t.TempDir() + "/claims.json", Logger: zap.New(core),
		Prober:  ISERProber{Options: iser.Options{InitiatorName: "iqn.2026-12.io.iser-blk:e2e-csipool", LoginTimeout: 5 * time.Second}},
		NoErase: true, // nothing is deleted here
	})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ctx := context.Background()
	capacity, err := c.GetCapacity(ctx, &csi.GetCapacityRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if capacity.GetAvailableCapacity() != 96<<20 || capacity.GetMaximumVolumeSize().GetValue() != 64<<20 {
		t.Fatalf("capacity %d, largest %d; want 96 MiB and 64 MiB read from tgtd", capacity.GetAvailableCapacity(), capacity.GetMaximumVolumeSize().GetValue())
	}
	if logs.FilterMessage("skipping a pool LUN whose size cannot be read; it is probed again later").Len() != 1 {
		t.Fatalf("the dead portal's LUN was not skipped with a log line: %v", logs.All())
	}
	resp, err := c.CreateVolume(ctx, createReq("big", 40<<20, 0, nil))
	if err != nil {
		t.Fatal(err)
	}
	if v := resp.GetVolume(); v.GetCapacityBytes() != 64<<20 || v.GetVolumeContext()[ContextTarget] != fmt.Sprintf("iscsi://%s/%s/1", large.Portal, large.Name) {
		t.Fatalf("40 MiB went to %+v, want the 64 MiB LUN", v)
	}
	if resp, err := c.CreateVolume(ctx, createReq("small", 0, 0, nil)); err != nil || resp.GetVolume().GetCapacityBytes() != 32<<20 {
		t.Fatalf("the second volume: %v, %v", resp, err)
	}
	if _, err := c.CreateVolume(ctx, createReq("none", 0, 0, nil)); status.Code(err) != codes.ResourceExhausted {
		t.Fatalf("only the dead LUN is left: %v, want ResourceExhausted", err)
	}
}
