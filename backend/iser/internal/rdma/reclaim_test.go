package rdma

import (
	"slices"
	"testing"
)

// reclaimRig is a connection's send side without a device: descriptors, the free list, and a
// fake send queue that completes in post order and reports only signalled sends.
type reclaimRig struct {
	t      *testing.T
	r      *sendReclaim
	free   chan int32
	posted []SendWR // posted, not yet completed by the fake device, in order
}

func newReclaimRig(t *testing.T, descriptors int) *reclaimRig {
	g := &reclaimRig{t: t, r: newSendReclaim(descriptors), free: make(chan int32, descriptors)}
	for i := range descriptors {
		g.free <- int32(i)
	}
	return g
}

// send takes a free descriptor and posts one send on it; false when none is free.
func (g *reclaimRig) send() bool {
	select {
	case s := <-g.free:
		batch := []SendWR{{ID: wrSend | uint64(s)}}
		g.r.post(batch, len(g.free))
		g.posted = append(g.posted, batch...)
		return true
	default:
		return false
	}
}

// complete lets the device complete every posted send: only the signalled ones report.
func (g *reclaimRig) complete() {
	for _, w := range g.posted {
		if w.Signaled {
			g.r.completed(int32(w.ID&wrMask), g.free)
		}
	}
	g.posted = g.posted[:0]
}

// flush completes every posted send in error, as a QP in the error state does: each reports.
func (g *reclaimRig) flush() {
	for _, w := range g.posted {
		g.r.completed(int32(w.ID&wrMask), g.free)
	}
	g.posted = g.posted[:0]
}

// With descriptors to spare, one send in signalEvery asks for a completion, and that completion
// gives back its descriptor and those of the unsignalled sends before it.
func TestReclaimSignalsOneSendInSixteen(t *testing.T) {
	g := newReclaimRig(t, 144)
	signalled := 0
	for range 64 {
		if !g.send() {
			t.Fatal("no free descriptor with 144 and at most 64 in flight")
		}
		if g.posted[len(g.posted)-1].Signaled {
			signalled++
		}
		if len(g.posted) == 32 {
			g.complete()
			if g.r.n != 0 {
				t.Fatalf("%d descriptors still outstanding after the device completed every send", g.r.n)
			}
		}
	}
	if signalled != 64/signalEvery {
		t.Fatalf("%d of 64 sends signalled, want %d", signalled, 64/signalEvery)
	}
}

// However the sends go, a sender that finds no free descriptor always has a signalled send in
// flight to wait for: descriptors held by unsignalled sends alone would never come back.
func TestReclaimNeverStrandsEveryDescriptor(t *testing.T) {
	for _, descriptors := range []int{2, 5, 16, 17, 40, 144} {
		g := newReclaimRig(t, descriptors)
		for round := range 200 {
			for g.send() {
			}
			if len(g.posted) == 0 {
				t.Fatalf("%d descriptors, round %d: none free and none in flight: completed unsignalled sends hold them all", descriptors, round)
			}
			if !slices.ContainsFunc(g.posted, func(w SendWR) bool { return w.Signaled }) {
				t.Fatalf("%d descriptors, round %d: all in flight and none signalled: a sender would wait for ever", descriptors, round)
			}
			// the device completes a prefix of the posted sends, as it might under load
			done := g.posted[:1+round%len(g.posted)]
			rest := slices.Clone(g.posted[len(done):])
			g.posted = done
			g.complete()
			g.posted = rest
			if len(g.free) == 0 && !slices.ContainsFunc(g.posted, func(w SendWR) bool { return w.Signaled }) {
				t.Fatalf("%d descriptors, round %d: nothing free and no signalled send left to give any back", descriptors, round)
			}
		}
		g.flush()
		if len(g.free) != descriptors || g.r.n != 0 {
			t.Fatalf("%d descriptors: %d free and %d outstanding after a flush, want all free", descriptors, len(g.free), g.r.n)
		}
	}
}

// A completion for a descriptor no longer outstanding gives nothing back twice.
func TestReclaimStrayCompletions(t *testing.T) {
	g := newReclaimRig(t, 8)
	for range 3 {
		g.send()
	}
	g.flush()
	if len(g.free) != 8 || g.r.n != 0 {
		t.Fatalf("%d free, %d outstanding, want 8 and 0", len(g.free), g.r.n)
	}
	g.r.completed(1, g.free) // a stray completion
	if len(g.free) != 8 {
		t.Fatalf("a stray completion gave back a descriptor: %d free", len(g.free))
	}
}

// Signalling and giving back allocate nothing: both run for every I/O.
func TestReclaimNoAllocs(t *testing.T) {
	g := newReclaimRig(t, 64)
	batch := make([]SendWR, 16)
	allocs := testing.AllocsPerRun(1000, func() {
		for i := range batch {
			batch[i] = SendWR{ID: wrSend | uint64(<-g.free)}
		}
		g.r.post(batch, len(g.free))
		g.r.completed(int32(batch[len(batch)-1].ID&wrMask), g.free)
	})
	if allocs != 0 {
		t.Fatalf("post and completed allocate %.1f times per batch", allocs)
	}
}
