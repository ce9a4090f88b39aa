package iser

import (
	"context"
	"testing"
	"time"

	"github.com/iser-blk/iser-blk/backend/iser/iscsitest"
	"github.com/iser-blk/iser-blk/backend/iser/scsi/scsitest"
	"github.com/iser-blk/iser-blk/internal/status"
)

// TestNopRTTRecord: last is the latest ping, mean the average, nothing before the first ping.
func TestNopRTTRecord(t *testing.T) {
	var r nopRTT
	if got := r.status(); got != (status.NopRTT{}) {
		t.Fatalf("before any ping: %+v, want zero", got)
	}
	r.record(time.Millisecond)
	r.record(3 * time.Millisecond)
	want := status.NopRTT{LastSeconds: 0.003, MeanSeconds: 0.002, Samples: 2}
	if got := r.status(); got != want {
		t.Fatalf("after 1 ms and 3 ms: %+v, want %+v", got, want)
	}
	r.record(0)
	if got := r.status(); got.LastSeconds <= 0 || got.Samples != 3 {
		t.Fatalf("an answered ping that took no measurable time: %+v, want a non-zero last", got)
	}
}

// TestNopRoundTripReported: the keepalive's pings to an idle fake target show up in the path's
// status as a non-zero last round trip and a mean consistent with the samples.
func TestNopRoundTripReported(t *testing.T) {
	tg, err := iscsitest.Start(scsitest.New(scsitest.Config{}), iscsitest.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { tg.Close() })
	rec := DefaultRecovery()
	rec.NOPInterval, rec.NOPTimeout = 10*time.Millisecond, 5*time.Second
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	d, err := Open(ctx, tg.URL(0), Options{InitiatorName: "iqn.2026-12.io.iser-blk:unit", Recovery: &rec})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.Close() })
	if got := d.PathsStatus()[0].NopRoundTrip; got.Samples != 0 && got.LastSeconds <= 0 {
		t.Fatalf("a sample without a round trip: %+v", got)
	}
	waitFor(t, "two answered pings", 10*time.Second, func() bool { return d.PathsStatus()[0].NopRoundTrip.Samples >= 2 })
	got := d.PathsStatus()[0].NopRoundTrip
	if got.LastSeconds <= 0 || got.MeanSeconds <= 0 {
		t.Fatalf("round trip after %d pings: %+v, want last and mean > 0", got.Samples, got)
	}
	// Every ping was answered within NOPTimeout, so the mean of them is too.
	if got.MeanSeconds > rec.NOPTimeout.Seconds() || got.LastSeconds > rec.NOPTimeout.Seconds() {
		t.Fatalf("round trip %+v longer than the ping timeout %v that let it pass", got, rec.NOPTimeout)
	}
}
