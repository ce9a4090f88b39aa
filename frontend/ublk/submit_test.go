package ublk

import (
	"context"
	"sync"
	"testing"
	"unsafe"

	"go.uber.org/zap"

	"github.com/iser-blk/iser-blk/block"
	"github.com/iser-blk/iser-blk/frontend/ublk/uring"
	"github.com/iser-blk/iser-blk/internal/status"
)

// asyncDevice is a recDevice that also offers the ring thread's capabilities: it serves
// ReadCached from a set of cached offsets, takes WriteCached when cacheWrites is set, and starts
// SubmitAt requests that complete only when the test calls finish, as a run of batched
// completions followed by one Flush per distinct Flusher, the way the iSCSI session's reader
// delivers them.
type asyncDevice struct {
	recDevice
	cachedOffs  map[int64]bool
	cacheWrites bool
	decline     bool

	mu      sync.Mutex
	pending []pendingReq
	kicks   int
}

type pendingReq struct {
	p     []byte
	off   int64
	write bool
	flags block.WriteFlags
	done  block.Completion
}

func (d *asyncDevice) ReadCached(p []byte, off int64) bool {
	if !d.cachedOffs[off] {
		return false
	}
	copy(p, d.data[off:])
	return true
}

func (d *asyncDevice) WriteCached(p []byte, off int64) bool {
	if !d.cacheWrites {
		return false
	}
	copy(d.data[off:], p)
	return true
}

func (d *asyncDevice) SubmitAt(_ context.Context, p []byte, off int64, write bool, f block.WriteFlags, done block.Completion) bool {
	if d.decline {
		return false
	}
	d.mu.Lock()
	d.pending = append(d.pending, pendingReq{p, off, write, f, done})
	d.mu.Unlock()
	return true
}

func (d *asyncDevice) Kick() {
	d.mu.Lock()
	d.kicks++
	d.mu.Unlock()
}

// finish completes every pending request (with err), then flushes each distinct Flusher once.
func (d *asyncDevice) finish(err error) []pendingReq {
	d.mu.Lock()
	run := d.pending
	d.pending = nil
	d.mu.Unlock()
	var flush []block.Flusher
	for _, r := range run {
		if err == nil {
			if r.write {
				copy(d.data[r.off:], r.p)
			} else {
				copy(r.p, d.data[r.off:])
			}
		}
		if f := block.CompleteBatched(r.done, err); f != nil {
			flush = append(flush, f)
		}
	}
	for i, f := range flush {
		if i == 0 || f != flush[0] {
			f.Flush()
		}
	}
	return run
}

// newRingQueue is newHostQueue with a Server on dev, its ring path as Options would set it, and
// counters.
func newRingQueue(t *testing.T, dev block.Device, noRingPath bool) *queue {
	q := newHostQueue(t, 4)
	s := q.srv
	s.dev, s.reqLog, s.ioCtx = dev, zap.NewNop(), context.Background()
	s.counters = &status.IOCounters{}
	s.ring = newRingPath(dev, noRingPath)
	return q
}

// fetch plays the driver handing tag id a request, as fetched does after reading the descriptor.
func fetch(t *testing.T, q *queue, id int, opFlags, sectors uint32, start uint64) {
	t.Helper()
	tg := &q.tags[id]
	tg.opFlags, tg.nrSectors, tg.startSector = opFlags, sectors, start
	q.began(tg)
	if err := q.dispatch(tg); err != nil {
		t.Fatal(err)
	}
}

// handedToWorker reports whether tag id's worker was woken (and takes the token).
func handedToWorker(q *queue, id int) bool {
	select {
	case <-q.tags[id].work:
		return true
	default:
		return false
	}
}

// committed is the COMMIT_AND_FETCH results queued on the ring, by tag.
func committed(q *queue) map[uint16]int32 {
	out := map[uint16]int32{}
	for i := range q.ring.Pending() {
		s := q.ring.PendingSQE(i)
		if s.Opcode != uring.OpUringCmd {
			continue // the eventfd read
		}
		cmd := (*ioCmd)(unsafe.Pointer(q.ring.Cmd(s)))
		if uint32(s.Off) == ioCommitAndFetch {
			out[cmd.Tag] = cmd.Result
		}
	}
	return out
}

// TestRingPathSubmit: READs and WRITEs the device can start are started from the ring thread,
// not handed to a worker; their completions come back through done behind one eventfd write
// for the device's whole run, and each becomes a COMMIT_AND_FETCH with the byte count; the
// ring thread kicks the device once before it waits.
func TestRingPathSubmit(t *testing.T) {
	dev := &asyncDevice{recDevice: recDevice{size: 1 << 20, data: make([]byte, 1<<20)}}
	for i := range dev.data {
		dev.data[i] = byte(i / 512)
	}
	q := newRingQueue(t, dev, false)
	fetch(t, q, 0, opRead, 8, 16)
	fetch(t, q, 1, opWrite, 8, 64)
	fetch(t, q, 2, opWrite|ioFFUA, 1, 128)
	for id := range 3 {
		if handedToWorker(q, id) {
			t.Fatalf("tag %d was handed to its worker", id)
		}
	}
	if q.onRing != 3 || q.inflight != 3 {
		t.Fatalf("onRing %d inflight %d, want 3 and 3", q.onRing, q.inflight)
	}
	q.kick()
	q.kick()
	if dev.kicks != 1 {
		t.Fatalf("kicks = %d, want 1 (once per run of submissions)", dev.kicks)
	}
	run := dev.finish(nil)
	if len(run) != 3 || run[2].flags != block.FUA || !run[1].write || run[0].write {
		t.Fatalf("started requests: %+v", run)
	}
	if v := readEventfd(t, q.efd); v != 1 {
		t.Fatalf("eventfd counter after a run of 3 completions = %d, want 1", v)
	}
	q.started.Wait() // every started request counted out
	if err := q.takeCompletions(8); err != nil {
		t.Fatal(err)
	}
	if q.inflight != 0 || q.inflightBytes != 0 {
		t.Fatalf("inflight after take = %d (%d bytes)", q.inflight, q.inflightBytes)
	}
	got := committed(q)
	want := map[uint16]int32{0: 4096, 1: 4096, 2: 512}
	for id, res := range want {
		if got[id] != res {
			t.Fatalf("commits = %v, want %v", got, want)
		}
	}
	if q.tags[0].buf[0] != 16/1 || q.tags[0].buf[4095] != byte((16*512+4095)/512) {
		t.Fatalf("read data not in the tag's buffer")
	}
	if io := q.srv.counters.IOStatus(); io.InFlight != 0 || io.Ops[status.OpRead].Requests != 1 || io.Ops[status.OpWrite].Requests != 2 {
		t.Fatalf("counters: %+v", io)
	}
}

// TestRingPathCached: a READ the device holds and a WRITE it takes into memory are done on the
// ring thread and committed at once, without a worker or an eventfd wake-up; a FUA write is never
// offered to WriteCached.
func TestRingPathCached(t *testing.T) {
	dev := &asyncDevice{recDevice: recDevice{size: 1 << 20, data: make([]byte, 1<<20)},
		cachedOffs: map[int64]bool{8192: true}, cacheWrites: true, decline: true}
	dev.data[8192] = 0xAB
	q := newRingQueue(t, dev, false)
	fetch(t, q, 0, opRead, 8, 16)
	q.tags[1].buf[0] = 0xCD
	fetch(t, q, 1, opWrite, 8, 0)
	fetch(t, q, 2, opWrite|ioFFUA, 8, 0) // declined by SubmitAt: the worker's
	fetch(t, q, 3, opRead, 8, 0)         // not cached, declined: the worker's
	if handedToWorker(q, 0) || handedToWorker(q, 1) || !handedToWorker(q, 2) || !handedToWorker(q, 3) {
		t.Fatal("cached requests went to workers, or declined ones did not")
	}
	if q.inflight != 2 || q.inflightBytes != 2*4096 || q.onRing != 2 {
		t.Fatalf("inflight %d (%d bytes) onRing %d, want 2 (the workers', 8 KiB) and 2", q.inflight, q.inflightBytes, q.onRing)
	}
	if v := readEventfd(t, q.efd); v != 0 {
		t.Fatalf("a cached request woke the ring thread (%d)", v)
	}
	got := committed(q)
	if len(got) != 2 || got[0] != 4096 || got[1] != 4096 {
		t.Fatalf("commits = %v", got)
	}
	if q.tags[0].buf[0] != 0xAB || dev.data[0] != 0xCD {
		t.Fatal("cached read or write did not move the data")
	}
	if io := q.srv.counters.IOStatus(); io.InFlight != 0 || io.Ops[status.OpRead].Requests != 1 || io.Ops[status.OpWrite].Requests != 1 {
		t.Fatalf("counters (the declined two are the workers' to count): %+v", io)
	}
}

// TestRingPathFallback: with NoRingPath, for every operation other than READ and WRITE, and for
// misses once the server stops, requests go to the workers; a failed started request commits a
// negative errno.
func TestRingPathFallback(t *testing.T) {
	dev := &asyncDevice{recDevice: recDevice{size: 1 << 20, data: make([]byte, 1<<20)},
		cachedOffs: map[int64]bool{0: true}, cacheWrites: true}
	q := newRingQueue(t, dev, true)
	fetch(t, q, 0, opRead, 8, 0)
	fetch(t, q, 1, opWrite, 8, 0)
	if !handedToWorker(q, 0) || !handedToWorker(q, 1) || q.onRing != 0 {
		t.Fatal("NoRingPath: requests were served on the ring thread")
	}

	q = newRingQueue(t, dev, false)
	fetch(t, q, 0, opFlush, 0, 0)
	fetch(t, q, 1, opDiscard, 8, 0)
	fetch(t, q, 2, opWriteZeroes, 8, 0)
	fetch(t, q, 3, opRead, 0, 0) // empty: the worker's, which refuses it
	for id := range 4 {
		if !handedToWorker(q, id) {
			t.Fatalf("tag %d not handed to its worker", id)
		}
	}

	// Once the server stops, nothing new is started on the device (the drain timeout's cancel
	// reaches only the workers' requests); hits are still served on the ring.
	q = newRingQueue(t, dev, false)
	q.srv.stopping.Store(true)
	fetch(t, q, 0, opRead, 8, 0)  // cached
	fetch(t, q, 1, opRead, 8, 64) // not cached: the worker's
	if handedToWorker(q, 0) || !handedToWorker(q, 1) || len(dev.pending) != 0 {
		t.Fatalf("stopping: hit to worker %v, miss started %d", handedToWorker(q, 0), len(dev.pending))
	}

	q = newRingQueue(t, dev, false)
	dev.cachedOffs, dev.cacheWrites = nil, false
	fetch(t, q, 0, opRead, 8, 0)
	dev.finish(block.ErrMedium)
	q.started.Wait()
	if err := q.takeCompletions(8); err != nil {
		t.Fatal(err)
	}
	if got := committed(q); got[0] != -5 { // EIO
		t.Fatalf("failed read committed %v, want -EIO", got)
	}
	if io := q.srv.counters.IOStatus(); io.Ops[status.OpRead].Errors != 1 {
		t.Fatalf("failed read not counted as an error: %+v", io.Ops[status.OpRead])
	}
}

// ringRoundTrip builds a one-tag queue on a device that starts every request, and returns one
// request's ring-side round trip: dispatch, SubmitAt, the kick, the batched completion, the ring
// thread taking it, and the COMMIT_AND_FETCH submitted.
func ringRoundTrip(tb testing.TB) func() {
	dev := &asyncDevice{recDevice: recDevice{size: 1 << 20, data: make([]byte, 1<<20)}}
	dev.pending = make([]pendingReq, 0, 4)
	q := newHostQueue(tb, 1)
	q.srv.dev, q.srv.reqLog, q.srv.ioCtx = dev, zap.NewNop(), context.Background()
	q.srv.ring = newRingPath(dev, false)
	tg := &q.tags[0]
	tg.opFlags, tg.nrSectors = opRead, 8
	return func() {
		q.inflight++
		if err := q.dispatch(tg); err != nil {
			tb.Fatal(err)
		}
		q.kick()
		dev.pending = dev.pending[:0]
		if f := tg.CompleteBatched(nil); f != nil {
			f.Flush()
		}
		if err := q.takeCompletions(8); err != nil {
			tb.Fatal(err)
		}
		if _, err := q.ring.SubmitAndWait(2); err != nil {
			tb.Fatal(err)
		}
		for q.ring.PeekCQE() != nil {
			q.ring.SeenCQE()
		}
	}
}

// TestRingPathAllocatesNothing: a request served from the ring thread allocates nothing.
func TestRingPathAllocatesNothing(t *testing.T) {
	step := ringRoundTrip(t)
	step()
	if a := testing.AllocsPerRun(1000, step); a != 0 {
		t.Fatalf("%.2f allocations per request", a)
	}
}

// BenchmarkRingPathSubmit is ringRoundTrip's cost.
func BenchmarkRingPathSubmit(b *testing.B) {
	step := ringRoundTrip(b)
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		step()
	}
}

// TestRingPathConcurrent: the device completes started requests on a goroutine of its own (as
// the iSCSI session's reader does) while the ring thread goes on dispatching; every request comes
// back to the ring thread exactly once with its byte count, and the completer and the ring thread
// share nothing unguarded (the unit tier runs it under -race).
func TestRingPathConcurrent(t *testing.T) {
	const depth, total = 8, 5000
	dev := &asyncDevice{recDevice: recDevice{size: 1 << 20, data: make([]byte, 1<<20)}}
	q := newHostQueue(t, depth)
	q.srv.dev, q.srv.reqLog, q.srv.ioCtx = dev, zap.NewNop(), context.Background()
	q.srv.counters = &status.IOCounters{}
	q.srv.ring = newRingPath(dev, false)

	stop := make(chan struct{})
	completerDone := make(chan struct{})
	go func() { // the session reader
		defer close(completerDone)
		for {
			select {
			case <-stop:
				return
			default:
			}
			dev.finish(nil)
		}
	}()
	free := make([]uint16, 0, depth)
	for i := range depth {
		free = append(free, uint16(i))
	}
	committedN := 0
	for started := 0; committedN < total; {
		for len(free) > 0 && started < total {
			id := free[len(free)-1]
			free = free[:len(free)-1]
			fetch(t, q, int(id), opRead, uint32(1+started%8), uint64(started%1000))
			started++
		}
		q.kick()
		if readEventfd(t, q.efd) == 0 {
			continue
		}
		// takeCompletions' swap, without the SQEs it queues (this ring has no reader for them)
		q.mu.Lock()
		q.done, q.batch = q.batch[:0], q.done
		q.wakePending = false
		q.mu.Unlock()
		for _, c := range q.batch {
			if want := int32(q.tags[c.tag].nrSectors) << sectorShift; c.result != want {
				t.Fatalf("tag %d committed %d, want %d", c.tag, c.result, want)
			}
			q.inflight--
			free = append(free, c.tag)
			committedN++
		}
	}
	close(stop)
	<-completerDone
	q.started.Wait()
	if q.inflight != 0 || q.onRing != total || len(free) != depth {
		t.Fatalf("inflight %d, onRing %d, free tags %d", q.inflight, q.onRing, len(free))
	}
	if io := q.srv.counters.IOStatus(); io.InFlight != 0 || io.Ops[status.OpRead].Requests != total {
		t.Fatalf("counters: in flight %d, reads %d", io.InFlight, io.Ops[status.OpRead].Requests)
	}
}
