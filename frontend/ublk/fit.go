package ublk

import (
	"fmt"
	"math/bits"
)

// BudgetError is FitMaxIO's error for a budget that cannot hold even a 4 KiB buffer per tag.
type BudgetError struct {
	Queues, Depth int   // the geometry, defaults applied
	Budget        int64 // bytes
}

func (e *BudgetError) Error() string {
	return fmt.Sprintf("ublk: %d bytes cannot hold %d queues × depth %d request buffers of even 4 KiB", e.Budget, e.Queues, e.Depth)
}

func (e *BudgetError) Unwrap() error { return ErrBadOptions }

// FitMaxIO checks opts' queue geometry and returns the MaxIO to start with when the per-tag
// buffers may take at most budget bytes of opts.Pool: opts.MaxIO when queues × depth buffers of
// it fit, else the largest power of two that does. Every tag holds its buffer as long as the
// device exists, and a Get at the pool's bound would wait for ever. Without a Pool it only checks
// the geometry. Errors wrap ErrBadOptions; a budget that cannot hold 4 KiB per tag is a
// *BudgetError.
func FitMaxIO(opts Options, budget int64) (int, error) {
	q, d, maxIO := opts.Queues, opts.Depth, opts.MaxIO
	if q <= 0 {
		q = DefaultQueues()
	}
	if d <= 0 {
		d = DefaultDepth
	}
	if maxIO <= 0 {
		maxIO = DefaultMaxIO
	}
	if q > maxQueues || d > maxQueueDepth || maxIO > maxIOBufBytes {
		return 0, fmt.Errorf("ublk: %d queues × depth %d × %d bytes is beyond the driver's limits: %w", q, d, maxIO, ErrBadOptions)
	}
	if maxIO < pageSize {
		return 0, fmt.Errorf("ublk: a request size of %d bytes is below one page (%d): %w", maxIO, pageSize, ErrBadOptions)
	}
	if opts.Pool == nil {
		return opts.MaxIO, nil
	}
	per := budget / int64(q*d)
	buf := maxIO
	if mc, ok := opts.Pool.(interface{ MaxClass() int }); ok {
		buf = min(buf, mc.MaxClass())
	}
	if int64(pow2Ceil(buf)) <= per { // the pool's classes are powers of two
		return opts.MaxIO, nil
	}
	if per < 4096 { // before the shift below: per == 0 would shift by -1 and panic
		return 0, &BudgetError{Queues: q, Depth: d, Budget: budget}
	}
	return 1 << (bits.Len64(uint64(per)) - 1), nil
}

// pow2Ceil is the smallest power of two ≥ n (n > 0).
func pow2Ceil(n int) int { return 1 << bits.Len(uint(n-1)) }
