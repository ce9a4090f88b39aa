package nbd

import (
	"testing"

	"github.com/iser-blk/iser-blk/internal/status"
)

// benchCounters is the Options.Counters benchConn's server gets (nil: counting off).
var benchCounters *status.IOCounters

// benchCounted runs bench with counting on and, once its connection has ended (cleanups run
// last-registered first), checks that every request was counted once with its bytes.
func benchCounted(b *testing.B, bench func(*testing.B), op status.Op, size int) {
	c := new(status.IOCounters)
	benchCounters = c
	b.Cleanup(func() {
		benchCounters = nil
		checkCounted(b, c, op, size)
	})
	bench(b)
}

// The counted twins of the 0-allocs benchmarks: counting adds no allocation.
func BenchmarkRead4KCounted(b *testing.B)  { benchCounted(b, BenchmarkRead4K, status.OpRead, 4096) }
func BenchmarkWrite4KCounted(b *testing.B) { benchCounted(b, BenchmarkWrite4K, status.OpWrite, 4096) }

func checkCounted(b *testing.B, c *status.IOCounters, op status.Op, size int) {
	b.Helper()
	st := c.IOStatus()
	o := st.Ops[op]
	if o.Requests != uint64(b.N) || o.Bytes != uint64(b.N*size) || o.Errors != 0 || o.Duration.Count != uint64(b.N) {
		b.Fatalf("%s counted %d requests %d bytes %d errors, want %d requests of %d bytes", op, o.Requests, o.Bytes, o.Errors, b.N, size)
	}
	if o.Duration.SumSeconds <= 0 {
		b.Fatalf("%s: %d requests took %v s in all", op, o.Requests, o.Duration.SumSeconds)
	}
	if st.InFlight != 0 {
		b.Fatalf("%d requests still in flight after all replies", st.InFlight)
	}
}

// TestCountersCountEveryRequest runs the counted benchmarks once as a test.
func TestCountersCountEveryRequest(t *testing.T) {
	for _, bench := range []func(*testing.B){BenchmarkRead4KCounted, BenchmarkWrite4KCounted} {
		if r := testing.Benchmark(bench); r.N == 0 {
			t.Fatal("benchmark failed (see its output)")
		}
	}
}
