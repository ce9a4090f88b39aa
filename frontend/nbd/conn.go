package nbd

import (
	"bufio"
	"encoding/binary"
	"errors"
	"io"
	"net"
	"os"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"go.uber.org/zap"

	"github.com/iser-blk/iser-blk/block"
	"github.com/iser-blk/iser-blk/internal/rawio"
)

// readBufferSize is the per-connection read buffer: request headers (and small payloads) are
// batched into few syscalls; payloads larger than it are read straight into pool buffers.
const readBufferSize = 64 << 10

// maxBatch bounds the replies gathered into one vectored write.
const maxBatch = 64

// request is one request slot. A connection owns MaxInflight of them; they cycle through
// free -> reader -> worker -> reply queue -> free (a read served from the device's memory, see
// block.CachedReader, skips the worker), so serving a request allocates nothing.
type request struct {
	Request
	c        *conn
	errno    uint32
	reserved int64    // bytes of the payload budget held
	bufs     [][]byte // payload segments (pool buffers): WRITE data from the socket, READ data from the device
	pipe     *spipe   // a spliced READ's data (splice.go), instead of bufs
	spliced  bool     // the pipe's payload was written to the client (the pipe is empty)
	raw      [requestHeaderLen]byte
	hdr      [32]byte // reply header scratch
}

type conn struct {
	s   *Server
	nc  net.Conn
	br  *bufio.Reader
	exp export
	log *zap.Logger

	free    chan *request      // idle slots; receiving from it is the per-connection concurrency bound
	work    chan *request      // validated requests for the workers
	cached  block.CachedReader // the device's non-blocking read path; nil if it (or the pool's TryGet) is missing
	cachedW block.CachedWriter // the device's non-blocking write path (a write-back cache); nil if none
	sub     block.Submitter    // the device's asynchronous path (the iSCSI backend); nil if none
	wake    chan struct{}      // wakes the reply writer for replies queued by device completions
	tryPool tryGetter

	// Spliced reads (splice.go): psub is the device's pipe path, nil when off. pipeMu guards
	// the free pipes and their count.
	psub    block.PipeSubmitter
	pipeMu  sync.Mutex
	pipes   []*spipe
	npipes  int
	pipeCap int
	// writer-only splice state
	splicedReads int64 // replies whose payload went out by splice (logged at the end)

	inflight sync.WaitGroup // requests handed to a worker or the reply queue and not yet released
	shutting atomic.Bool

	// Replies: whoever answers a request (a worker, or the reader) appends it to replies; if no
	// one is writing, it becomes the writer and sends the queue in vectored writes until it is
	// empty (see reply). This avoids a hand-off to a writer goroutine per request.
	replyMu sync.Mutex
	replies []*request
	writing bool

	// writer-only state (owned by whoever set writing)
	batch  []*request
	iov    [][]byte
	broken bool

	// raw carries the per-request reads (under br) and the reply writevs with raw system calls
	// (see package rawio).
	raw *rawio.Conn
}

func newConn(s *Server, nc net.Conn) *conn {
	raw := rawio.New(nc)
	return &conn{
		s:   s,
		nc:  nc,
		raw: raw,
		br:  bufio.NewReaderSize(raw, readBufferSize),
		log: s.log.With(zap.String("remote", remoteName(nc))),
	}
}

func remoteName(nc net.Conn) string {
	if a := nc.RemoteAddr(); a != nil && a.String() != "" {
		return a.Network() + ":" + a.String()
	}
	if a := nc.LocalAddr(); a != nil {
		return a.Network() + ":" + a.String()
	}
	return "?"
}

// beginShutdown makes the reader stop taking new requests (the read deadline interrupts a blocked
// read; complete requests already buffered are answered with ESHUTDOWN) and lets in-flight ones
// finish.
func (c *conn) beginShutdown() {
	c.shutting.Store(true)
	_ = c.nc.SetReadDeadline(time.Now())
}

// runNegotiated runs the handshake and then the transmission phase.
func (c *conn) runNegotiated() {
	_ = c.nc.SetDeadline(time.Now().Add(c.s.opts.HandshakeTimeout))
	bw := bufio.NewWriterSize(c.nc, 4096)
	exp, err := c.s.handshake(c.br, bw)
	if err != nil {
		if !errors.Is(err, errAbort) && !errors.Is(err, io.EOF) {
			c.log.Info("nbd negotiation ended", zap.Error(err))
		}
		c.nc.Close()
		return
	}
	_ = c.nc.SetDeadline(time.Time{})
	if c.shutting.Load() {
		_ = c.nc.SetReadDeadline(time.Now())
	}
	c.exp = exp
	c.log.Debug("nbd client entered transmission", zap.Bool("structured", exp.structured),
		zap.Uint16("flags", exp.tflags))
	c.transmit()
}

// transmit serves the transmission phase until the client disconnects, the stream breaks or the
// server shuts down, then drains in-flight requests and closes the connection.
func (c *conn) transmit() {
	n := c.s.opts.MaxInflight
	segs := MaxPayload/c.s.seg + 1
	c.free = make(chan *request, n)
	c.work = make(chan *request, n)
	if tg, ok := c.s.pool.(tryGetter); ok {
		c.tryPool = tg
		c.cached, _ = c.s.dev.(block.CachedReader)
	}
	c.cachedW, _ = c.s.dev.(block.CachedWriter)
	if c.tryPool != nil {
		c.sub, _ = c.s.dev.(block.Submitter)
	}
	c.initSplice()
	c.wake = make(chan struct{}, 1)
	c.replies = make([]*request, 0, n)
	c.batch = make([]*request, 0, n)
	c.iov = make([][]byte, 0, maxBatch*(2+segs))
	for range n {
		c.free <- &request{c: c, bufs: make([][]byte, 0, segs)}
	}
	writerDone := make(chan struct{})
	go func() {
		defer close(writerDone)
		for range c.wake {
			c.writeQueued()
		}
	}()
	var workers sync.WaitGroup
	for range n {
		workers.Add(1)
		go func() {
			defer workers.Done()
			for r := range c.work {
				c.execute(r)
				c.reply(r)
			}
		}()
	}

	reason := c.readLoop()
	c.inflight.Wait()
	close(c.work)
	workers.Wait()
	close(c.wake) // every completion that could wake the writer has been answered
	<-writerDone
	c.closePipes()
	c.nc.Close()
	if reason != nil {
		c.log.Info("nbd connection closed", zap.Error(reason), zap.Int64("spliced_reads", c.splicedReads))
	} else {
		c.log.Debug("nbd client disconnected", zap.Int64("spliced_reads", c.splicedReads))
	}
}

// readLoop reads requests until the connection must stop reading. It returns nil for a clean end
// (DISC, EOF between requests, shutdown) and the reason otherwise.
func (c *conn) readLoop() error {
	defer c.idle()
	for {
		// Replies the reader answered itself wait in the queue, and commands it submitted to
		// the device wait in the device's send queue, while more requests are already
		// buffered: one writev answers everything that arrived in one read, and one sends
		// everything it asked of the device.
		if c.br.Buffered() < requestHeaderLen {
			c.idle()
		}
		var r *request
		select {
		case r = <-c.free:
		default:
			c.idle() // deferred replies and submitted commands hold the slots we wait for
			r = <-c.free
		}
		if _, err := io.ReadFull(c.br, r.raw[:]); err != nil {
			c.free <- r
			if errors.Is(err, io.EOF) || c.shutting.Load() {
				return nil
			}
			return err
		}
		req, err := parseRequest(&r.raw)
		if err != nil {
			c.free <- r
			return err // hard disconnect: the stream is out of sync
		}
		r.Request = req
		r.errno = 0
		if req.Type == CmdDisc {
			c.free <- r
			return nil
		}
		v, errno := c.exp.validate(&r.Request)
		if v == verdictDisconnect {
			c.free <- r
			return errors.New("nbd: WRITE payload over the maximum block size (denial of service)")
		}
		if v == verdictOK && c.shutting.Load() {
			v, errno = verdictReply, ESHUTDOWN
		}
		if v == verdictReply {
			if hasPayload(&r.Request) {
				if _, err := io.CopyN(io.Discard, c.br, int64(req.Length)); err != nil {
					c.free <- r
					return c.readErr(err)
				}
			}
			r.errno = errno
			c.inflight.Add(1)
			c.deferReply(r)
			continue
		}
		if req.Type == CmdRead && c.cached != nil && c.readCached(r) {
			c.inflight.Add(1)
			c.deferReply(r)
			continue
		}
		if req.Type == CmdRead && c.sub != nil {
			c.inflight.Add(1) // before: the completion may come before SubmitAt returns
			if c.submitRead(r) {
				continue
			}
			c.inflight.Done()
		}
		if hasPayload(&r.Request) {
			if err := c.reserveOnReader(r); err != nil {
				c.free <- r
				return err
			}
			if err := c.readPayload(r); err != nil {
				c.releaseBufs(r)
				c.free <- r
				return c.readErr(err)
			}
			if req.Type == CmdWrite && c.cachedW != nil && c.writeCached(r) {
				c.releaseBufs(r)
				c.inflight.Add(1)
				c.deferReply(r)
				continue
			}
			if req.Type == CmdWrite && c.sub != nil && len(r.bufs) == 1 {
				var wf block.WriteFlags
				if r.Flags&CmdFlagFUA != 0 {
					wf = block.FUA
				}
				c.inflight.Add(1)
				if c.sub.SubmitAt(c.s.ioCtx, r.bufs[0], int64(r.Offset), true, wf, r) {
					continue
				}
				c.inflight.Done()
			}
		}
		c.inflight.Add(1)
		c.work <- r
	}
}

func (c *conn) readErr(err error) error {
	if c.shutting.Load() && errors.Is(err, os.ErrDeadlineExceeded) {
		return nil
	}
	if errors.Is(err, io.EOF) {
		return io.ErrUnexpectedEOF // the client vanished mid-payload
	}
	return err
}

// readPayload reads a WRITE payload from the socket straight into pool buffers, one per segment.
func (c *conn) readPayload(r *request) error {
	left := int(r.Length)
	for left > 0 {
		l := min(left, c.s.seg)
		var b []byte
		ok := false
		if c.tryPool != nil {
			b, ok = c.tryPool.TryGet(l)
		}
		if !ok {
			c.idle() // what we submitted and deferred may hold the memory we wait for
			var err error
			if b, err = c.s.pool.Get(c.s.ioCtx, l); err != nil {
				return err
			}
		}
		r.bufs = append(r.bufs, b)
		if _, err := io.ReadFull(c.br, b); err != nil {
			return err
		}
		left -= l
	}
	return nil
}

func (c *conn) releaseBufs(r *request) {
	if r.pipe != nil {
		// Empty only if its payload went out; otherwise (an error reply, a broken client)
		// it may hold some of the data and is closed rather than reused.
		c.putPipe(r.pipe, r.spliced)
		r.pipe, r.spliced = nil, false
	}
	for i, b := range r.bufs {
		c.s.pool.Put(b)
		r.bufs[i] = nil
	}
	r.bufs = r.bufs[:0]
	c.s.budget.release(r.reserved)
	r.reserved = 0
}

// reserveOnReader is reserve for the reader goroutine: before it waits for budget, it sends what
// it submitted and deferred, whose completion is what returns budget.
func (c *conn) reserveOnReader(r *request) error {
	if n, ok := c.s.budget.tryAcquire(int64(r.Length)); ok {
		r.reserved = n
		return nil
	}
	c.idle()
	return c.reserve(r)
}

var errBudgetClosed = errors.New("nbd: server closed while waiting for buffer memory")

// reserve takes r's whole payload from the server's payload budget (see budget).
func (c *conn) reserve(r *request) error {
	n, ok := c.s.budget.acquire(int64(r.Length))
	if !ok {
		return errBudgetClosed
	}
	r.reserved = n
	return nil
}

// execute runs one validated request against the device and records its NBD error value.
func (c *conn) execute(r *request) {
	ctx := c.s.ioCtx
	dev := c.s.dev
	off := int64(r.Offset)
	var err error
	switch r.Type {
	case CmdRead:
		if err = c.reserve(r); err != nil {
			break
		}
		left := int(r.Length)
		for left > 0 && err == nil {
			l := min(left, c.s.seg)
			var b []byte
			b, err = c.s.pool.Get(ctx, l)
			if err != nil {
				break
			}
			r.bufs = append(r.bufs, b)
			err = dev.ReadAt(ctx, b, off)
			off += int64(l)
			left -= l
		}
	case CmdWrite:
		var wf block.WriteFlags
		if r.Flags&CmdFlagFUA != 0 {
			wf = block.FUA
		}
		for _, b := range r.bufs {
			if err = dev.WriteAt(ctx, b, off, wf); err != nil {
				break
			}
			off += int64(len(b))
		}
	case CmdFlush:
		err = dev.Flush(ctx)
	case CmdTrim:
		err = c.splitRange(off, int64(r.Length), dev.Limits().MaxDiscard, func(o, l int64) error {
			return dev.Discard(ctx, o, l)
		})
		if err == nil && r.Flags&CmdFlagFUA != 0 {
			err = dev.Flush(ctx)
		}
	case CmdWriteZeroes:
		var zf block.ZeroFlags
		if r.Flags&CmdFlagNoHole != 0 {
			zf |= block.NoHole
		}
		if r.Flags&CmdFlagFastZero != 0 {
			zf |= block.FastOnly
		}
		if r.Flags&CmdFlagFUA != 0 {
			zf |= block.ZeroFUA
		}
		err = c.splitRange(off, int64(r.Length), dev.Limits().MaxWriteZeroes, func(o, l int64) error {
			return dev.WriteZeroes(ctx, o, l, zf)
		})
	case CmdCache:
		// A prefetch hint (proto.md "NBD_CMD_CACHE"): succeeding without doing anything is
		// allowed; the cache layer does its own read-ahead.
	}
	if err != nil {
		r.errno = wireErrno(err)
		if !(r.Type == CmdWriteZeroes && errors.Is(err, block.ErrNotSupported)) {
			c.log.Warn("nbd request failed", zap.Uint16("cmd", r.Type), zap.Uint64("offset", r.Offset),
				zap.Uint32("length", r.Length), zap.Error(err))
		}
	}
}

// splitRange calls fn over [off, off+length) in pieces no larger than limit (0: one piece),
// keeping every piece a multiple of the block size.
func (c *conn) splitRange(off, length, limit int64, fn func(o, l int64) error) error {
	bs := int64(c.s.dev.BlockSize())
	if limit > 0 {
		limit -= limit % bs
	}
	if limit <= 0 {
		limit = length
	}
	for length > 0 {
		l := min(length, limit)
		if err := fn(off, l); err != nil {
			return err
		}
		off += l
		length -= l
	}
	return nil
}

// readCached serves a READ from the device's memory on the reader goroutine when all of it is
// there (block.CachedReader), saving the hand-off to a worker and back. It reports false, with r
// as it was, when the caller must queue r for a worker instead.
func (c *conn) readCached(r *request) bool {
	if int(r.Length) > c.s.seg || r.Length == 0 {
		return false // one segment only: larger reads are rarely all cached and worth a worker
	}
	n, b, ok := c.tryReadBuffer(r)
	if !ok {
		return false
	}
	if !c.cached.ReadCached(b, int64(r.Offset)) {
		c.s.pool.Put(b)
		c.s.budget.release(n)
		return false
	}
	r.reserved = n
	r.bufs = append(r.bufs, b)
	return true
}

// tryReadBuffer takes, without waiting (the reader must not), the budget and then the pool buffer
// for a one-segment READ's data, in the budget's order. n is the budget held.
func (c *conn) tryReadBuffer(r *request) (n int64, b []byte, ok bool) {
	if n, ok = c.s.budget.tryAcquire(int64(r.Length)); !ok {
		return 0, nil, false
	}
	if b, ok = c.tryPool.TryGet(int(r.Length)); !ok {
		c.s.budget.release(n)
		return 0, nil, false
	}
	return n, b, true
}

// idle is called by the reader before it may block for input: it sends the replies it deferred
// and the commands it submitted to the device.
func (c *conn) idle() {
	if c.sub != nil {
		c.sub.Kick()
	}
	c.flushReplies()
}

// submitRead starts a one-segment READ on the device without a worker (block.Submitter): the
// device's completion queues the reply (see Complete). Like readCached it takes budget and buffer
// only if they are free now; it reports false, with r as it was, when a worker must serve r.
func (c *conn) submitRead(r *request) bool {
	if int(r.Length) > c.s.seg || r.Length == 0 {
		return false
	}
	if c.psub != nil && c.submitReadToPipe(r) {
		return true
	}
	n, b, ok := c.tryReadBuffer(r)
	if !ok {
		return false
	}
	r.reserved = n
	r.bufs = append(r.bufs, b)
	if !c.sub.SubmitAt(c.s.ioCtx, b, int64(r.Offset), false, 0, r) {
		c.releaseBufs(r)
		return false
	}
	return true
}

// Complete implements block.Completion for a READ or WRITE started with SubmitAt. It runs on a
// device goroutine (the iSCSI session's reader), so it only records the result and queues the
// reply; the connection's reply writer sends it, with whatever else completed meanwhile.
func (r *request) Complete(err error) {
	c := r.c
	if err != nil {
		r.errno = wireErrno(err)
		c.log.Warn("nbd request failed", zap.Uint16("cmd", r.Type), zap.Uint64("offset", r.Offset),
			zap.Uint32("length", r.Length), zap.Error(err))
	}
	if !c.enqueueReply(r) {
		return
	}
	// Never blocks: the writer role was free, so no wake is pending (only a completion that
	// takes the role sends one, and the writer goroutine gives the role back only after
	// receiving it).
	c.wake <- struct{}{}
}

// writeCached stores a WRITE (without FUA) in the device's memory on the reader goroutine when that
// needs no waiting (block.CachedWriter), saving the hand-off to a worker and back: with a
// write-back cache the write is then complete, as WriteAt would have made it, and may be answered.
// It reports false when a worker must run the write with WriteAt (which stores it again whole).
func (c *conn) writeCached(r *request) bool {
	if r.Flags&CmdFlagFUA != 0 {
		return false
	}
	off := int64(r.Offset)
	for _, b := range r.bufs {
		if !c.cachedW.WriteCached(b, off) {
			return false
		}
		off += int64(len(b))
	}
	return true
}

// enqueueReply queues r for the reply writer and reports whether the caller took the writer role
// (nobody was writing), in which case it must see the queue sent.
func (c *conn) enqueueReply(r *request) bool {
	c.replyMu.Lock()
	defer c.replyMu.Unlock()
	c.replies = append(c.replies, r)
	if c.writing {
		return false
	}
	c.writing = true
	return true
}

// reply queues the answered request r for sending. If no one is writing, the caller becomes the
// writer: it yields once so that goroutines already runnable (typically workers woken by the same
// backend read) can queue their replies too, then writes the queue in vectored writes (writev on
// TCP and unix sockets) until it is empty, recycling the slots. Otherwise it returns at once and
// the current writer sends r.
func (c *conn) reply(r *request) {
	if !c.enqueueReply(r) {
		return
	}
	runtime.Gosched()
	c.writeQueued()
}

// deferReply queues r without writing: the reader calls it and sends the queue with
// flushReplies before it next waits for input (or leaves), unless a writer picks r up first.
func (c *conn) deferReply(r *request) {
	c.replyMu.Lock()
	c.replies = append(c.replies, r)
	c.replyMu.Unlock()
}

// flushReplies sends queued replies when no writer is active to do it.
func (c *conn) flushReplies() {
	c.replyMu.Lock()
	if c.writing || len(c.replies) == 0 {
		c.replyMu.Unlock()
		return
	}
	c.writing = true
	c.replyMu.Unlock()
	c.writeQueued()
}

// writeQueued is the writer's loop: it sends the queue until it finds it empty, then gives up the
// writer role (under replyMu, so a reply queued meanwhile is either taken or sees no writer).
func (c *conn) writeQueued() {
	for {
		c.replyMu.Lock()
		if len(c.replies) == 0 {
			c.writing = false
			c.replyMu.Unlock()
			return
		}
		// Swap the queue with the (empty) batch so appends during the write do not allocate.
		c.batch, c.replies = c.replies, c.batch[:0]
		c.replyMu.Unlock()
		for start := 0; start < len(c.batch); start += maxBatch {
			c.writeReplies(c.batch[start:min(start+maxBatch, len(c.batch))])
		}
		clear(c.batch)
		c.batch = c.batch[:0]
	}
}

// writeReplies sends one batch of replies with one vectored write, then recycles the slots.
// Only the current writer calls it.
func (c *conn) writeReplies(batch []*request) {
	if !c.broken {
		iov := c.iov[:0]
		for _, r := range batch {
			iov = c.appendReply(iov, r)
			if r.pipe == nil || r.errno != 0 {
				continue
			}
			// A spliced READ: what is gathered so far, this reply's header last, goes out
			// first, then the payload from the pipe.
			if !c.writeIov(iov) {
				break
			}
			iov = c.iov[:0]
			if err := c.spliceOut(r); err != nil {
				c.log.Debug("nbd: splicing a read reply failed", zap.Error(err))
				c.breakConn()
				break
			}
			r.spliced = true
			c.splicedReads++
		}
		if !c.broken && len(iov) > 0 {
			c.writeIov(iov)
		}
	}
	for _, r := range batch {
		c.releaseBufs(r)
		c.inflight.Done()
		c.free <- r
	}
}

// writeIov writes iov in one vectored write and reports whether it succeeded.
func (c *conn) writeIov(iov [][]byte) bool {
	_, err := c.raw.Writev(iov)
	clear(iov)
	if err != nil {
		c.breakConn()
		return false
	}
	return true
}

// breakConn marks the client gone: stop the reader and keep recycling slots so the connection
// can drain.
func (c *conn) breakConn() {
	c.broken = true
	c.nc.Close()
}

// appendReply appends the reply to r to iov ("Simple reply message", "Structured reply chunk
// message"). A successful READ under structured replies is a single NBD_REPLY_TYPE_OFFSET_DATA
// chunk flagged DONE (the data is complete before the chunk is sent, so no error can follow);
// errors under structured replies are NBD_REPLY_TYPE_ERROR chunks with a message; everything else
// is a simple reply, which the spec allows for any reply without payload.
func (c *conn) appendReply(iov [][]byte, r *request) [][]byte {
	h := r.hdr[:]
	switch {
	case r.errno != 0 && c.exp.structured:
		msg := errnoBytes(r.errno)
		binary.BigEndian.PutUint32(h[0:4], magicStructured)
		binary.BigEndian.PutUint16(h[4:6], replyFlagDone)
		binary.BigEndian.PutUint16(h[6:8], replyTypeError)
		binary.BigEndian.PutUint64(h[8:16], r.Handle)
		binary.BigEndian.PutUint32(h[16:20], uint32(6+len(msg)))
		binary.BigEndian.PutUint32(h[20:24], r.errno)
		binary.BigEndian.PutUint16(h[24:26], uint16(len(msg)))
		return append(iov, h[:26], msg)
	case r.Type == CmdRead && r.errno == 0 && c.exp.structured:
		binary.BigEndian.PutUint32(h[0:4], magicStructured)
		binary.BigEndian.PutUint16(h[4:6], replyFlagDone)
		binary.BigEndian.PutUint16(h[6:8], replyTypeOffsetData)
		binary.BigEndian.PutUint64(h[8:16], r.Handle)
		binary.BigEndian.PutUint32(h[16:20], 8+r.Length)
		binary.BigEndian.PutUint64(h[20:28], r.Offset)
		iov = append(iov, h[:28])
		return append(iov, r.bufs...)
	default:
		binary.BigEndian.PutUint32(h[0:4], magicSimple)
		binary.BigEndian.PutUint32(h[4:8], r.errno)
		binary.BigEndian.PutUint64(h[8:16], r.Handle)
		iov = append(iov, h[:16])
		if r.Type == CmdRead && r.errno == 0 {
			iov = append(iov, r.bufs...)
		}
		return iov
	}
}

// Error messages as bytes, built once so the error path does not allocate.
var errnoMsgs = func() map[uint32][]byte {
	m := map[uint32][]byte{}
	for _, e := range []uint32{EPERM, EIO, ENOMEM, EINVAL, ENOSPC, EOVERFLOW, ENOTSUP, ESHUTDOWN} {
		m[e] = []byte(errnoText(e))
	}
	return m
}()

var genericErrMsg = []byte("error")

func errnoBytes(e uint32) []byte {
	if b, ok := errnoMsgs[e]; ok {
		return b
	}
	return genericErrMsg
}
