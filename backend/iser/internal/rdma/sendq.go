package rdma

import "sync"

// sendQueue hands work requests from many senders to one poster goroutine, which posts each
// batch as one chain (one doorbell). Two buffers alternate: senders append to pending while the
// poster posts the other one outside the lock.
//
// Invariant: pending and spare never share a backing array, and a batch returned by take is
// touched by nobody but the poster until it hands it back with done. Breaking it was the "lost
// response" bug over iSER (2026-11-30): take on an empty queue swapped the buffers without
// getting the empty one back, so pending and spare became the same array; the next take then
// returned that array as the batch while senders kept appending into it. Work requests were
// overwritten while ibv_post_send marshalled them: a command went out with another PDU's SGE
// count (LIO: "PDU declares 8192 data bytes but only 76 bytes were received") or not at all,
// leaving a CmdSN hole behind which LIO parks every later command, so no response ever came.
type sendQueue struct {
	mu      sync.Mutex
	pending []SendWR
	spare   []SendWR
}

func newSendQueue(capacity int) *sendQueue {
	return &sendQueue{pending: make([]SendWR, 0, capacity), spare: make([]SendWR, 0, capacity)}
}

// push queues w (senders, any goroutine).
func (q *sendQueue) push(w SendWR) {
	q.mu.Lock()
	q.pending = append(q.pending, w)
	q.mu.Unlock()
}

// take returns everything queued, in push order, or nil when nothing is (the poster only). The
// caller owns the batch until it passes it to done.
func (q *sendQueue) take() []SendWR {
	q.mu.Lock()
	defer q.mu.Unlock()
	if len(q.pending) == 0 {
		return nil // no swap: spare stays the poster's
	}
	batch := q.pending
	q.pending = q.spare[:0]
	q.spare = nil
	return batch
}

// done gives a posted batch's buffer back for reuse.
func (q *sendQueue) done(batch []SendWR) {
	q.mu.Lock()
	q.spare = batch[:0]
	q.mu.Unlock()
}
