package status

import (
	"sync/atomic"
	"time"
)

// Op is a client operation the frontend counts.
type Op uint8

// The operations, in the order OpStats lists them.
const (
	OpRead Op = iota
	OpWrite
	OpFlush
	OpTrim
	OpWriteZeroes
	numOps
)

var opNames = [numOps]string{"read", "write", "flush", "trim", "write_zeroes"}

// String is the op's name in status and in the metrics' op label.
func (o Op) String() string {
	if o < numOps {
		return opNames[o]
	}
	return "unknown"
}

// DurationBuckets are the upper bounds of the request-duration histogram: 10 µs to 10 s in
// 1-2.5-5 steps. Fixed so that the data path finds a bucket with a few compares and no
// allocation; changing them changes the metrics' le labels (a schema change).
var DurationBuckets = [...]time.Duration{
	10 * time.Microsecond, 25 * time.Microsecond, 50 * time.Microsecond,
	100 * time.Microsecond, 250 * time.Microsecond, 500 * time.Microsecond,
	time.Millisecond, 2500 * time.Microsecond, 5 * time.Millisecond,
	10 * time.Millisecond, 25 * time.Millisecond, 50 * time.Millisecond,
	100 * time.Millisecond, 250 * time.Millisecond, 500 * time.Millisecond,
	time.Second, 2500 * time.Millisecond, 5 * time.Second, 10 * time.Second,
}

// OpCounter counts one operation. Only atomics: the data path calls Observe from any goroutine
// without a lock and without allocating. Buckets are kept per bucket (not cumulative) so an
// observation touches one; Snapshot makes them cumulative.
type OpCounter struct {
	requests atomic.Uint64
	errors   atomic.Uint64
	bytes    atomic.Uint64
	sumNanos atomic.Uint64
	buckets  [len(DurationBuckets) + 1]atomic.Uint64 // last: above the largest bound (+Inf)
}

// Observe counts one finished request of n bytes that took d; failed counts it as an error too.
// Bytes are counted for successful requests only: bytes moved, not bytes asked for.
func (c *OpCounter) Observe(n int, d time.Duration, failed bool) {
	c.requests.Add(1)
	if failed {
		c.errors.Add(1)
	} else if n > 0 {
		c.bytes.Add(uint64(n))
	}
	if d < 0 {
		d = 0
	}
	c.sumNanos.Add(uint64(d))
	c.buckets[bucketIndex(d)].Add(1)
}

// bucketIndex returns the first bucket whose bound is ≥ d (Prometheus' le), or the +Inf slot.
func bucketIndex(d time.Duration) int {
	lo, hi := 0, len(DurationBuckets)
	for lo < hi {
		mid := int(uint(lo+hi) >> 1)
		if DurationBuckets[mid] < d {
			lo = mid + 1
		} else {
			hi = mid
		}
	}
	return lo
}

// Snapshot reads the counter. Concurrent Observes may land between the loads; Count is the sum
// of the buckets read, so the histogram is always self-consistent.
func (c *OpCounter) Snapshot(op Op) OpStats {
	s := OpStats{
		Op:       op.String(),
		Requests: c.requests.Load(),
		Errors:   c.errors.Load(),
		Bytes:    c.bytes.Load(),
	}
	s.Duration.SumSeconds = time.Duration(c.sumNanos.Load()).Seconds()
	s.Duration.Buckets = make([]Bucket, len(DurationBuckets))
	var cum uint64
	for i, bound := range DurationBuckets {
		cum += c.buckets[i].Load()
		s.Duration.Buckets[i] = Bucket{UpperBound: bound.Seconds(), Count: cum}
	}
	s.Duration.Count = cum + c.buckets[len(DurationBuckets)].Load()
	return s
}

// IOCounters is the frontend's per-operation counters plus requests in flight. Pre-bound: the
// data path indexes by Op, nothing is looked up or allocated per I/O. The zero value is ready.
type IOCounters struct {
	ops      [numOps]OpCounter
	inFlight atomic.Int64
}

// Begin counts a request entering the gateway.
func (c *IOCounters) Begin() { c.inFlight.Add(1) }

// Abandon forgets a request that Begin counted and that will not be answered (its connection
// ended first).
func (c *IOCounters) Abandon() { c.inFlight.Add(-1) }

// End counts a request that Begin counted and that started at started.
func (c *IOCounters) End(op Op, n int, started time.Time, err error) {
	c.Answered(op, n, time.Since(started), err != nil)
}

// Answered counts a request that Begin counted and that was answered after d, failed or not:
// End for frontends whose outcome is a status code (an NBD errno, a ublk result), not an error.
func (c *IOCounters) Answered(op Op, n int, d time.Duration, failed bool) {
	c.inFlight.Add(-1)
	c.Op(op).Observe(n, d, failed)
}

// Op returns op's counter, for callers that measure the duration themselves.
func (c *IOCounters) Op(op Op) *OpCounter {
	return &c.ops[op]
}

// IOStatus implements IOProvider.
func (c *IOCounters) IOStatus() IO {
	io := IO{InFlight: c.inFlight.Load(), Ops: make([]OpStats, numOps)}
	for op := Op(0); op < numOps; op++ {
		io.Ops[op] = c.ops[op].Snapshot(op)
	}
	return io
}
