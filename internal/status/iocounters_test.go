package status

import (
	"errors"
	"sync"
	"testing"
	"time"
)

func TestBucketIndexFollowsPrometheusLE(t *testing.T) {
	cases := []struct {
		d    time.Duration
		want int
	}{
		{0, 0},
		{10 * time.Microsecond, 0}, // le is inclusive
		{10*time.Microsecond + 1, 1},
		{time.Millisecond, 6},
		{10 * time.Second, len(DurationBuckets) - 1},
		{10*time.Second + 1, len(DurationBuckets)}, // +Inf
		{time.Hour, len(DurationBuckets)},
	}
	for _, c := range cases {
		if got := bucketIndex(c.d); got != c.want {
			t.Errorf("bucketIndex(%v) = %d, want %d", c.d, got, c.want)
		}
	}
}

func TestOpCounterSnapshotIsCumulative(t *testing.T) {
	var c OpCounter
	c.Observe(4096, 5*time.Microsecond, false)
	c.Observe(4096, 200*time.Microsecond, false)
	c.Observe(512, 20*time.Second, true)
	s := c.Snapshot(OpWrite)
	if s.Op != "write" || s.Requests != 3 || s.Errors != 1 || s.Bytes != 8192 {
		t.Fatalf("counts %+v", s)
	}
	if s.Duration.Count != 3 {
		t.Fatalf("histogram count %d, want 3", s.Duration.Count)
	}
	wantSum := (5*time.Microsecond + 200*time.Microsecond + 20*time.Second).Seconds()
	if s.Duration.SumSeconds != wantSum {
		t.Fatalf("sum %v, want %v", s.Duration.SumSeconds, wantSum)
	}
	b := s.Duration.Buckets
	if len(b) != len(DurationBuckets) {
		t.Fatalf("%d buckets", len(b))
	}
	if b[0].UpperBound != 10e-6 || b[0].Count != 1 {
		t.Fatalf("first bucket %+v", b[0])
	}
	if b[4].UpperBound != 250e-6 || b[4].Count != 2 || b[3].Count != 1 {
		t.Fatalf("buckets around 200µs: %+v %+v", b[3], b[4])
	}
	if last := b[len(b)-1]; last.UpperBound != 10 || last.Count != 2 {
		t.Fatalf("last bucket %+v (the 20 s request belongs to +Inf only)", last)
	}
}

func TestIOCountersConcurrent(t *testing.T) {
	var c IOCounters
	const goroutines, each = 8, 1000
	var wg sync.WaitGroup
	for g := 0; g < goroutines; g++ {
		wg.Add(1)
		go func(g int) {
			defer wg.Done()
			for i := 0; i < each; i++ {
				c.Begin()
				var err error
				if i%10 == 0 {
					err = errors.New("eio")
				}
				c.End(Op(g%int(numOps)), 4096, time.Now(), err)
			}
		}(g)
	}
	wg.Wait()
	io := c.IOStatus()
	if io.InFlight != 0 {
		t.Fatalf("in flight %d after all ended", io.InFlight)
	}
	var total, errs, bytes uint64
	for _, op := range io.Ops {
		total += op.Requests
		errs += op.Errors
		bytes += op.Bytes
		if op.Duration.Count != op.Requests {
			t.Errorf("%s: histogram count %d, requests %d", op.Op, op.Duration.Count, op.Requests)
		}
	}
	if total != goroutines*each || errs != goroutines*each/10 || bytes != 4096*(total-errs) {
		t.Fatalf("total %d errors %d bytes %d", total, errs, bytes)
	}
	if len(io.Ops) != int(numOps) || io.Ops[OpWriteZeroes].Op != "write_zeroes" {
		t.Fatalf("ops %+v", io.Ops)
	}
}

func TestIOCountersCountInFlight(t *testing.T) {
	var c IOCounters
	c.Begin()
	c.Begin()
	if got := c.IOStatus().InFlight; got != 2 {
		t.Fatalf("in flight %d, want 2", got)
	}
	c.End(OpRead, 1, time.Now(), nil)
	if got := c.IOStatus().InFlight; got != 1 {
		t.Fatalf("in flight %d, want 1", got)
	}
}

// countRequest is what the data path does per request.
func countRequest(c *IOCounters, op Op, started time.Time) {
	c.Begin()
	c.End(op, 4096, started, nil)
}

// BenchmarkIOCountersEnd is the data path's cost of counting one request: it must report
// 0 allocs/op. The parallel run shares one IOCounters between goroutines: no lock to convoy on.
func BenchmarkIOCountersEnd(b *testing.B) {
	var c IOCounters
	started := time.Now()
	b.ReportAllocs()
	for b.Loop() {
		countRequest(&c, OpRead, started)
	}
}

func BenchmarkIOCountersEndParallel(b *testing.B) {
	var c IOCounters
	started := time.Now()
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			countRequest(&c, OpWrite, started)
		}
	})
}

func TestIOCountersEndDoesNotAllocate(t *testing.T) {
	var c IOCounters
	started := time.Now()
	if allocs := testing.AllocsPerRun(1000, func() { countRequest(&c, OpRead, started) }); allocs != 0 {
		t.Fatalf("%v allocations per counted request, want 0", allocs)
	}
}

func TestAnsweredLeavesInFlightAndCounts(t *testing.T) {
	var c IOCounters
	c.Begin()
	c.Begin()
	c.Answered(OpWrite, 4096, time.Millisecond, true)
	c.Answered(OpWrite, 512, time.Millisecond, false)
	io := c.IOStatus()
	w := io.Ops[OpWrite]
	if io.InFlight != 0 || w.Requests != 2 || w.Errors != 1 || w.Bytes != 512 {
		t.Fatalf("in flight %d, writes %+v; want 0 in flight, 2 requests, 1 error, 512 bytes (a failed request moves none)", io.InFlight, w)
	}
}
