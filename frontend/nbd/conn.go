package nbd

import (
	"bufio"
	"errors"
	"io"
	"net"
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

// replySocketBuffer is the send buffer asked for the client's socket (SO_SNDBUF; Linux doubles
// it, net.core.wmem_max caps it). With the default (208 KiB on a unix socket) a 1 MiB READ reply
// went out in ~10 writevs, each after the writer parked for the client to drain the socket:
// 1M seqread QD8 through the iSCSI backend took 7.3 context switches and 10.7 writevs per I/O,
// with this 2.0 and 1.2, and ~25% less gateway CPU per I/O. The bytes it holds are replies
// already sent, whose pool buffers are free again.
const replySocketBuffer = 2 << 20

// request is one request slot. A connection owns MaxInflight of them; they cycle through
// free -> reader -> worker -> reply queue -> free (a read served from the device's memory, see
// block.CachedReader, skips the worker), so serving a request allocates nothing.
type request struct {
	header
	c        *conn
	errno    uint32
	reserved int64     // bytes of the payload budget held
	bufs     [][]byte  // payload segments (pool buffers): WRITE data from the socket, READ data from the device
	pipe     *spipe    // a spliced READ's data (splice.go), instead of bufs
	spliced  bool      // the pipe's payload was written to the client (the pipe is empty)
	started  time.Time // when the reader read it from the socket, for Options.Counters (counters.go)
	raw      [requestHeaderLen]byte
	hdr      [32]byte // reply header scratch
}

type conn struct {
	s   *Server
	nc  net.Conn // the accepted socket: Close, deadlines and the peer's address act on it
	br  *bufio.Reader
	exp export
	log *zap.Logger

	// stream carries the NBD bytes: nc, or after NBD_OPT_STARTTLS the tls.Conn over it (tls.go).
	// tls is the listener's TLS policy (nil: none); tlsw batches reply writes into TLS records.
	stream net.Conn
	tls    *TLS
	tlsw   *bufio.Writer

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
	// writer-only counter, logged at the end: replies whose payload went out by splice
	splicedReads int64

	inflight sync.WaitGroup // requests handed to a worker or the reply queue and not yet released
	shutting atomic.Bool
	intake   intake        // a planned restart's pause of the reader (intake.go)
	ended    chan struct{} // closed when transmit returns: the transmission phase is over

	// Replies: whoever answers a request (a worker, or the reader) appends it to replies; if no
	// one is writing, it becomes the writer and sends the queue in vectored writes until it is
	// empty (see reply). This avoids a hand-off to a writer goroutine per request. A device's
	// completion cannot write (it must not block): the first of a run takes the writer role and
	// the run's Flush hands it to the reply writer goroutine, one wake-up per run (see Flush).
	replyMu sync.Mutex
	replies []*request
	writing bool

	// reader-only: when the reader last read requests from the socket, for Options.Counters;
	// readStale: that read is over, the next counted request reads the clock (counters.go)
	readAt    time.Time
	readStale bool

	// writer-only state (owned by whoever set writing): batch holds the replies taken from the
	// queue, iov the current vectored write
	batch  []*request
	iov    [][]byte
	broken bool

	// raw carries the per-request reads (under br) and the reply writevs with raw system calls
	// (see package rawio).
	raw *rawio.Conn
}

func newConn(s *Server, nc net.Conn) *conn {
	if wb, ok := nc.(interface{ SetWriteBuffer(int) error }); ok {
		_ = wb.SetWriteBuffer(replySocketBuffer)
	}
	raw := rawio.New(nc)
	c := &conn{
		s:      s,
		nc:     nc,
		stream: nc,
		raw:    raw,
		br:     bufio.NewReaderSize(raw, readBufferSize),
		log:    s.log.With(zap.String("remote", remoteName(nc))),
		ended:  make(chan struct{}),
	}
	return c
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
	c.resumeIntake() // a paused reader goes on, into the shutdown
}

// runNegotiated runs the handshake and then the transmission phase.
func (c *conn) runNegotiated() {
	_ = c.nc.SetDeadline(time.Now().Add(c.s.opts.HandshakeTimeout))
	exp, err := c.negotiate()
	if err != nil {
		var te *tlsHandshakeError
		switch {
		case errors.As(err, &te):
			c.log.Warn("nbd TLS handshake failed", zap.Error(te.err))
		case !errors.Is(err, errAbort) && !errors.Is(err, io.EOF):
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
	defer close(c.ended)
	c.inflight.Wait()
	close(c.work)
	workers.Wait()
	close(c.wake) // every completion that could wake the writer has been answered
	<-writerDone
	c.closePipes()
	c.closeStream()
	counts := []zap.Field{zap.Int64("spliced_reads", c.splicedReads)}
	if reason != nil {
		c.log.Info("nbd connection closed", append(counts, zap.Error(reason))...)
	} else {
		c.log.Debug("nbd client disconnected", counts...)
	}
}
