package iser

import (
	"context"
	"testing"
	"time"

	"github.com/iser-blk/iser-blk/backend/iser/iscsitest"
	"github.com/iser-blk/iser-blk/backend/iser/scsi/scsitest"
)

// TestLUNStatusIdentity: the status' LUN names the target, the LUN number and the WWN (the
// metrics' gateway_info labels), as the URL and VPD page 0x83 give them.
func TestLUNStatusIdentity(t *testing.T) {
	tg, err := iscsitest.Start(scsitest.New(scsitest.Config{}), iscsitest.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { tg.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	d, err := Open(ctx, tg.URL(0), Options{InitiatorName: "iqn.2026-12.io.iser-blk:unit"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.Close() })
	u, err := ParseURL(tg.URL(0))
	if err != nil {
		t.Fatal(err)
	}
	l := d.LUNStatus()
	if l.TargetName != u.IQN || l.TargetName == "" || l.Number != 0 || l.WWN != "naa.60014050deadbeef0000000000000001" {
		t.Fatalf("LUN status names %q LUN %d WWN %q, want %q LUN 0 and the fake LUN's NAA", l.TargetName, l.Number, l.WWN, u.IQN)
	}
}

// TestReplacementStatus: the replacement clock reads the configured timeout, 0 s without a path
// while a path is up, and, once every path is down, at least the time since the loss — what the
// ReplacementTimeoutNear alert compares with the timeout.
func TestReplacementStatus(t *testing.T) {
	s := newFakeSession(scsitest.New(scsitest.Config{}))
	rec := fastRecovery()
	rec.ReplacementTimeout = 100 * time.Millisecond
	d := recoveringDevice(t, rec, s)
	ch := watchAvailability(d)
	if r := d.ReplacementStatus(); r.TimeoutSeconds != 0.1 || r.NoPathSeconds != 0 {
		t.Fatalf("with the path up: %+v", r)
	}
	s.refuse.Store(true)
	down := time.Now()
	s.kill()
	if a := nextAvailability(t, ch); a.serving { // the replacement timeout has passed
		t.Fatalf("report %+v, want not serving", a)
	}
	if r := d.ReplacementStatus(); r.NoPathSeconds < rec.ReplacementTimeout.Seconds() || r.NoPathSeconds > time.Since(down).Seconds() {
		t.Fatalf("every path down for %v: %+v", time.Since(down), r)
	}
	s.refuse.Store(false)
	if a := nextAvailability(t, ch); !a.serving {
		t.Fatalf("after the path came back: %+v", a)
	}
	if r := d.ReplacementStatus(); r.NoPathSeconds != 0 {
		t.Fatalf("with the path back: %+v", r)
	}
}
