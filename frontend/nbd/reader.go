package nbd

import (
	"errors"
	"io"
	"os"

	"github.com/iser-blk/iser-blk/block"
)

// readLoop reads requests until the connection must stop reading. It returns nil for a clean end
// (DISC, EOF between requests, shutdown) and the reason otherwise.
func (c *conn) readLoop() error {
	defer c.idle()
	for {
		if c.paused() {
			c.park() // a planned restart's pause (intake.go)
			continue
		}
		r := c.takeSlot()
		if end, err := c.readHeader(r); end || err != nil {
			c.free <- r
			if errors.Is(err, errPaused) {
				continue
			}
			return err
		}
		if err := c.dispatch(r); err != nil {
			return err
		}
	}
}

// takeSlot returns a free request slot, waiting for one if need be.
func (c *conn) takeSlot() *request {
	// Replies the reader answered itself wait in the queue, and commands it submitted to the
	// device wait in the device's send queue, while more requests are already buffered: one
	// writev answers everything that arrived in one read, and one sends everything it asked of
	// the device.
	if c.br.Buffered() < requestHeaderLen {
		c.idle()
	}
	select {
	case r := <-c.free:
		return r
	default:
		c.idle() // deferred replies and submitted commands hold the slots we wait for
		return <-c.free
	}
}

// readHeader reads and decodes the next request header into r. end reports that reading stops
// (with err nil for a clean end: EOF between requests, shutdown, DISC); r is then unused, as it
// is after errPaused (end false: a pause stopped the reader before the header).
func (c *conn) readHeader(r *request) (end bool, err error) {
	c.stampRead()
	if err := c.readHeaderBytes(r.raw[:]); err != nil {
		if errors.Is(err, errPaused) {
			return false, err
		}
		if errors.Is(err, io.EOF) || c.shutting.Load() {
			return true, nil
		}
		return true, err
	}
	req, err := parseRequest(&r.raw)
	if err != nil {
		return true, err // hard disconnect: the stream is out of sync
	}
	r.header = req
	r.errno = 0
	return req.Type == cmdDisc, nil
}

// dispatch takes a request the reader has decoded: answered at once if it is invalid, served on
// the reader when the device offers a path that does not block, and otherwise queued for a
// worker. An error ends the connection (r is back in the free slots then).
func (c *conn) dispatch(r *request) error {
	v, errno := c.exp.validate(&r.header)
	if v == verdictDisconnect {
		c.free <- r
		return errors.New("nbd: WRITE payload over the maximum block size (denial of service)")
	}
	c.countBegin(r)
	if v == verdictOK && c.shutting.Load() {
		v, errno = verdictReply, eshutdown
	}
	if v == verdictReply {
		return c.answerUnserved(r, errno)
	}
	if r.Type == cmdRead && c.startRead(r) {
		return nil
	}
	if hasPayload(&r.header) {
		if err := c.receivePayload(r); err != nil {
			return err
		}
		if r.Type == cmdWrite && c.startWrite(r) {
			return nil
		}
	}
	c.inflight.Add(1)
	c.work <- r
	return nil
}

// answerUnserved answers r with errno without serving it, consuming its payload.
func (c *conn) answerUnserved(r *request, errno uint32) error {
	if hasPayload(&r.header) {
		if _, err := io.CopyN(io.Discard, requestReader{c}, int64(r.Length)); err != nil {
			c.countDropped(r)
			c.free <- r
			return c.readErr(err)
		}
	}
	r.errno = errno
	c.inflight.Add(1)
	c.deferReply(r)
	return nil
}

// startRead serves a READ on the reader goroutine from the device's memory, or starts it on the
// device's asynchronous path; false means a worker must serve it.
func (c *conn) startRead(r *request) bool {
	if c.cached != nil && c.readCached(r) {
		c.inflight.Add(1)
		c.deferReply(r)
		return true
	}
	if c.sub != nil {
		c.inflight.Add(1) // before: the completion may come before SubmitAt returns
		if c.submitRead(r) {
			return true
		}
		c.inflight.Done()
	}
	return false
}

// receivePayload reserves budget for r's payload and reads it into pool buffers.
func (c *conn) receivePayload(r *request) error {
	if err := c.reserveOnReader(r); err != nil {
		c.countDropped(r)
		c.free <- r
		return err
	}
	refill := c.br.Buffered() < int(r.Length) // the payload needs socket reads, which may bring the next header
	if err := c.readPayload(r); err != nil {
		c.releaseBufs(r)
		c.countDropped(r)
		c.free <- r
		return c.readErr(err)
	}
	c.readStale = c.readStale || refill
	return nil
}

// startWrite stores a WRITE in the device's memory on the reader goroutine, or starts it on the
// device's asynchronous path; false means a worker must serve it.
func (c *conn) startWrite(r *request) bool {
	if c.cachedW != nil && c.writeCached(r) {
		c.releaseBufs(r)
		c.inflight.Add(1)
		c.deferReply(r)
		return true
	}
	if c.sub == nil || len(r.bufs) != 1 {
		return false
	}
	var wf block.WriteFlags
	if r.Flags&cmdFlagFUA != 0 {
		wf = block.FUA
	}
	c.inflight.Add(1)
	if c.sub.SubmitAt(c.s.ioCtx, r.bufs[0], int64(r.Offset), true, wf, r) {
		return true
	}
	c.inflight.Done()
	return false
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
		if err := c.readFull(b); err != nil {
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

// readCached serves a READ from the device's memory on the reader goroutine when all of it is
// there (block.CachedReader), saving the hand-off to a worker and back. It reports false when it
// did not: then r holds the budget and buffer of its probe if keepForSubmit says so, and the
// caller must pass r to submitRead, which uses them or gives them back; otherwise r is as it was.
func (c *conn) readCached(r *request) bool {
	if int(r.Length) > c.s.seg || r.Length == 0 {
		return false // one segment only: larger reads are rarely all cached and worth a worker
	}
	n, b, ok := c.tryReadBuffer(r)
	if !ok {
		return false
	}
	r.reserved = n
	r.bufs = append(r.bufs, b)
	if c.cached.ReadCached(b, int64(r.Offset)) {
		return true
	}
	if !c.keepForSubmit(r) {
		c.releaseBufs(r)
	}
	return false
}

// keepForSubmit reports whether a READ that missed the device's memory keeps the budget and
// buffer readCached took, for submitRead to start it with: a cold 4 KiB read then takes them
// once instead of twice (issue 37's cold QD1 row). A read that submitRead would rather splice
// gives them back, as does a device without the asynchronous path.
func (c *conn) keepForSubmit(r *request) bool {
	return c.sub != nil && !c.splices(r)
}

// splices reports whether submitRead tries r's data through a pipe first (submitReadToPipe).
func (c *conn) splices(r *request) bool { return c.psub != nil && r.Length >= minSpliceRead }

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
// device's completion queues the reply (see Complete). It uses the budget and buffer readCached
// kept, or like readCached takes them only if they are free now; it reports false, with r as it
// was before readCached (nothing held), when a worker must serve r.
func (c *conn) submitRead(r *request) bool {
	if int(r.Length) > c.s.seg || r.Length == 0 {
		return false
	}
	if len(r.bufs) == 0 { // else readCached kept them (keepForSubmit)
		if c.splices(r) && c.submitReadToPipe(r) {
			return true
		}
		n, b, ok := c.tryReadBuffer(r)
		if !ok {
			return false
		}
		r.reserved = n
		r.bufs = append(r.bufs, b)
	}
	if !c.sub.SubmitAt(c.s.ioCtx, r.bufs[0], int64(r.Offset), false, 0, r) {
		c.releaseBufs(r)
		return false
	}
	return true
}

// writeCached stores a WRITE (without FUA) in the device's memory on the reader goroutine when that
// needs no waiting (block.CachedWriter), saving the hand-off to a worker and back: with a
// write-back cache the write is then complete, as WriteAt would have made it, and may be answered.
// It reports false when a worker must run the write with WriteAt (which stores it again whole).
func (c *conn) writeCached(r *request) bool {
	if r.Flags&cmdFlagFUA != 0 {
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
