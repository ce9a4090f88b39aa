package pool

import (
	"context"
	"errors"
	"time"
	"unsafe"

	"testing"

	"pgregory.net/rapid"
)

// TestPoolStateMachine drives Get/Put/Lookup with rapid against a trivial model (the set of
// buffers held) and checks after every step: buffers never overlap, each has the requested
// length and the capacity of its class, the pool never maps more than its bound, InUseBytes is
// the sum of what is held, and a Get at the bound blocks (here: times out) instead of growing.
func TestPoolStateMachine(t *testing.T) {
	rapid.Check(t, func(rt *rapid.T) {
		maxBytes := int64(rapid.SampledFrom([]int{512 << 10, 1 << 20, 3 << 20}).Draw(rt, "maxBytes"))
		p, err := New(Config{MaxBytes: maxBytes, MaxClass: 256 << 10, RegionSize: 1 << 20})
		if err != nil {
			rt.Fatal(err)
		}
		var held [][]byte
		rt.Repeat(map[string]func(*rapid.T){
			"get": func(rt *rapid.T) {
				n := rapid.IntRange(0, 256<<10).Draw(rt, "n")
				ctx, cancel := context.WithTimeout(context.Background(), 5*time.Millisecond)
				defer cancel()
				b, err := p.Get(ctx, n)
				if err != nil {
					if !errors.Is(err, context.DeadlineExceeded) {
						rt.Fatalf("Get(%d): %v", n, err)
					}
					// Only legitimate when every slab holds a buffer that is out: then nothing can be
					// carved or reclaimed (slab fragmentation is the price of O(1) size classes).
					pinned := map[int]bool{}
					for _, h := range held {
						r, _, off, _ := p.Lookup(h)
						pinned[r.Index*p.slabsPerReg+off/p.slabSize] = true
					}
					if len(pinned) < p.totalSlabs {
						rt.Fatalf("Get(%d) timed out with only %d of %d slabs in use", n, len(pinned), p.totalSlabs)
					}
					return
				}
				if len(b) != n || cap(b) != p.classes[p.classFor(n)].size {
					rt.Fatalf("Get(%d): len %d cap %d", n, len(b), cap(b))
				}
				held = append(held, b)
			},
			"put": func(rt *rapid.T) {
				if len(held) == 0 {
					rt.Skip("nothing held")
				}
				i := rapid.IntRange(0, len(held)-1).Draw(rt, "i")
				p.Put(held[i])
				held = append(held[:i], held[i+1:]...)
			},
			"lookup": func(rt *rapid.T) {
				if len(held) == 0 {
					rt.Skip("nothing held")
				}
				b := held[rapid.IntRange(0, len(held)-1).Draw(rt, "i")]
				r, _, off, ok := p.Lookup(b)
				if !ok || uintptr(r.Base)+uintptr(off) != uintptr(unsafe.Pointer(unsafe.SliceData(b))) {
					rt.Fatal("Lookup does not find a held buffer")
				}
			},
			"": func(rt *rapid.T) { // invariants after every step
				var inUse int64
				for i, a := range held {
					inUse += int64(cap(a))
					lo := uintptr(unsafe.Pointer(unsafe.SliceData(a)))
					for _, b := range held[i+1:] {
						lo2 := uintptr(unsafe.Pointer(unsafe.SliceData(b)))
						if lo < lo2+uintptr(cap(b)) && lo2 < lo+uintptr(cap(a)) {
							rt.Fatal("two held buffers overlap")
						}
					}
				}
				st := p.Stats()
				if st.InUseBytes != inUse || st.MappedBytes > maxBytes {
					rt.Fatalf("stats %+v, held %d bytes, bound %d", st, inUse, maxBytes)
				}
			},
		})
		for _, b := range held {
			p.Put(b)
		}
		if err := p.Close(); err != nil {
			rt.Fatal(err)
		}
	})
}
