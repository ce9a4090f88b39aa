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
)

// readBufferSize is the per-connection read buffer: request headers (and small payloads) are
// batched into few syscalls; payloads larger than it are read straight into pool buffers.
const readBufferSize = 64 << 10

// maxBatch bounds the replies gathered into one vectored write.
const maxBatch = 64

// request is one request slot. A connection owns MaxInflight of them; they cycle through
// free -> reader -> worker -> writer -> free, so serving a request allocates nothing.
type request struct {
	Request
	errno    uint32
	reserved int64    // bytes of the payload budget held
	bufs     [][]byte // payload segments (pool buffers): WRITE data from the socket, READ data from the device
	raw      [requestHeaderLen]byte
	hdr      [32]byte // reply header scratch
}

type conn struct {
	s   *Server
	nc  net.Conn
	br  *bufio.Reader
	exp export
	log *zap.Logger

	free chan *request // idle slots; receiving from it is the per-connection concurrency bound
	work chan *request // validated requests for the workers
	done chan *request // answered requests for the writer

	inflight sync.WaitGroup // requests handed to a worker or the writer and not yet released
	shutting atomic.Bool

	// writer-only state
	batch  []*request
	iov    [][]byte
	nb     net.Buffers
	broken bool
}

func newConn(s *Server, nc net.Conn) *conn {
	return &conn{
		s:   s,
		nc:  nc,
		br:  bufio.NewReaderSize(nc, readBufferSize),
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
	c.done = make(chan *request, n)
	c.batch = make([]*request, 0, maxBatch)
	c.iov = make([][]byte, 0, maxBatch*(2+segs))
	for range n {
		c.free <- &request{bufs: make([][]byte, 0, segs)}
	}
	var workers sync.WaitGroup
	for range n {
		workers.Add(1)
		go func() {
			defer workers.Done()
			for r := range c.work {
				c.execute(r)
				c.done <- r
			}
		}()
	}
	writerDone := make(chan struct{})
	go func() { c.writeLoop(); close(writerDone) }()

	reason := c.readLoop()
	c.inflight.Wait()
	close(c.work)
	workers.Wait()
	close(c.done)
	<-writerDone
	c.nc.Close()
	if reason != nil {
		c.log.Info("nbd connection closed", zap.Error(reason))
	} else {
		c.log.Debug("nbd client disconnected")
	}
}

// readLoop reads requests until the connection must stop reading. It returns nil for a clean end
// (DISC, EOF between requests, shutdown) and the reason otherwise.
func (c *conn) readLoop() error {
	for {
		r := <-c.free
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
			c.done <- r
			continue
		}
		if hasPayload(&r.Request) {
			if err := c.reserve(r); err != nil {
				c.free <- r
				return err
			}
			if err := c.readPayload(r); err != nil {
				c.releaseBufs(r)
				c.free <- r
				return c.readErr(err)
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
		b, err := c.s.pool.Get(c.s.ioCtx, l)
		if err != nil {
			return err
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
	for i, b := range r.bufs {
		c.s.pool.Put(b)
		r.bufs[i] = nil
	}
	r.bufs = r.bufs[:0]
	c.s.budget.release(r.reserved)
	r.reserved = 0
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

// writeLoop sends replies: it gathers whatever answered requests are ready (up to maxBatch) and
// writes them with one vectored write (writev on TCP and unix sockets), then recycles the slots.
func (c *conn) writeLoop() {
	for r := range c.done {
		c.batch = append(c.batch[:0], r)
		// Let workers that are already runnable (woken by the same backend read) post their
		// replies first, so one writev carries them all instead of one syscall each.
		runtime.Gosched()
	gather:
		for len(c.batch) < maxBatch {
			select {
			case r2, ok := <-c.done:
				if !ok {
					break gather
				}
				c.batch = append(c.batch, r2)
			default:
				break gather
			}
		}
		if !c.broken {
			iov := c.iov[:0]
			for _, r := range c.batch {
				iov = c.appendReply(iov, r)
			}
			c.nb = iov
			if _, err := c.nb.WriteTo(c.nc); err != nil {
				// The client is gone: stop the reader and keep recycling slots so the
				// connection can drain.
				c.broken = true
				c.nc.Close()
			}
			clear(iov)
		}
		for i, r := range c.batch {
			c.releaseBufs(r)
			c.batch[i] = nil
			c.inflight.Done()
			c.free <- r
		}
	}
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
