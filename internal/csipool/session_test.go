package csipool

import (
	"context"
	"path/filepath"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"

	"github.com/iser-blk/iser-blk/backend/iser/iscsitest"
	"github.com/iser-blk/iser-blk/backend/iser/scsi/scsitest"
	"github.com/iser-blk/iser-blk/internal/chapcreds"
)

// TestLoginOptions: the pool's secret comes from the environment, never argv; without one the
// LUNs log in without CHAP.
func TestLoginOptions(t *testing.T) {
	const name = "iqn.2026-12.io.iser-blk:unit-login"
	t.Setenv(chapcreds.EnvSecret, "")
	if o := LoginOptions(name); o.InitiatorName != name || o.CHAP != nil {
		t.Fatalf("without a secret: %+v", o)
	}
	t.Setenv(chapcreds.EnvSecret, "pool-secret")
	if o := LoginOptions(name); o.CHAP == nil || o.CHAP.Secret != "pool-secret" || o.CHAP.User != "" {
		t.Fatalf("with %s set: CHAP %+v", chapcreds.EnvSecret, o.CHAP)
	}
}

// TestNewISERProbesThroughBackend: NewISER's controller reads the pool's sizes by logging in to
// the LUN (an in-process target), so GetCapacity counts it.
func TestNewISERProbesThroughBackend(t *testing.T) {
	const size = 4096 * 2048
	tg, err := iscsitest.Start(scsitest.New(scsitest.Config{BlockSize: 4096, Blocks: size / 4096}), iscsitest.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { tg.Close() })
	pool, err := ParsePool([]byte(tg.URL(0) + "\n"))
	if err != nil {
		t.Fatal(err)
	}
	t.Setenv(chapcreds.EnvSecret, "")
	opts := LoginOptions("iqn.2026-12.io.iser-blk:unit-newiser")
	opts.LoginTimeout = 5 * time.Second
	c, err := NewISER(Config{Pool: pool, ClaimsFile: filepath.Join(t.TempDir(), "claims.json")}, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := c.Probe(ctx); err != nil {
		t.Fatal(err)
	}
	resp, err := c.GetCapacity(ctx, &csi.GetCapacityRequest{})
	if err != nil || resp.GetAvailableCapacity() != size {
		t.Fatalf("GetCapacity = %v, %v; want %d bytes", resp, err, size)
	}
}
