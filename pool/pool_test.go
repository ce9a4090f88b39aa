package pool

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"sync"
	"testing"
	"time"
	"unsafe"
)

func mustNew(t testing.TB, cfg Config) *Pool {
	t.Helper()
	p, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func TestNewValidates(t *testing.T) {
	for _, tc := range []struct {
		name string
		cfg  Config
		ok   bool
	}{
		{"defaults", Config{MaxBytes: 8 << 20}, true},
		{"smaller than max class", Config{MaxBytes: 1 << 10, MaxClass: 4 << 10}, false},
		{"unsorted classes", Config{MaxBytes: 8 << 20, Classes: []int{8192, 4096}}, false},
		{"class not multiple of smallest", Config{MaxBytes: 8 << 20, Classes: []int{4096, 6000}}, false},
		{"custom classes", Config{MaxBytes: 8 << 20, Classes: []int{4096, 12288, 65536}}, true},
		{"single class", Config{MaxBytes: 1 << 20, Classes: []int{4096}, MaxClass: 4096}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p, err := New(tc.cfg)
			if (err == nil) != tc.ok {
				t.Fatalf("New(%+v) = %v, want ok=%v", tc.cfg, err, tc.ok)
			}
			if p != nil {
				if err := p.Close(); err != nil {
					t.Fatal(err)
				}
			}
		})
	}
}

func TestGetSizesAndClasses(t *testing.T) {
	p := mustNew(t, Config{MaxBytes: 16 << 20, MaxClass: 1 << 20})
	defer p.Close()
	ctx := context.Background()
	for _, tc := range []struct{ n, wantCap int }{
		{0, 4096}, {1, 4096}, {4096, 4096}, {4097, 8192}, {65536, 65536}, {65537, 131072}, {1 << 20, 1 << 20},
	} {
		b, err := p.Get(ctx, tc.n)
		if err != nil {
			t.Fatal(err)
		}
		if len(b) != tc.n || cap(b) != tc.wantCap {
			t.Errorf("Get(%d): len %d cap %d, want len %d cap %d", tc.n, len(b), cap(b), tc.n, tc.wantCap)
		}
		b = b[:cap(b)]
		for i := range b { // the whole class is writable memory
			b[i] = byte(i)
		}
		p.Put(b)
	}
	if _, err := p.Get(ctx, 1<<20+1); !errors.Is(err, ErrTooLarge) {
		t.Fatalf("oversize Get: %v, want ErrTooLarge", err)
	}
	if _, err := p.Get(ctx, -1); !errors.Is(err, ErrTooLarge) {
		t.Fatalf("negative Get: %v, want ErrTooLarge", err)
	}
	if got := p.Stats().InUseBytes; got != 0 {
		t.Fatalf("InUseBytes %d after returning everything", got)
	}
}

func TestBuffersDoNotOverlap(t *testing.T) {
	p := mustNew(t, Config{MaxBytes: 4 << 20, MaxClass: 64 << 10, RegionSize: 1 << 20})
	defer p.Close()
	ctx := context.Background()
	var bufs [][]byte
	type span struct{ lo, hi uintptr }
	var spans []span
	for i := 0; ; i++ {
		cctx, cancel := context.WithTimeout(ctx, 20*time.Millisecond)
		b, err := p.Get(cctx, []int{4096, 8192, 65536}[i%3])
		cancel()
		if err != nil {
			if !errors.Is(err, context.DeadlineExceeded) {
				t.Fatal(err)
			}
			break
		}
		lo := uintptr(unsafe.Pointer(unsafe.SliceData(b)))
		spans = append(spans, span{lo, lo + uintptr(cap(b))})
		bufs = append(bufs, b)
	}
	total := 0
	for _, b := range bufs {
		total += cap(b)
	}
	if total > 4<<20 {
		t.Fatalf("handed out %d bytes from a 4 MiB pool", total)
	}
	if total < 3<<20 {
		t.Fatalf("only %d bytes handed out before the pool reported full", total)
	}
	for i := range spans {
		for j := i + 1; j < len(spans); j++ {
			if spans[i].lo < spans[j].hi && spans[j].lo < spans[i].hi {
				t.Fatalf("buffers %d and %d overlap", i, j)
			}
		}
	}
	if st := p.Stats(); st.MappedBytes > st.MaxBytes || st.Regions != 4 {
		t.Fatalf("stats %+v: want 4 regions within the bound", st)
	}
	for _, b := range bufs {
		p.Put(b)
	}
}

func TestPutRejectsForeignAndDouble(t *testing.T) {
	p := mustNew(t, Config{MaxBytes: 1 << 20, MaxClass: 64 << 10})
	defer p.Close()
	b, err := p.Get(context.Background(), 4096)
	if err != nil {
		t.Fatal(err)
	}
	mustPanic := func(name string, f func()) {
		t.Helper()
		defer func() {
			if recover() == nil {
				t.Errorf("%s: Put did not panic", name)
			}
		}()
		f()
	}
	mustPanic("heap slice", func() { p.Put(make([]byte, 4096)) })
	mustPanic("interior pointer", func() { p.Put(b[8:]) })
	mustPanic("empty", func() { p.Put(nil) })
	p.Put(b)
	mustPanic("double put", func() { p.Put(b) })
}

func TestGetWaitsAtBoundAndWakes(t *testing.T) {
	p := mustNew(t, Config{MaxBytes: 1 << 20, Classes: []int{1 << 20}})
	defer p.Close()
	ctx := context.Background()
	b, err := p.Get(ctx, 1<<20)
	if err != nil {
		t.Fatal(err)
	}
	cctx, cancel := context.WithTimeout(ctx, 30*time.Millisecond)
	_, err = p.Get(cctx, 4096)
	cancel()
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Get at the bound: %v, want a deadline error", err)
	}
	got := make(chan error, 1)
	waiting := make(chan struct{})
	go func() {
		close(waiting)
		b2, err := p.Get(ctx, 1<<20)
		if err == nil {
			p.Put(b2)
		}
		got <- err
	}()
	<-waiting
	// Whether or not the goroutine is already blocked, the Put must let it through.
	p.Put(b)
	if err := <-got; err != nil {
		t.Fatalf("waiting Get: %v", err)
	}
	if st := p.Stats(); st.MappedBytes != 1<<20 {
		t.Fatalf("mapped %d bytes, want exactly the 1 MiB bound", st.MappedBytes)
	}
}

func TestReclaimAcrossClasses(t *testing.T) {
	// All memory first goes to 4 KiB buffers; once they are back, a 256 KiB Get must succeed.
	p := mustNew(t, Config{MaxBytes: 1 << 20, Classes: []int{4096, 256 << 10}})
	defer p.Close()
	ctx := context.Background()
	var small [][]byte
	for i := 0; i < 256; i++ {
		b, err := p.Get(ctx, 4096)
		if err != nil {
			t.Fatal(err)
		}
		small = append(small, b)
	}
	for _, b := range small {
		p.Put(b)
	}
	cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	var big [][]byte
	for i := 0; i < 4; i++ {
		b, err := p.Get(cctx, 256<<10)
		if err != nil {
			t.Fatalf("Get of a large buffer after small ones were returned: %v", err)
		}
		big = append(big, b)
	}
	for _, b := range big {
		p.Put(b)
	}
	if st := p.Stats(); st.Reclaims < 4 || st.MappedBytes != 1<<20 {
		t.Fatalf("stats %+v: want slabs reclaimed within the 1 MiB bound", st)
	}
	// And back the other way, with one small buffer pinning one slab.
	pin, err := p.Get(ctx, 4096)
	if err != nil {
		t.Fatal(err)
	}
	p.Put(pin)
}

func TestOnRegionAndLookup(t *testing.T) {
	p := mustNew(t, Config{MaxBytes: 4 << 20, MaxClass: 64 << 10, RegionSize: 1 << 20})
	defer p.Close()
	ctx := context.Background()
	first, err := p.Get(ctx, 4096) // maps region 0 before the hook exists
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	seen := map[int]Region{}
	err = p.OnRegion(func(r Region) (any, error) {
		mu.Lock()
		defer mu.Unlock()
		if _, dup := seen[r.Index]; dup {
			return nil, fmt.Errorf("region %d registered twice", r.Index)
		}
		seen[r.Index] = r
		return fmt.Sprintf("key-%d", r.Index), nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(seen) != 1 {
		t.Fatalf("hook saw %d existing regions, want 1", len(seen))
	}
	if err := p.OnRegion(func(Region) (any, error) { return nil, nil }); err == nil {
		t.Fatal("second hook accepted")
	}
	var bufs [][]byte
	for i := 0; i < 40; i++ { // 40 × 64 KiB spills into more regions
		b, err := p.Get(ctx, 64<<10)
		if err != nil {
			t.Fatal(err)
		}
		bufs = append(bufs, b)
	}
	bufs = append(bufs, first)
	for _, b := range bufs {
		r, h, off, ok := p.Lookup(b)
		if !ok {
			t.Fatal("Lookup failed for a pool buffer")
		}
		if h != fmt.Sprintf("key-%d", r.Index) {
			t.Fatalf("handle %v for region %d", h, r.Index)
		}
		if uintptr(r.Base)+uintptr(off) != uintptr(unsafe.Pointer(unsafe.SliceData(b))) || off+cap(b) > r.Len {
			t.Fatalf("Lookup offset %d in region %+v does not point at the buffer", off, r)
		}
		mu.Lock()
		if _, ok := seen[r.Index]; !ok {
			t.Fatalf("buffer from region %d handed out before the hook ran", r.Index)
		}
		mu.Unlock()
	}
	if _, _, _, ok := p.Lookup(make([]byte, 10)); ok {
		t.Fatal("Lookup accepted a heap slice")
	}
	if len(seen) < 3 {
		t.Fatalf("hook saw %d regions, want at least 3", len(seen))
	}
	for _, b := range bufs {
		p.Put(b)
	}
}

func TestOnRegionFailureFailsGet(t *testing.T) {
	p := mustNew(t, Config{MaxBytes: 2 << 20, MaxClass: 64 << 10, RegionSize: 1 << 20})
	defer p.Close()
	boom := errors.New("no MR for you")
	if err := p.OnRegion(func(Region) (any, error) { return nil, boom }); err != nil {
		t.Fatal(err)
	}
	if _, err := p.Get(context.Background(), 4096); !errors.Is(err, boom) {
		t.Fatalf("Get with a failing hook: %v", err)
	}
	if st := p.Stats(); st.MappedBytes != 0 {
		t.Fatalf("failed region still counted: %+v", st)
	}
}

func TestCloseBusy(t *testing.T) {
	p := mustNew(t, Config{MaxBytes: 1 << 20, MaxClass: 64 << 10})
	b, err := p.Get(context.Background(), 100)
	if err != nil {
		t.Fatal(err)
	}
	if err := p.Close(); !errors.Is(err, ErrBusy) {
		t.Fatalf("Close with a buffer out: %v", err)
	}
	p.Put(b)
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := p.Get(context.Background(), 100); !errors.Is(err, ErrClosed) {
		t.Fatalf("Get after Close: %v", err)
	}
}

func TestHugePagesFallBack(t *testing.T) {
	// Most CI machines have no reserved huge pages; either way Get must work.
	p := mustNew(t, Config{MaxBytes: 4 << 20, MaxClass: 64 << 10, HugePages: true})
	defer p.Close()
	b, err := p.Get(context.Background(), 4096)
	if err != nil {
		t.Fatal(err)
	}
	b[0] = 1
	p.Put(b)
	t.Logf("stats with HugePages: %+v", p.Stats())
}

func TestConcurrentGetPut(t *testing.T) {
	p := mustNew(t, Config{MaxBytes: 2 << 20, MaxClass: 256 << 10, RegionSize: 1 << 20})
	defer p.Close()
	ctx := context.Background()
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	for g := 0; g < 8; g++ {
		wg.Add(1)
		go func(g int) {
			defer wg.Done()
			sizes := []int{512, 4096, 9000, 65536, 200000}
			for i := 0; i < 2000; i++ {
				n := sizes[(g+i)%len(sizes)]
				b, err := p.Get(ctx, n)
				if err != nil {
					errs <- err
					return
				}
				tag := byte(g*31 + i)
				for j := 0; j < len(b); j += 512 {
					b[j] = tag
				}
				runtime.Gosched()
				for j := 0; j < len(b); j += 512 {
					if b[j] != tag {
						errs <- fmt.Errorf("goroutine %d: buffer shared with another owner", g)
						return
					}
				}
				p.Put(b)
			}
		}(g)
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	st := p.Stats()
	t.Logf("stats after the storm: %+v", st)
	if st.InUseBytes != 0 || st.Gets != st.Puts || st.MappedBytes > 2<<20 {
		t.Fatalf("stats after the storm: %+v", st)
	}
}

// TestPoolMemoryOutsideHeap maps and touches 256 MiB and checks that the Go heap did not grow.
func TestPoolMemoryOutsideHeap(t *testing.T) {
	const size = 256 << 20
	p := mustNew(t, Config{MaxBytes: size, MaxClass: 1 << 20})
	defer p.Close()
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	bufs := make([][]byte, 0, size>>20)
	for i := 0; i < size>>20; i++ {
		b, err := p.Get(context.Background(), 1<<20)
		if err != nil {
			t.Fatal(err)
		}
		for j := 0; j < len(b); j += 4096 {
			b[j] = 1
		}
		bufs = append(bufs, b)
	}
	runtime.ReadMemStats(&after)
	grew := int64(after.HeapAlloc) - int64(before.HeapAlloc)
	t.Logf("pool mapped %d MiB; HeapAlloc grew by %d KiB; HeapSys %d MiB", p.Stats().MappedBytes>>20, grew>>10, after.HeapSys>>20)
	if grew > 8<<20 {
		t.Fatalf("HeapAlloc grew by %d bytes while the pool handed out %d", grew, size)
	}
	for _, b := range bufs {
		p.Put(b)
	}
}

func TestGetPutZeroAllocs(t *testing.T) {
	p := mustNew(t, Config{MaxBytes: 4 << 20, MaxClass: 1 << 20})
	defer p.Close()
	ctx := context.Background()
	warm, _ := p.Get(ctx, 4096)
	p.Put(warm)
	allocs := testing.AllocsPerRun(1000, func() {
		b, err := p.Get(ctx, 4096)
		if err != nil {
			panic(err)
		}
		p.Put(b)
	})
	if allocs != 0 {
		t.Fatalf("Get/Put allocates %.1f times per op", allocs)
	}
}

func BenchmarkGetPut(b *testing.B) {
	for _, n := range []int{4096, 65536, 1 << 20} {
		b.Run(fmt.Sprint(n), func(b *testing.B) {
			p := mustNew(b, Config{MaxBytes: 64 << 20, MaxClass: 1 << 20})
			defer p.Close()
			ctx := context.Background()
			b.ReportAllocs()
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					buf, err := p.Get(ctx, n)
					if err != nil {
						b.Error(err)
						return
					}
					p.Put(buf)
				}
			})
		})
	}
}

func BenchmarkLookup(b *testing.B) {
	p := mustNew(b, Config{MaxBytes: 256 << 20, MaxClass: 1 << 20, RegionSize: 16 << 20})
	defer p.Close()
	ctx := context.Background()
	var bufs [][]byte
	for i := 0; i < 200; i++ {
		buf, _ := p.Get(ctx, 1<<20)
		bufs = append(bufs, buf)
	}
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if _, _, _, ok := p.Lookup(bufs[i%len(bufs)]); !ok {
			b.Fatal("lookup failed")
		}
	}
	b.StopTimer()
	for _, buf := range bufs {
		p.Put(buf)
	}
}

// TestConcurrentWaiters runs more demand than the bound allows: Gets must wait and be woken by
// Puts (a lost wake-up would hang until the deadline), never fail, never exceed the bound.
func TestConcurrentWaiters(t *testing.T) {
	p := mustNew(t, Config{MaxBytes: 1 << 20, MaxClass: 256 << 10})
	defer p.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	// Hold the whole bound while the workers start, so that Gets do wait whatever the
	// scheduler's interleaving (with mixed sizes the workers alone only sometimes reach it).
	var held [][]byte
	for i := 0; i < 4; i++ {
		b, err := p.Get(ctx, 256<<10)
		if err != nil {
			t.Fatal(err)
		}
		held = append(held, b)
	}
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	for g := 0; g < 8; g++ {
		wg.Add(1)
		go func(g int) {
			defer wg.Done()
			for i := 0; i < 300; i++ {
				n := []int{256 << 10, 4096, 100 << 10}[(g+i)%3]
				b, err := p.Get(ctx, n)
				if err != nil {
					errs <- err
					return
				}
				if st := p.Stats(); st.MappedBytes > 1<<20 {
					errs <- fmt.Errorf("mapped %d bytes over the bound", st.MappedBytes)
				}
				runtime.Gosched()
				p.Put(b)
			}
		}(g)
	}
	for p.Stats().Waits == 0 && ctx.Err() == nil {
		runtime.Gosched() // until a worker is blocked in Get on the full pool
	}
	for _, b := range held {
		p.Put(b)
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	st := p.Stats()
	t.Logf("stats: %+v", st)
	if st.Waits == 0 {
		t.Fatal("no Get waited: the test did not reach the bound")
	}
}

func TestTryGetNeverWaits(t *testing.T) {
	p := mustNew(t, Config{MaxBytes: 1 << 20, Classes: []int{1 << 20}})
	defer p.Close()
	b, ok := p.TryGet(1 << 20)
	if !ok || len(b) != 1<<20 {
		t.Fatalf("TryGet on an empty pool: ok %v len %d", ok, len(b))
	}
	if _, ok := p.TryGet(4096); ok {
		t.Fatal("TryGet at the bound handed out a buffer")
	}
	if _, ok := p.TryGet(2 << 20); ok {
		t.Fatal("TryGet over the largest class succeeded")
	}
	p.Put(b)
	b2, ok := p.TryGet(4096)
	if !ok || len(b2) != 4096 {
		t.Fatalf("TryGet after Put: ok %v len %d", ok, len(b2))
	}
	p.Put(b2)
	if st := p.Stats(); st.MappedBytes != 1<<20 {
		t.Fatalf("mapped %d bytes, want exactly the 1 MiB bound", st.MappedBytes)
	}
}

// A single-class pool hands out exactly Usable bytes: a caller that takes all its buffers up
// front (the cache's pages) and sizes itself with Usable never waits for one that cannot come.
func TestUsableIsWhatGetHandsOut(t *testing.T) {
	for _, maxBytes := range []int64{1000000, 1 << 20, 1<<30 - 65552, 3 << 20} {
		p, err := New(Config{MaxBytes: maxBytes, Classes: []int{4096}, MaxClass: 4096})
		if err != nil {
			t.Fatal(err)
		}
		n := Usable(maxBytes, 4096) / 4096
		for i := int64(0); i < n; i++ {
			if _, ok := p.TryGet(4096); !ok {
				t.Fatalf("MaxBytes %d: buffer %d of the %d Usable promises was refused", maxBytes, i, n)
			}
		}
		if _, ok := p.TryGet(4096); ok {
			t.Fatalf("MaxBytes %d: more than Usable (%d buffers) handed out", maxBytes, n)
		}
		p.Close()
	}
}
