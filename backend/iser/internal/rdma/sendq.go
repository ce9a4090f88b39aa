package rdma

import "sync"

// sendQueue hands work requests from many senders to whichever of them posts, so that each
// batch goes out as one chain (one doorbell; on soft-RoCE one system call) in push order (the
// session's CmdSN order). There is no poster goroutine: the sender whose push finds no post in
// progress becomes the poster and posts batches until the queue is empty, while senders that
// push meanwhile return at once, their work request in the poster's next batch. A send therefore
// costs no goroutine wake-up, and under load one post still carries many work requests.
//
// Invariants:
//   - posting is true from the push that makes a sender the poster until the take that finds
//     the queue empty; both happen under mu, so a work request pushed is always either seen by
//     the running poster's next take or makes its sender the poster.
//   - pending and spare never share a backing array, and a batch returned by take is touched by
//     nobody but the poster until it hands it back with done. Breaking this was the "lost
//     response" bug over iSER (2026-11-30): take on an empty queue swapped the buffers without
//     getting the empty one back, so pending and spare became the same array; the next take then
//     returned that array as the batch while senders kept appending into it. Work requests were
//     overwritten while ibv_post_send marshalled them: a command went out with another PDU's SGE
//     count (LIO: "PDU declares 8192 data bytes but only 76 bytes were received") or not at all,
//     leaving a CmdSN hole behind which LIO parks every later command, so no response ever came.
type sendQueue struct {
	mu      sync.Mutex
	pending []SendWR
	spare   []SendWR
	posting bool
}

func newSendQueue(capacity int) *sendQueue {
	return &sendQueue{pending: make([]SendWR, 0, capacity), spare: make([]SendWR, 0, capacity)}
}

// push queues w (senders, any goroutine). It reports whether the caller is now the poster: it
// must then take and post batches until take returns nil.
func (q *sendQueue) push(w SendWR) (poster bool) {
	q.mu.Lock()
	q.pending = append(q.pending, w)
	poster = !q.posting
	q.posting = true
	q.mu.Unlock()
	return poster
}

// take returns everything queued, in push order, or nil when nothing is, which ends the
// caller's turn as the poster (the poster only). The caller owns the batch until it passes it
// to done.
func (q *sendQueue) take() []SendWR {
	q.mu.Lock()
	defer q.mu.Unlock()
	if len(q.pending) == 0 {
		q.posting = false
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
