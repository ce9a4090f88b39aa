package iser

// The NOP-Out/NOP-In round trip of a path (RFC 7143 §11.18, §11.19): the keepalive (recovery.go)
// times each ping it sends and records it here, and `iser-blk status` and the metrics'
// path_nop_round_trip_seconds read it. Pings are sent only on an idle connection, at most one per
// NOPInterval per path, never per I/O: three atomics suffice, no lock, no allocation.

import (
	"sync/atomic"
	"time"

	"github.com/iser-blk/iser-blk/internal/status"
)

// nopRTT accumulates one path's answered pings. Readers may see last and the sum from
// different pings while one is being recorded; each value is itself whole, and the mean is
// computed from a sum and count read together closely enough for an operator's view.
type nopRTT struct {
	lastNanos atomic.Int64
	sumNanos  atomic.Int64
	samples   atomic.Uint64
}

// record adds one answered ping that took d.
func (r *nopRTT) record(d time.Duration) {
	d = max(d, 1) // a clock that did not move still saw an answer: never report "no sample"
	r.lastNanos.Store(int64(d))
	r.sumNanos.Add(int64(d))
	r.samples.Add(1)
}

// status returns the round trip in the status schema; zero before the first answered ping.
func (r *nopRTT) status() status.NopRTT {
	n := r.samples.Load()
	if n == 0 {
		return status.NopRTT{}
	}
	return status.NopRTT{
		LastSeconds: time.Duration(r.lastNanos.Load()).Seconds(),
		MeanSeconds: time.Duration(r.sumNanos.Load() / int64(n)).Seconds(),
		Samples:     n,
	}
}
