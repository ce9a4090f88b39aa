package gate

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/iser-blk/iser-blk/backend/memdev"
	"github.com/iser-blk/iser-blk/backend/memdev/memdevtest"
	"github.com/iser-blk/iser-blk/block"
)

// heldDevice blocks every read until release is closed, announcing each arrival on entered.
type heldDevice struct {
	block.Device
	entered chan struct{}
	release chan struct{}
}

func (d *heldDevice) ReadAt(ctx context.Context, p []byte, off int64) error {
	d.entered <- struct{}{}
	<-d.release
	return d.Device.ReadAt(ctx, p, off)
}

func newHeld(t *testing.T) *heldDevice {
	return &heldDevice{Device: memDevice(t, 1<<20), entered: make(chan struct{}, 8), release: make(chan struct{})}
}

// notYet requires that nothing arrives on c for a while: a negative check, so it can only wait.
func notYet[T any](t *testing.T, c <-chan T, what string) {
	t.Helper()
	select {
	case <-c:
		t.Fatalf("%s", what)
	case <-time.After(100 * time.Millisecond):
	}
}

func TestGateCloseWaitsForInflight(t *testing.T) {
	d := newHeld(t)
	g := New(d, Options{})
	readDone := make(chan error, 1)
	go func() { readDone <- g.ReadAt(context.Background(), make([]byte, 512), 0) }()
	<-d.entered
	closed := make(chan error, 1)
	go func() { closed <- g.Shut(context.Background()) }()
	notYet(t, closed, "the gate closed while a request was in flight")
	close(d.release)
	if err := <-readDone; err != nil {
		t.Fatalf("the request in flight: %v", err)
	}
	if err := <-closed; err != nil {
		t.Fatalf("close: %v", err)
	}
	if g.Inflight() != 0 {
		t.Fatalf("%d in flight after the drain", g.Inflight())
	}
}

func TestGateParksLateRequestsUnanswered(t *testing.T) {
	d := newHeld(t)
	close(d.release)
	g := New(d, Options{})
	if err := g.Shut(context.Background()); err != nil {
		t.Fatal(err)
	}
	readDone := make(chan error, 1)
	go func() { readDone <- g.ReadAt(context.Background(), make([]byte, 512), 0) }()
	notYet(t, readDone, "a request that arrived after the gate closed was answered")
	notYet(t, d.entered, "a request that arrived after the gate closed reached the device")
	if g.WriteCached(make([]byte, 512), 0) || g.ReadCached(make([]byte, 512), 0) {
		t.Fatal("a cached fast path went through the closed gate")
	}
	if g.SubmitAt(context.Background(), make([]byte, 512), 0, true, 0, nopCompletion{}) {
		t.Fatal("SubmitAt started a request through the closed gate")
	}
	g.Reopen() // a failed restart: the parked request goes on to the device
	<-d.entered
	if err := <-readDone; err != nil {
		t.Fatalf("the parked request after reopen: %v", err)
	}
}

func TestGateParkedRequestLeavesWithItsContext(t *testing.T) {
	g := New(memDevice(t, 1<<20), Options{})
	if err := g.Shut(context.Background()); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	readDone := make(chan error, 1)
	go func() { readDone <- g.ReadAt(ctx, make([]byte, 512), 0) }()
	cancel() // the frontend tears its server down
	if err := <-readDone; !errors.Is(err, context.Canceled) {
		t.Fatalf("parked request after its context ended: %v", err)
	}
}

func TestGateCloseTimeoutReopens(t *testing.T) {
	d := newHeld(t)
	g := New(d, Options{})
	go func() { _ = g.ReadAt(context.Background(), make([]byte, 512), 0) }()
	<-d.entered
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	if err := g.Shut(ctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("close with a request stuck: %v", err)
	}
	if g.IsShut() {
		t.Fatal("the gate stayed closed after a drain that timed out")
	}
	close(d.release)
	if err := g.WriteAt(context.Background(), make([]byte, 512), 0, 0); err != nil {
		t.Fatalf("write after the reopen: %v", err)
	}
}

// asyncDevice is a Submitter whose requests complete when the test says.
type asyncDevice struct {
	block.Device
	pending chan block.Completion
}

func (d *asyncDevice) SubmitAt(_ context.Context, _ []byte, _ int64, _ bool, _ block.WriteFlags, done block.Completion) bool {
	d.pending <- done
	return true
}
func (d *asyncDevice) Kick() {}

type nopCompletion struct{}

func (nopCompletion) Complete(error) {}

type chanCompletion chan error

func (c chanCompletion) Complete(err error) { c <- err }

func TestGateCountsSubmittedRequestsUntilComplete(t *testing.T) {
	d := &asyncDevice{Device: memDevice(t, 1<<20), pending: make(chan block.Completion, 1)}
	g := New(d, Options{})
	done := make(chanCompletion, 1)
	if !g.SubmitAt(context.Background(), make([]byte, 512), 0, true, 0, done) {
		t.Fatal("SubmitAt through the open gate was not started")
	}
	closed := make(chan error, 1)
	go func() { closed <- g.Shut(context.Background()) }()
	notYet(t, closed, "the gate closed while a submitted request was in flight")
	(<-d.pending).Complete(nil)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if err := <-closed; err != nil {
		t.Fatal(err)
	}
}

func TestGateAllocatesNothing(t *testing.T) {
	d := &asyncDevice{Device: memDevice(t, 1<<20), pending: make(chan block.Completion, 1)}
	g := New(d, Options{})
	buf := make([]byte, 4096)
	ctx := context.Background()
	var done nopCompletion
	allocs := testing.AllocsPerRun(1000, func() {
		if err := g.ReadAt(ctx, buf, 0); err != nil {
			t.Fatal(err)
		}
		if err := g.WriteAt(ctx, buf, 4096, 0); err != nil {
			t.Fatal(err)
		}
		g.SubmitAt(ctx, buf, 0, false, 0, done)
		(<-d.pending).Complete(nil)
	})
	if allocs != 0 {
		t.Fatalf("%v allocations per request through the gate, want 0", allocs)
	}
}

// BenchmarkGate is the cost the gate adds to a request (attach --name): compare with/without.
func BenchmarkGate(b *testing.B) {
	dev, err := memdev.New(1<<20, memdev.Options{})
	if err != nil {
		b.Fatal(err)
	}
	defer dev.Close()
	buf := make([]byte, 4096)
	ctx := context.Background()
	for _, c := range []struct {
		name string
		d    block.Device
	}{{"direct", dev}, {"gated", New(dev, Options{})}} {
		b.Run(c.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if err := c.d.ReadAt(ctx, buf, 0); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

func memDevice(t *testing.T, size int64) block.Device { return memdevtest.New(t, size) }
