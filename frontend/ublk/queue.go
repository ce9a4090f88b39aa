package ublk

import (
	"encoding/binary"
	"errors"
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"go.uber.org/zap"
	"golang.org/x/sys/unix"

	"github.com/iser-blk/iser-blk/frontend/ublk/uring"
)

// wakeUserData marks the CQE of the eventfd read; FETCH/COMMIT CQEs carry their tag (< 4096).
const wakeUserData = 1 << 32

var eventOne = func() (b [8]byte) { binary.NativeEndian.PutUint64(b[:], 1); return }()

// completion is a served request's result, passed from a worker goroutine to the ring thread.
type completion struct {
	tag    uint16
	result int32
}

// tag is the per-tag state of a queue: its buffer, the request being served and its worker.
type tag struct {
	q    *queue
	id   uint16
	buf  []byte // per-tag data buffer; its address goes in every FETCH/COMMIT
	addr uint64

	// The request, copied from the descriptor by the ring thread before the worker is woken.
	opFlags     uint32
	nrSectors   uint32
	startSector uint64

	work chan struct{} // ring thread → worker: a request is ready

	start time.Time // when a request served from the ring thread began (counted only)
}

// queue is one ublk hardware queue: one io_uring on one locked OS thread (the driver requires
// every command of a queue to come from the same task, ublk_cmd.h "ubq_daemon"), plus one worker
// goroutine per tag. The ring thread calls the Device only through its non-blocking interfaces
// (submit.go): a request those cannot take goes to the tag's worker, and the ring thread goes
// back to the ring; workers and the device report results through done + the eventfd, which
// the ring keeps a READ armed on. So a slow request holds only its own tag.
type queue struct {
	srv   *Server
	id    uint16
	depth int
	log   *zap.Logger

	ring  *uring.Ring
	descs []byte // read-only mmap of the driver's ublksrv_io_desc array for this queue
	tags  []tag
	efd   int
	efdRd [8]byte // target of the armed eventfd READ
	// efdMu keeps closeWake from closing efd under a device's Flush, which may come after the
	// last started request's completion was counted (submit.go): readers write efd, closeWake
	// closes it and sets it to -1.
	efdMu sync.RWMutex

	mu          sync.Mutex
	done        []completion // filled by workers; cap depth
	batch       []completion // ring thread's swap buffer; cap depth
	wakePending bool         // an eventfd write is outstanding since the last swap

	stopping atomic.Bool
	workers  sync.WaitGroup
	started  sync.WaitGroup // requests started on the device from the ring thread, not completed
	exited   chan struct{}
	err      error // why the ring loop ended (nil after a clean stop); read after exited

	// Ring-thread-only counters.
	inflight      int   // requests handed to workers or started on the device, not committed yet
	inflightBytes int64 // the data they move (tag.dataBytes), for waitKeepsP
	dead          int   // tags the driver will not hand out again (aborted or failed)
	submitted     bool  // requests started with SubmitAt since the last kick
	// onRing and onWorkers count requests served from the ring thread (finished or started
	// there) and by workers; logged when the queue ends, so that tests and operators can see
	// which path served the queue.
	onRing, onWorkers int
}

func newQueue(s *Server, id uint16, depth int, bufs [][]byte) (*queue, error) {
	efd, err := unix.Eventfd(0, unix.EFD_CLOEXEC|unix.EFD_NONBLOCK)
	if err != nil {
		return nil, fmt.Errorf("ublk queue %d: eventfd: %w", id, err)
	}
	q := &queue{
		srv: s, id: id, depth: depth, efd: efd,
		log:    s.log.With(zap.Uint16("queue", id)),
		tags:   make([]tag, depth),
		done:   make([]completion, 0, depth),
		batch:  make([]completion, 0, depth),
		exited: make(chan struct{}),
	}
	for i := range q.tags {
		t := &q.tags[i]
		t.q, t.id, t.buf = q, uint16(i), bufs[i]
		t.addr = uint64(uintptr(unsafe.Pointer(&t.buf[0])))
		t.work = make(chan struct{}, 1)
	}
	return q, nil
}

// start runs the queue's ring thread. ready receives nil once every tag's FETCH_REQ is with the
// driver (START_DEV may then be issued), or the error that prevented it.
func (q *queue) start(ready chan<- error) {
	for i := range q.tags {
		q.workers.Add(1)
		go q.tags[i].serveLoop()
	}
	go q.run(ready)
}

func (q *queue) run(ready chan<- error) {
	// The thread stays locked until the ring is closed: if the goroutine ended while locked, Go
	// would kill the thread, and the driver treats its daemon task exiting as a dead server.
	runtime.LockOSThread()
	err := q.setup()
	ready <- err
	if err == nil {
		err = q.loop()
		// A loop that failed mid-batch may hold started commands the device has not sent;
		// send them, or started.Wait below waits for a watchdog to send or end them.
		q.kick()
	}
	// Workers are idle once inflight is 0 (or being abandoned on a fatal error); end them, then
	// drop the ring, which cancels whatever FETCH is still parked in the driver.
	for i := range q.tags {
		close(q.tags[i].work)
	}
	q.workers.Wait()
	q.started.Wait() // the device may write into a tag's buffer until it completes the request
	if q.ring != nil {
		q.ring.Close()
	}
	if q.descs != nil {
		unix.Munmap(q.descs)
	}
	runtime.UnlockOSThread()
	q.log.Info("ublk queue ended", zap.Int("served_on_ring", q.onRing), zap.Int("served_by_workers", q.onWorkers))
	q.err = err
	close(q.exited)
}

func (q *queue) setup() error {
	// At most one SQE per tag plus the eventfd read is ever unsubmitted, and at most one CQE per
	// tag plus one for the eventfd is ever outstanding.
	ring, err := uring.New(uint32(q.depth+1), uint32(2*(q.depth+1)), uring.SetupSQE128)
	if err != nil {
		return fmt.Errorf("ublk queue %d: %w", q.id, err)
	}
	q.ring = ring
	// The descriptor array of queue q lives at q * (room for UBLK_MAX_QUEUE_DEPTH descriptors)
	// and is exactly depth descriptors, page-rounded, long (ublk_ch_mmap). Read-only.
	stride := roundUp(ioDescArea, pageSize)
	size := roundUp(q.depth*sizeofIODesc, pageSize)
	q.descs, err = unix.Mmap(q.srv.charFd, int64(q.id)*int64(stride), size, unix.PROT_READ, unix.MAP_SHARED|unix.MAP_POPULATE)
	if err != nil {
		return fmt.Errorf("ublk queue %d: mmap io descriptors: %w", q.id, err)
	}
	for i := range q.tags {
		q.prepIOCmd(ioFetchReq, &q.tags[i], 0)
	}
	q.armWake()
	if _, err := q.ring.Submit(); err != nil {
		return fmt.Errorf("ublk queue %d: submit FETCH_REQ: %w", q.id, err)
	}
	// A FETCH_REQ completes only when a request arrives, which cannot happen before START_DEV;
	// a CQE now is the driver refusing the command.
	if cqe := q.ring.PeekCQE(); cqe != nil {
		return fmt.Errorf("ublk queue %d: FETCH_REQ for tag %d refused: %w", q.id, cqe.UserData, unix.Errno(-cqe.Res))
	}
	return nil
}

func roundUp(n, to int) int { return (n + to - 1) / to * to }

// sqe returns a free SQE, submitting queued ones if the SQ is full.
func (q *queue) sqe() (*uring.SQE, error) {
	for {
		if s := q.ring.GetSQE(); s != nil {
			return s, nil
		}
		if _, err := q.ring.Submit(); err != nil {
			return nil, err
		}
	}
}

// prepIOCmd queues a FETCH_REQ or COMMIT_AND_FETCH_REQ for t with result.
func (q *queue) prepIOCmd(op uint32, t *tag, result int32) error {
	_, err := q.prepIOCmdSQE(op, t, result)
	return err
}

func (q *queue) prepIOCmdSQE(op uint32, t *tag, result int32) (*uring.SQE, error) {
	s, err := q.sqe()
	if err != nil {
		return nil, err
	}
	uring.PrepUringCmd(s, q.srv.charFd, op, uint64(t.id))
	*(*ioCmd)(unsafe.Pointer(q.ring.Cmd(s))) = ioCmd{QID: q.id, Tag: t.id, Result: result, Addr: t.addr}
	return s, nil
}

func (q *queue) armWake() error {
	s, err := q.sqe()
	if err != nil {
		return err
	}
	uring.PrepRead(s, q.efd, q.efdRd[:], -1, wakeUserData)
	return nil
}

// wake makes the ring thread look at done and stopping. A failed write can only be EAGAIN (the
// counter is saturated), which already guarantees a wake-up.
func (q *queue) wake() {
	q.efdMu.RLock()
	if q.efd >= 0 {
		_, _ = unix.Write(q.efd, eventOne[:])
	}
	q.efdMu.RUnlock()
}

// closeWake closes the eventfd once the queue has exited.
func (q *queue) closeWake() {
	q.efdMu.Lock()
	unix.Close(q.efd)
	q.efd = -1
	q.efdMu.Unlock()
}

// complete hands a worker's result to the ring thread. It allocates nothing.
func (q *queue) complete(id uint16, result int32) {
	if q.enqueueDone(id, result) {
		q.wake()
	}
}

// enqueueDone adds a result to done and reports whether the caller must wake the ring thread
// (no wake-up was pending).
func (q *queue) enqueueDone(id uint16, result int32) bool {
	q.mu.Lock()
	q.done = append(q.done, completion{tag: id, result: result})
	wake := !q.wakePending
	q.wakePending = true
	q.mu.Unlock()
	return wake
}

// stop asks the ring thread to exit once no request is in service.
func (q *queue) stop() {
	q.stopping.Store(true)
	q.wake()
}

// When the ring thread waits, it hands its P (the right to run Go code; the gateway has one on
// small hosts) to the goroutines it waits for, unless many small requests are in flight
// (waitKeepsP). Handing it off lets the iSCSI reader take a response or an R2T the moment it
// arrives instead of a sysmon tick later (uring/enter.go). Measured side by side in the 2-vCPU
// guest: 1 MiB writes over TCP 0.42× → 0.57× of the kernel initiator, 4 KiB QD1 p50 over iSER
// 2.73× → 2.55×. But each hand-off costs thread switches: handing off at 4 KiB QD32 too made the
// reader wake per response instead of per batch, CPU per I/O over TCP 1.02× → 1.18×; so there
// the ring thread keeps its P, and the responses are taken in batches as before
// (docs/bench/findings-20261206-session31-wait-handoff.md).
const (
	keepPMinInflight = 4        // more requests than this in flight, ...
	keepPMaxAvgBytes = 64 << 10 // ... of less than this on average, keep the P
)

// began and ended count t's request in flight from its fetch to its commit, and the data it
// moves: a DISCARD or WRITE_ZEROES names a range but moves nothing, and counting its length
// would make a queue of small requests look like a 1 MiB stream to waitKeepsP.
func (q *queue) began(t *tag) {
	q.inflight++
	q.inflightBytes += t.dataBytes()
}

func (q *queue) ended(t *tag) {
	q.inflight--
	q.inflightBytes -= t.dataBytes()
}

// dataBytes is how much data t's request moves through its buffer: its length for a READ or a
// WRITE, 0 for the others. The descriptor is the tag's own copy, unchanged until the commit, so
// began and ended see the same value.
func (t *tag) dataBytes() int64 {
	if r := t.request(); r.transfers() {
		return r.len
	}
	return 0
}

// waitKeepsP reports whether the ring thread's next wait keeps its P: many small requests in
// flight, whose completions come in batches anyway (keepPMinInflight).
func (q *queue) waitKeepsP() bool {
	return q.inflight > keepPMinInflight && q.inflightBytes < int64(q.inflight)*keepPMaxAvgBytes
}

// errQueueAborted is returned when the driver aborted every tag without us stopping (the device
// was stopped or deleted by someone else, or the driver gave up on us).
var errQueueAborted = errors.New("the driver aborted every request slot of the queue")

func (q *queue) loop() error {
	for {
		if q.stopping.Load() && q.inflight == 0 {
			_, err := q.ring.Submit() // hand over the last commits
			return err
		}
		if q.dead == q.depth && q.inflight == 0 {
			if _, err := q.ring.Submit(); err != nil {
				return err
			}
			if q.stopping.Load() || q.srv.stopping.Load() {
				return nil // STOP_DEV aborted the parked FETCHes, as it does
			}
			return errQueueAborted
		}
		q.kick()
		q.ring.SetWaitKeepsP(q.waitKeepsP())
		if _, err := q.ring.SubmitAndWait(1); err != nil {
			return fmt.Errorf("ublk queue %d: %w", q.id, err)
		}
		for cqe := q.ring.PeekCQE(); cqe != nil; cqe = q.ring.PeekCQE() {
			ud, res := cqe.UserData, cqe.Res
			q.ring.SeenCQE()
			var err error
			if ud == wakeUserData {
				err = q.takeCompletions(res)
			} else {
				err = q.fetched(ud, res)
			}
			if err != nil {
				return fmt.Errorf("ublk queue %d: %w", q.id, err)
			}
		}
	}
}

// takeCompletions commits every finished request and re-arms the eventfd read.
func (q *queue) takeCompletions(res int32) error {
	if res < 0 && res != -int32(unix.EAGAIN) && res != -int32(unix.EINTR) {
		return fmt.Errorf("eventfd read: %w", unix.Errno(-res))
	}
	q.mu.Lock()
	q.done, q.batch = q.batch[:0], q.done
	q.wakePending = false
	q.mu.Unlock()
	for _, c := range q.batch {
		q.ended(&q.tags[c.tag])
		if err := q.prepIOCmd(ioCommitAndFetch, &q.tags[c.tag], c.result); err != nil {
			return err
		}
	}
	return q.armWake()
}

// fetched handles the CQE of a FETCH_REQ / COMMIT_AND_FETCH_REQ: a new request for the tag, or
// the driver telling us the tag is finished.
func (q *queue) fetched(ud uint64, res int32) error {
	if ud >= uint64(q.depth) {
		return fmt.Errorf("CQE for unknown tag %d (res %d)", ud, res)
	}
	t := &q.tags[ud]
	switch {
	case res == ioResOK:
		d := (*ioDesc)(unsafe.Pointer(&q.descs[int(ud)*sizeofIODesc]))
		t.opFlags, t.nrSectors, t.startSector = d.OpFlags, d.NrSectors, d.StartSector
		q.began(t)
		return q.dispatch(t)
	case res == ioResAbort:
		q.dead++
	default:
		// NEED_GET_DATA was not requested; any other result is a refused command. The tag is
		// lost (the driver will fail the device's requests on it when the device stops).
		q.dead++
		q.log.Error("ublk refused an io command", zap.Uint64("tag", ud), zap.Int32("res", res),
			zap.String("errno", unix.Errno(-res).Error()))
	}
	return nil
}

// dispatch serves a fetched request from the ring thread if the device can take it without
// waiting (submit.go), else hands it to the tag's worker.
func (q *queue) dispatch(t *tag) error {
	served, err := q.serveOnRing(t)
	if served {
		q.onRing++
		return err
	}
	q.onWorkers++
	t.work <- struct{}{} // never blocks: the worker of an idle tag is waiting
	return nil
}

// serveLoop is a tag's worker: it serves one request at a time, as the ring thread hands them
// over, and reports the result.
func (t *tag) serveLoop() {
	defer t.q.workers.Done()
	for range t.work {
		t.q.complete(t.id, t.q.srv.serveCounted(t))
	}
}
