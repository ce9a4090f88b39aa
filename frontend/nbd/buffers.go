package nbd

import (
	"context"
	"errors"
	"math/bits"
	"sync"
)

// BufferPool hands out the buffers that carry request payloads. pool.Pool (registered memory) is
// the production implementation; the server never keeps a buffer after a request is answered and
// returns every buffer with Put.
type BufferPool interface {
	// Get returns a buffer of length n (n <= MaxClass()), waiting (bounded by ctx) when the pool
	// is exhausted.
	Get(ctx context.Context, n int) ([]byte, error)
	// Put returns a buffer obtained from Get.
	Put(b []byte)
	// MaxClass is the largest buffer Get can return.
	MaxClass() int
}

// heapPool is the BufferPool used when the caller supplies none: power-of-two size classes from
// 4 KiB to 1 MiB on the Go heap, with free lists so that steady state allocates nothing. It does
// not bound memory (the per-connection request limit does); it is for tests and for callers that
// have no registered memory to offer.
type heapPool struct {
	mu    sync.Mutex
	lists [heapClasses][][]byte
}

const (
	heapMinShift = 12 // 4 KiB
	heapMaxShift = 20 // 1 MiB
	heapClasses  = heapMaxShift - heapMinShift + 1
	heapKeep     = 256 // buffers kept per class
)

var errOversizeBuffer = errors.New("nbd: buffer larger than the largest pool class")

func newHeapPool() *heapPool { return &heapPool{} }

func heapClass(n int) int {
	if n <= 1<<heapMinShift {
		return 0
	}
	return bits.Len(uint(n-1)) - heapMinShift
}

func (p *heapPool) Get(ctx context.Context, n int) ([]byte, error) {
	if n > 1<<heapMaxShift || n < 0 {
		return nil, errOversizeBuffer
	}
	c := heapClass(n)
	p.mu.Lock()
	l := p.lists[c]
	if k := len(l); k > 0 {
		b := l[k-1]
		l[k-1] = nil
		p.lists[c] = l[:k-1]
		p.mu.Unlock()
		return b[:n], nil
	}
	p.mu.Unlock()
	return make([]byte, n, 1<<(c+heapMinShift)), nil
}

func (p *heapPool) Put(b []byte) {
	c := heapClass(cap(b))
	if cap(b) != 1<<(c+heapMinShift) || c >= heapClasses {
		return // not ours
	}
	p.mu.Lock()
	if len(p.lists[c]) < heapKeep {
		p.lists[c] = append(p.lists[c], b[:0])
	}
	p.mu.Unlock()
}

func (p *heapPool) MaxClass() int { return 1 << heapMaxShift }

// TryGet implements tryGetter: the heap pool never waits.
func (p *heapPool) TryGet(n int) ([]byte, bool) {
	b, err := p.Get(context.Background(), n)
	return b, err == nil
}

// tryGetter is the optional non-waiting Get of a BufferPool (pool.Pool and the heap pool have it).
// The reader serves cache hits inline only with such a pool, since it must never wait for memory.
type tryGetter interface {
	TryGet(n int) ([]byte, bool)
}
