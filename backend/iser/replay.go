package iser

// Replay order: commands that a connection loss failed are re-issued in the order they arrived
// at the device (libiscsi's behaviour, and what a client that issued them in sequence expects),
// one at a time: the oldest first, each after the previous one has completed. Commands arriving
// while replays are pending wait behind them, so nothing overtakes an older unacknowledged
// command. Replays only happen after an outage; the steady state costs one atomic load.

import (
	"context"
	"slices"
	"sync"
	"sync/atomic"
)

type replayQueue struct {
	n    atomic.Int32 // len(seqs), read lock-free on the hot path
	mu   sync.Mutex
	seqs []uint64      // arrival numbers of commands waiting to be re-issued, ascending
	wake chan struct{} // closed (and replaced) whenever seqs changes
}

func (q *replayQueue) broadcastLocked() {
	if q.wake != nil {
		close(q.wake)
		q.wake = nil
	}
	q.n.Store(int32(len(q.seqs)))
}

func (q *replayQueue) add(seq uint64) {
	q.mu.Lock()
	i, found := slices.BinarySearch(q.seqs, seq)
	if !found {
		q.seqs = slices.Insert(q.seqs, i, seq)
	}
	q.broadcastLocked()
	q.mu.Unlock()
}

func (q *replayQueue) remove(seq uint64) {
	q.mu.Lock()
	if i, found := slices.BinarySearch(q.seqs, seq); found {
		q.seqs = slices.Delete(q.seqs, i, i+1)
	}
	q.broadcastLocked()
	q.mu.Unlock()
}

// wait blocks until ready() holds (checked under the lock) or ctx ends.
func (q *replayQueue) wait(ctx context.Context, done <-chan struct{}, ready func() bool) error {
	for {
		q.mu.Lock()
		if ready() {
			q.mu.Unlock()
			return nil
		}
		if q.wake == nil {
			q.wake = make(chan struct{})
		}
		ch := q.wake
		q.mu.Unlock()
		select {
		case <-ch:
		case <-ctx.Done():
			return ctx.Err()
		case <-done:
			return nil // the device is closing: let the caller see ErrClosed
		}
	}
}

// waitTurn returns when seq is the oldest pending replay.
func (q *replayQueue) waitTurn(ctx context.Context, done <-chan struct{}, seq uint64) error {
	return q.wait(ctx, done, func() bool { return len(q.seqs) == 0 || q.seqs[0] >= seq })
}

// waitEmpty returns when no replay is pending (new commands do not overtake replays).
func (q *replayQueue) waitEmpty(ctx context.Context, done <-chan struct{}) error {
	return q.wait(ctx, done, func() bool { return len(q.seqs) == 0 })
}
