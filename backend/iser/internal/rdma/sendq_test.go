package rdma

import (
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
)

// TestSendQueueEmptyTakeKeepsBuffersApart replays the sequence behind the iSER lost-response
// stall: a kick that finds the queue already drained (take returns nothing), then a batch taken
// while a sender queues more. The batch must not change under the poster.
func TestSendQueueEmptyTakeKeepsBuffersApart(t *testing.T) {
	wr := func(id uint64) SendWR { return SendWR{ID: id, NSGE: int(id % 3)} }
	q := newSendQueue(4)
	q.push(wr(1))
	b := q.take()
	if len(b) != 1 || b[0].ID != 1 {
		t.Fatalf("first batch %+v", b)
	}
	q.done(b)
	if b := q.take(); b != nil {
		t.Fatalf("take on an empty queue returned %+v", b)
	}
	q.push(wr(2))
	q.push(wr(3))
	b = q.take()
	want := []SendWR{wr(2), wr(3)}
	q.push(wr(4)) // a sender while the poster posts b
	q.push(wr(5))
	if !slices.Equal(b, want) {
		t.Fatalf("batch changed while it was being posted: %+v, want %+v", b, want)
	}
	q.done(b)
	if b := q.take(); !slices.Equal(b, []SendWR{wr(4), wr(5)}) {
		t.Fatalf("third batch %+v", b)
	}
}

// TestSendQueueOnePoster: the first push makes its sender the poster, pushes during its turn do
// not, and the take that finds the queue empty ends the turn, so the next push starts one.
func TestSendQueueOnePoster(t *testing.T) {
	q := newSendQueue(4)
	if !q.push(SendWR{ID: 1}) {
		t.Fatal("the first push did not make its sender the poster")
	}
	if q.push(SendWR{ID: 2}) {
		t.Fatal("a push during a poster's turn made a second poster")
	}
	b := q.take()
	if len(b) != 2 {
		t.Fatalf("batch %+v, want both work requests", b)
	}
	if q.push(SendWR{ID: 3}) {
		t.Fatal("a push while the poster posts a batch made a second poster")
	}
	q.done(b)
	if b := q.take(); len(b) != 1 || b[0].ID != 3 {
		t.Fatalf("the poster's next batch %+v, want the work request pushed meanwhile", b)
	} else {
		q.done(b)
	}
	if b := q.take(); b != nil {
		t.Fatalf("take on an empty queue returned %+v", b)
	}
	if !q.push(SendWR{ID: 4}) {
		t.Fatal("the push after the turn ended did not start a new one: its work request would never be posted")
	}
}

// TestSendQueueConcurrent: many senders, each posting when its push makes it the poster, holding
// each batch a while as ibv_post_send would and checking it did not change meanwhile. There is
// never more than one poster, every work request comes out exactly once and each sender's in
// order. Run with -race.
func TestSendQueueConcurrent(t *testing.T) {
	const senders, each = 8, 2000
	q := newSendQueue(senders)
	var (
		wg      sync.WaitGroup
		mu      sync.Mutex // guards ids
		ids     []uint64
		posters atomic.Int32
	)
	post := func() {
		for b := q.take(); b != nil; b = q.take() {
			// Counted while a batch is held, not over the whole call: the turn ends inside the
			// take that returns nil, after which another sender may rightly become the poster
			// before this call returns.
			if n := posters.Add(1); n != 1 {
				t.Errorf("%d posters at once", n)
			}
			snap := slices.Clone(b)
			for range 3 {
				runtime.Gosched() // senders run while the batch is "being posted"
			}
			if !slices.Equal(b, snap) {
				t.Errorf("batch changed while held: %+v, was %+v", b, snap)
			}
			mu.Lock()
			for _, w := range b {
				ids = append(ids, w.ID)
			}
			mu.Unlock()
			posters.Add(-1)
			q.done(b)
		}
	}
	for s := range senders {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range each {
				if q.push(SendWR{ID: uint64(s)<<32 | uint64(i), NSGE: 1 + i%2}) {
					post()
				}
			}
		}()
	}
	wg.Wait()
	if len(ids) != senders*each {
		t.Fatalf("%d work requests came out, %d went in", len(ids), senders*each)
	}
	next := make([]uint64, senders)
	for _, id := range ids {
		s, i := id>>32, id&(1<<32-1)
		if i != next[s] {
			t.Fatalf("sender %d: work request %d came out when %d was due (lost, repeated or reordered)", s, i, next[s])
		}
		next[s]++
	}
}

// TestSendQueueNoAllocs: queueing and posting a batch allocates nothing once the two buffers
// exist (they are sized for every send slot of the connection).
func TestSendQueueNoAllocs(t *testing.T) {
	q := newSendQueue(8)
	allocs := testing.AllocsPerRun(1000, func() {
		for i := range 8 {
			q.push(SendWR{ID: uint64(i)})
		}
		if b := q.take(); len(b) == 8 {
			q.done(b)
		}
		_ = q.take() // a kick that finds nothing
	})
	if allocs != 0 {
		t.Fatalf("push/take/done allocate %.1f times per batch", allocs)
	}
}
