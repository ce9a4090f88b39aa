package nbd

import "sync"

// budget is a byte semaphore over payload memory. A request reserves the whole of its payload
// before taking any buffer, so requests never hold part of what they need while waiting for the
// rest: without it, many large requests each holding some pool buffers could exhaust a bounded
// pool and wait on each other forever. A reservation larger than the whole budget is clamped to
// it (it then runs alone).
type budget struct {
	mu     sync.Mutex
	cond   sync.Cond
	total  int64 // 0: unlimited
	used   int64
	closed bool
}

func newBudget(total int64) *budget {
	b := &budget{total: total}
	b.cond.L = &b.mu
	return b
}

// acquire reserves n bytes, waiting while they are not available. It returns the amount to pass to
// release, or ok=false when the budget was closed.
func (b *budget) acquire(n int64) (int64, bool) {
	if b.total == 0 {
		return 0, true
	}
	n = min(n, b.total)
	b.mu.Lock()
	for b.used+n > b.total && !b.closed {
		b.cond.Wait()
	}
	if b.closed {
		b.mu.Unlock()
		return 0, false
	}
	b.used += n
	b.mu.Unlock()
	return n, true
}

// tryAcquire is acquire without waiting: ok is false when n bytes are not available now.
func (b *budget) tryAcquire(n int64) (int64, bool) {
	if b.total == 0 {
		return 0, true
	}
	n = min(n, b.total)
	b.mu.Lock()
	if b.closed || b.used+n > b.total {
		b.mu.Unlock()
		return 0, false
	}
	b.used += n
	b.mu.Unlock()
	return n, true
}

func (b *budget) release(n int64) {
	if n == 0 {
		return
	}
	b.mu.Lock()
	b.used -= n
	b.mu.Unlock()
	b.cond.Broadcast()
}

// close wakes every waiter; later acquires fail.
func (b *budget) close() {
	b.mu.Lock()
	b.closed = true
	b.mu.Unlock()
	b.cond.Broadcast()
}
