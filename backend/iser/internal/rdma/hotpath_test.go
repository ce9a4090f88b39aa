//go:build cgo && linux && !nordma

package rdma

import (
	"context"
	"testing"

	"github.com/iser-blk/iser-blk/pool"
)

// The per-command work of the iSER transport that does not need a device: finding a pool
// buffer's keys (pool.Lookup + the region's registrations) and encoding the iSER header. Both
// must allocate nothing.
func newKeyedPool(t testing.TB) (*pool.Pool, *registrar, *Conn) {
	p, err := pool.New(pool.Config{MaxBytes: 8 << 20, MaxClass: 1 << 20})
	if err != nil {
		t.Fatal(err)
	}
	r, err := registrarFor(p)
	if err != nil {
		t.Fatal(err)
	}
	c := &Conn{}
	b, err := p.Get(context.Background(), 4096) // maps the first region
	if err != nil {
		t.Fatal(err)
	}
	p.Put(b)
	for _, rk := range r.regions {
		rk.add(keyEntry{conn: c, mr: &MR{LKey: 0x1234, RKey: 0x5678}})
	}
	return p, r, c
}

func TestKeysFor(t *testing.T) {
	p, r, c := newKeyedPool(t)
	b, _ := p.Get(context.Background(), 64<<10)
	defer p.Put(b)
	if l, rk, ok := r.keysFor(c, b[100:200]); !ok || l != 0x1234 || rk != 0x5678 {
		t.Fatalf("keysFor pool buffer: %#x %#x %v", l, rk, ok)
	}
	if _, _, ok := r.keysFor(&Conn{}, b); ok {
		t.Fatal("keys found for a connection the region is not registered with")
	}
	if _, _, ok := r.keysFor(c, make([]byte, 4096)); ok {
		t.Fatal("keys found for a heap buffer")
	}
	if _, _, ok := r.keysFor(c, nil); ok {
		t.Fatal("keys found for an empty buffer")
	}
	allocs := testing.AllocsPerRun(1000, func() { r.keysFor(c, b) })
	if allocs != 0 {
		t.Fatalf("keysFor allocates %.1f times per call", allocs)
	}
}

func BenchmarkCommandKeysAndHeader(b *testing.B) {
	p, r, c := newKeyedPool(b)
	buf, _ := p.Get(context.Background(), 128<<10)
	defer p.Put(buf)
	var hdr [HeaderLen]byte
	b.ReportAllocs()
	for b.Loop() {
		_, rkey, ok := r.keysFor(c, buf)
		if !ok {
			b.Fatal("no keys")
		}
		h := Header{Flags: OpcodeControl | FlagRSV, ReadSTag: rkey, ReadVA: addrOf(buf)}
		h.Encode(hdr[:])
	}
}
