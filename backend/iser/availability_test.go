package iser

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/iser-blk/iser-blk/backend/iser/scsi/scsitest"
	"github.com/iser-blk/iser-blk/block"
)

type availability struct {
	serving bool
	reason  string
	at      time.Time
}

func watchAvailability(d *Device) <-chan availability {
	ch := make(chan availability, 16)
	d.WatchAvailability(func(serving bool, reason string) { ch <- availability{serving, reason, time.Now()} })
	return ch
}

func nextAvailability(t *testing.T, ch <-chan availability) availability {
	t.Helper()
	select {
	case a := <-ch:
		return a
	case <-time.After(10 * time.Second):
		t.Fatal("no availability report within 10 s")
	}
	return availability{}
}

// TestAvailabilityReported: the watcher hears "not serving" once every path has been down for
// the replacement timeout (and I/O fails), not before, and "serving" when a path is back.
func TestAvailabilityReported(t *testing.T) {
	s := newFakeSession(scsitest.New(scsitest.Config{}))
	rec := fastRecovery()
	rec.ReplacementTimeout = 100 * time.Millisecond
	d := recoveringDevice(t, rec, s)
	ch := watchAvailability(d)

	s.refuse.Store(true)
	down := time.Now()
	s.kill()
	a := nextAvailability(t, ch)
	if a.serving || !strings.Contains(a.reason, "replacement timeout") {
		t.Fatalf("first report %+v, want not serving because of the replacement timeout", a)
	}
	if early := a.at.Sub(down); early < rec.ReplacementTimeout {
		t.Fatalf("reported not serving %v after the path went down, before the %v replacement timeout", early, rec.ReplacementTimeout)
	}
	if err := d.ReadAt(context.Background(), make([]byte, 512), 0); !errors.Is(err, block.ErrNoPath) {
		t.Fatalf("read while reported not serving: %v, want ErrNoPath", err)
	}
	s.refuse.Store(false)
	if a := nextAvailability(t, ch); !a.serving {
		t.Fatalf("after the path came back: %+v, want serving", a)
	}
	if err := d.ReadAt(context.Background(), make([]byte, 512), 0); err != nil {
		t.Fatalf("read after the path came back: %v", err)
	}
	select {
	case a := <-ch:
		t.Fatalf("an extra report %+v", a)
	default:
	}
}

// TestAvailabilityOnePathOfTwo: losing one of two paths, or losing every path for less than the
// replacement timeout, is no loss of service: nothing is reported.
func TestAvailabilityOnePathOfTwo(t *testing.T) {
	a, b := newFakeSession(scsitest.New(scsitest.Config{})), newFakeSession(scsitest.New(scsitest.Config{}))
	rec := fastRecovery()
	rec.ReplacementTimeout = time.Hour
	d := recoveringDevice(t, rec, a, b)
	ch := watchAvailability(d)
	a.refuse.Store(true)
	a.kill()
	waitFor(t, "path a down", 5*time.Second, func() bool { return d.PathStats()[0].Downs == 1 })
	b.refuse.Store(true)
	b.kill()
	waitFor(t, "path b down", 5*time.Second, func() bool { return d.PathStats()[1].Downs == 1 })
	b.refuse.Store(false)
	waitFor(t, "path b back", 5*time.Second, func() bool { return d.PathStats()[1].Restores == 1 })
	select {
	case got := <-ch:
		t.Fatalf("reported %+v for an outage shorter than the replacement timeout", got)
	default:
	}
}
