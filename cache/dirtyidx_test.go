package cache

import (
	"math/rand/v2"
	"testing"
)

// TestDirtyIndexModel runs random puts, gets and deletes against a Go map: small tables (probe
// runs wrap around the end), growth from a small hint, and key ranges from dense (every slot
// collides with its neighbours) to sparse.
func TestDirtyIndexModel(t *testing.T) {
	cases := []struct {
		name  string
		hint  int
		keys  int64
		ops   int
		start int64
	}{
		{"tiny table, dense keys", 4, 40, 20000, 0},
		{"grows from a small hint", 1, 5000, 50000, 0},
		{"sized, sparse keys", 1000, 1 << 40, 20000, 0},
		{"high page numbers", 256, 3000, 30000, 1<<50 - 1000},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			r := rand.New(rand.NewPCG(1, uint64(tc.keys)))
			d := newDirtyIndex(tc.hint)
			model := map[int64]int32{}
			for i := 0; i < tc.ops; i++ {
				k := tc.start + r.Int64N(tc.keys)
				switch r.IntN(3) {
				case 0:
					v := int32(r.IntN(1 << 30))
					d.put(k, v)
					model[k] = v
				case 1:
					d.del(k)
					delete(model, k)
				}
				got, ok := d.get(k)
				want, wok := model[k]
				if ok != wok || (ok && got != want) {
					t.Fatalf("op %d: get(%d) = %d, %v; want %d, %v", i, k, got, ok, want, wok)
				}
				if d.n != len(model) {
					t.Fatalf("op %d: len %d, want %d", i, d.n, len(model))
				}
			}
			for k, v := range model {
				if got, ok := d.get(k); !ok || got != v {
					t.Fatalf("final: get(%d) = %d, %v; want %d", k, got, ok, v)
				}
			}
			if 2*d.n > len(d.keys) {
				t.Fatalf("%d entries in %d slots: more than half full", d.n, len(d.keys))
			}
		})
	}
}

// TestDirtyIndexLeavesNoTombstones: after a sequential write-back's worth of churn (a sliding
// window of dirty pages, each inserted and deleted once) the emptied table is all empty slots,
// so a lookup of an absent page stops at its home slot or right after.
func TestDirtyIndexLeavesNoTombstones(t *testing.T) {
	const window = 4096
	d := newDirtyIndex(window)
	for p := int64(0); p < 50*window; p++ {
		d.put(p, int32(p))
		if p >= window {
			d.del(p - window)
		}
	}
	for p := int64(50*window - window); p < 50*window; p++ {
		d.del(p)
	}
	for i, k := range d.keys {
		if k != 0 {
			t.Fatalf("slot %d still holds page %d after every page was deleted", i, k-1)
		}
	}
}

// BenchmarkDirtyIndexChurn is the write-back pattern: a window of consecutive dirty pages moving
// forward, with a lookup past its end (the end of a coalescing scan) per page.
func BenchmarkDirtyIndexChurn(b *testing.B) {
	const window = 1 << 17 // 512 MiB of 4 KiB pages
	b.Run("dirtyIndex", func(b *testing.B) {
		d := newDirtyIndex(window)
		for i := 0; b.Loop(); i++ {
			p := int64(i)
			d.put(p, int32(i))
			if p >= window {
				d.del(p - window)
			}
			d.get(p + 1)
		}
	})
	b.Run("map", func(b *testing.B) {
		m := make(map[int64]int32, window)
		for i := 0; b.Loop(); i++ {
			p := int64(i)
			m[p] = int32(i)
			if p >= window {
				delete(m, p-window)
			}
			_ = m[p+1]
		}
	})
}
