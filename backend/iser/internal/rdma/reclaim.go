package rdma

import "sync"

// Selective signalling of sends. A send work request asks for a completion only now and then
// (IBV_SEND_SIGNALED, on a QP created with sq_sig_all = 0). A QP's send queue completes its work
// requests in the order they were posted (InfiniBand Architecture Specification, vol. 1, ch. 10:
// work request ordering), so a signalled completion means every send posted before it has
// completed too, and their descriptors can be given back with it; Linux's iSER initiator long
// signalled one command send in 32 (ISER_SIGNAL_CMD_COUNT) for the same reason. Each I/O then
// costs the device one completion (its response's receive) instead of two, and the poller is
// woken for that one alone. A work request that completes in error reports whether signalled or
// not, and gives back what was posted before it; at a connection's end nobody needs the
// descriptors any more, and every sender that waits for one also waits for that end.
//
// sendReclaim keeps the descriptors posted and not yet given back, in post order, and decides
// which sends are signalled:
//   - every signalEvery-th send, so that descriptors flow back steadily under load;
//   - every send posted while fewer than signalEvery descriptors are free, so that whenever a
//     sender could wait for a descriptor, a signalled send is in flight, or queued and about to
//     be posted, whose completion gives some back. Without it an idle connection could hold
//     every descriptor in unsignalled sends that never report.
//
// Lock order: sendReclaim.mu is a leaf. The poster (one at a time, sendQueue) calls post; the
// CQ poller calls completed.
type sendReclaim struct {
	mu    sync.Mutex
	slots []int32 // ring of the descriptors posted and not given back, oldest at head
	head  int
	n     int

	every int // signal at least every this many sends
	run   int // unsignalled sends since the last signalled one (the poster's)
}

// An iSER connection's wr_id layout: the kind in the top byte, the descriptor (slot) below.
const (
	wrRecv = 1 << 56
	wrSend = 2 << 56
	wrMask = 1<<56 - 1
)

// signalEvery is how often a send is signalled while descriptors are plentiful.
const signalEvery = 16

func newSendReclaim(descriptors int) *sendReclaim {
	return &sendReclaim{slots: make([]int32, descriptors), every: min(signalEvery, max(descriptors/2, 1))}
}

// post decides which of batch's sends are signalled (free: descriptors free now) and records
// their descriptors (the low bits of the work request ID, wrMask), before the batch is posted.
func (r *sendReclaim) post(batch []SendWR, free int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for i := range batch {
		w := &batch[i]
		r.run++
		w.Signaled = r.run >= r.every || free < r.every
		if w.Signaled {
			r.run = 0
		}
		r.slots[(r.head+r.n)%len(r.slots)] = int32(w.ID & wrMask)
		r.n++
	}
}

// completed gives back, into free, the descriptor of a completed send and every one posted
// before it. A descriptor that is not outstanding (a completion for a send already given back)
// gives back nothing. free has room for every descriptor, so this never blocks.
func (r *sendReclaim) completed(slot int32, free chan<- int32) {
	r.mu.Lock()
	defer r.mu.Unlock()
	k := -1
	for i := 0; i < r.n; i++ {
		if r.slots[(r.head+i)%len(r.slots)] == slot {
			k = i
			break
		}
	}
	for i := 0; i <= k; i++ {
		free <- r.slots[r.head]
		r.head = (r.head + 1) % len(r.slots)
		r.n--
	}
}
