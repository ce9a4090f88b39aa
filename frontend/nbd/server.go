// Package nbd is iser-blk's NBD frontend: a concurrent, flush-correct server for the Network Block
// Device protocol (NetworkBlockDevice/nbd doc/proto.md) over any block.Device, and the attach code
// that binds such a server to the kernel's /dev/nbdX through generic netlink (or the ioctl path).
//
// Role: the server speaks fixed newstyle negotiation (NBD_OPT_GO/INFO/LIST/ABORT/EXPORT_NAME/
// STRUCTURED_REPLY, and STARTTLS on listeners served with ServeTLS) and the transmission phase
// (READ, WRITE+FUA, FLUSH, TRIM, WRITE_ZEROES with NO_HOLE/FAST_ZERO, CACHE, DISC). It advertises
// exactly what the device's Limits say it can do: capabilities are negotiated, never assumed.
//
// Files: server.go (the Server, listeners, shutdown), listen.go (a unix or TCP listener from a
// spec), negotiate.go (the handshake), tls.go (STARTTLS), conn.go (one connection's life),
// reader.go (requests off the socket and the paths that answer them without a worker),
// execute.go (device calls), reply.go (replies onto the socket), splice.go (spliced READ
// payloads), proto.go (wire format and validation), attach_linux.go and genl.go (the kernel's
// /dev/nbdX).
//
// Invariants:
//   - Requests on one connection execute concurrently (at most Options.MaxInflight at a time) and
//     are answered out of order; replies are batched into vectored writes by whoever answers
//     (a worker, the reader, or the reply writer woken by device completions). The reader hands
//     requests to workers only when the device offers no path that does not block: reads and
//     writes the device holds in memory (block.CachedReader, block.CachedWriter) are answered on
//     the reader, and those it can start asynchronously (block.Submitter) are started there and
//     completed by the device, so the common case costs no goroutine switch per request. Steady state allocates nothing per request: request slots, header scratch and the
//     iovec array are per connection, payloads live in BufferPool buffers.
//   - A reply is sent only after the device call it reports on has returned, so a FLUSH (which calls
//     Device.Flush, covering every write acknowledged before it) covers every write whose reply the
//     client had received before sending the FLUSH, on this or any other connection. That is the
//     ordering rule of proto.md "Ordering of messages and writes", and the reason CAN_MULTI_CONN may
//     be advertised when the device says MultiConn.
//   - A malformed request that can be answered is answered (EINVAL, EPERM, ENOSPC, ...) and the
//     connection continues; one that leaves the stream out of sync (bad magic, an oversize WRITE
//     payload) ends that connection only. No input panics the server.
//   - Shutdown stops accepting, lets in-flight requests finish and their replies go out, and only
//     then closes connections; requests that arrive meanwhile get ESHUTDOWN.
//   - Under TLS every byte after the STARTTLS ACK goes through the tls.Conn: the raw-socket fast
//     paths (rawio's direct reads and writevs, spliced READ replies) see no file descriptor and
//     stay off, and bytes the client sent in the clear before the ACK end the session.
package nbd

import (
	"bufio"
	"context"
	"crypto/tls"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"go.uber.org/zap"

	"github.com/iser-blk/iser-blk/block"
	"github.com/iser-blk/iser-blk/internal/status"
)

// Options configure a Server.
type Options struct {
	// ExportName is the name of the one export (NBD_OPT_LIST shows it; the empty "default" name
	// also selects it). Default "iser-blk".
	ExportName string
	// Description is sent as NBD_INFO_DESCRIPTION when a client asks for it.
	Description string
	// Pool supplies payload buffers. Default: a heap pool (see BufferPool).
	Pool BufferPool
	// MaxInflight bounds concurrently executing requests per connection. Default 128.
	MaxInflight int
	// HandshakeTimeout bounds the negotiation phase of a connection. Default 30 s.
	HandshakeTimeout time.Duration
	// Logger receives connection-level events. Default: no logging.
	Logger *zap.Logger
	// ForceReadOnly exports the device read-only even if it is writable.
	ForceReadOnly bool
	// PayloadBudget bounds the bytes of request payloads held at once across all connections
	// (0: unlimited). With a bounded Pool set it below the pool's size, so that a request that
	// has its reservation always gets its buffers.
	PayloadBudget int64
	// Splice sends large READ payloads socket → pipe → client socket when the device offers
	// block.PipeSubmitter (see splice.go), so this process copies none of the data. Off by
	// default: against tgtd on loopback the pipes keep the target's socket pages referenced
	// until the client has read them, and the target then spent ~13 % more CPU per MiB than the
	// two copies cost us (docs/bench, session 3); it pays where the target is elsewhere.
	Splice bool
	// Counters, when set, counts every request per operation (requests, errors, bytes,
	// duration, in flight) for status and metrics; nil counts nothing (counters.go).
	Counters *status.IOCounters
}

// Server serves one block.Device as one NBD export to any number of connections.
type Server struct {
	dev    block.Device
	opts   Options
	log    *zap.Logger
	pool   BufferPool
	tflags uint16 // transmission flags, without the per-connection SEND_DF
	seg    int    // payload segment size: min(pool class, device max transfer), block aligned

	budget   *budget
	ioCtx    context.Context // device calls; cancelled only by Close (forced stop)
	ioCancel context.CancelFunc

	mu        sync.Mutex
	listeners map[net.Listener]struct{}
	conns     map[*conn]struct{}
	shutting  atomic.Bool
	wg        sync.WaitGroup // connection goroutines

	// tlsHandshake upgrades a connection after NBD_OPT_STARTTLS (tls.go); the fuzzer replaces
	// it to reach the options haggled inside TLS.
	tlsHandshake func(nc net.Conn, cfg *tls.Config) (net.Conn, error)
}

// NewServer returns a server for dev. It does not take ownership of dev: closing the device is the
// caller's job, after Shutdown.
func NewServer(dev block.Device, opts Options) (*Server, error) {
	if opts.ExportName == "" {
		opts.ExportName = "iser-blk"
	}
	if len(opts.ExportName) > maxStringLen || len(opts.Description) > maxStringLen {
		return nil, fmt.Errorf("nbd: export name or description longer than %d bytes", maxStringLen)
	}
	if opts.Pool == nil {
		opts.Pool = newHeapPool()
	}
	if opts.MaxInflight <= 0 {
		opts.MaxInflight = 128
	}
	if opts.HandshakeTimeout <= 0 {
		opts.HandshakeTimeout = 30 * time.Second
	}
	log := opts.Logger
	if log == nil {
		log = zap.NewNop()
	}
	bs := dev.BlockSize()
	if bs <= 0 || bs&(bs-1) != 0 || bs > 65536 {
		return nil, fmt.Errorf("nbd: device block size %d is not a power of two <= 64 KiB", bs)
	}
	lim := dev.Limits()
	seg := opts.Pool.MaxClass()
	if lim.MaxTransfer > 0 && lim.MaxTransfer < int64(seg) {
		seg = int(lim.MaxTransfer)
	}
	seg -= seg % bs
	if seg <= 0 {
		return nil, fmt.Errorf("nbd: buffer pool class %d or device max transfer %d below the block size %d",
			opts.Pool.MaxClass(), lim.MaxTransfer, bs)
	}
	ctx, cancel := context.WithCancel(context.Background())
	s := &Server{
		dev: dev, opts: opts, log: log, pool: opts.Pool, seg: seg,
		ioCtx: ctx, ioCancel: cancel, budget: newBudget(opts.PayloadBudget),
		listeners: map[net.Listener]struct{}{},
		conns:     map[*conn]struct{}{},

		tlsHandshake: tlsHandshake,
	}
	s.tflags = transmissionFlags(lim, opts.ForceReadOnly)
	return s, nil
}

// transmissionFlags derives the NBD transmission flags from a device's Limits. Everything is
// negotiated from what the device reports; FUA is advertised when the device honours it natively
// or can emulate it with a flush.
func transmissionFlags(lim block.Limits, forceReadOnly bool) uint16 {
	f := uint16(flagHasFlags | flagSendCache)
	ro := lim.ReadOnly || forceReadOnly
	if ro {
		f |= flagReadOnly
	}
	if lim.CanFlush {
		f |= flagSendFlush
	}
	if !ro && (lim.CanFUA || lim.CanFlush) {
		f |= flagSendFUA
	}
	if lim.Rotational {
		f |= flagRotational
	}
	if !ro && lim.CanDiscard {
		f |= flagSendTrim
	}
	if !ro && lim.CanWriteZeroes {
		f |= flagSendWriteZeroes
		if lim.CanFastZero {
			f |= flagSendFastZero
		}
	}
	if lim.MultiConn {
		f |= FlagCanMultiConn
	}
	return f
}

// Flags returns the transmission flags the server advertises (SEND_DF is added per connection
// when structured replies are negotiated). The kernel attach passes them as NBD_ATTR_SERVER_FLAGS.
func (s *Server) Flags() uint16 { return s.tflags }

// errServerClosed is returned by Serve after Shutdown.
var errServerClosed = errors.New("nbd: server closed")

// Serve accepts connections on l until Shutdown. Each connection negotiates and then serves
// requests on its own goroutines. NBD_OPT_STARTTLS is refused (see ServeTLS).
func (s *Server) Serve(l net.Listener) error { return s.serve(l, nil) }

// serve is Serve with the listener's TLS policy (nil: none).
func (s *Server) serve(l net.Listener, t *TLS) error {
	s.mu.Lock()
	if s.shutting.Load() {
		s.mu.Unlock()
		return errServerClosed
	}
	s.listeners[l] = struct{}{}
	s.mu.Unlock()
	defer func() {
		s.mu.Lock()
		delete(s.listeners, l)
		s.mu.Unlock()
	}()
	var backoff time.Duration
	for {
		nc, err := l.Accept()
		if err != nil {
			if s.shutting.Load() {
				return errServerClosed
			}
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				backoff = min(max(2*backoff, 5*time.Millisecond), time.Second)
				time.Sleep(backoff)
				continue
			}
			return fmt.Errorf("nbd: accept: %w", err)
		}
		backoff = 0
		if !s.startConn(nc, func(c *conn) { c.tls = t; c.runNegotiated() }) {
			nc.Close()
		}
	}
}

// serveTransmission serves a connection that is already in the transmission phase with the
// server's flags and simple replies: the kernel's end of an NBD socket, which never negotiates
// (the flags travel in NBD_ATTR_SERVER_FLAGS or NBD_SET_FLAGS instead). started gets the
// connection before it serves. It returns when the connection ends.
func (s *Server) serveTransmission(nc net.Conn, started func(*conn)) {
	done := make(chan struct{})
	if !s.startConn(nc, func(c *conn) {
		started(c)
		c.exp = s.export(false)
		c.transmit()
		close(done)
	}) {
		nc.Close()
		return
	}
	<-done
}

// startConn runs run on a new connection for nc on its own goroutine, unless the server is
// shutting down.
func (s *Server) startConn(nc net.Conn, run func(*conn)) bool {
	s.mu.Lock()
	if s.shutting.Load() {
		s.mu.Unlock()
		return false
	}
	c := newConn(s, nc)
	s.conns[c] = struct{}{}
	s.wg.Add(1)
	s.mu.Unlock()
	go func() {
		defer s.wg.Done()
		defer func() {
			s.mu.Lock()
			delete(s.conns, c)
			s.mu.Unlock()
		}()
		run(c)
	}()
	return true
}

func (s *Server) export(structured bool) export {
	f := s.tflags
	if structured {
		f |= flagSendDF // we never fragment a read reply: one OFFSET_DATA chunk per request
	}
	return export{size: uint64(s.dev.Size()), minBlock: uint32(s.dev.BlockSize()), tflags: f, structured: structured}
}

// Shutdown stops accepting, answers new requests with ESHUTDOWN, waits for in-flight requests to
// be answered and then closes every connection. If ctx ends first, the remaining connections are
// closed at once and device calls in flight are cancelled.
func (s *Server) Shutdown(ctx context.Context) error {
	s.mu.Lock()
	s.shutting.Store(true)
	for l := range s.listeners {
		l.Close()
	}
	for c := range s.conns {
		c.beginShutdown()
	}
	s.mu.Unlock()
	done := make(chan struct{})
	go func() { s.wg.Wait(); close(done) }()
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		s.Close()
		<-done
		return fmt.Errorf("nbd: shutdown: %w", ctx.Err())
	}
}

// Close closes every listener and connection at once and cancels device calls in flight.
func (s *Server) Close() error {
	s.mu.Lock()
	s.shutting.Store(true)
	for l := range s.listeners {
		l.Close()
	}
	for c := range s.conns {
		c.nc.Close()
		c.resumeIntake() // a paused reader goes on and meets the closed socket
	}
	s.mu.Unlock()
	s.ioCancel()
	s.budget.close()
	return nil
}

func (s *Server) nameMatches(name string) bool { return name == "" || name == s.opts.ExportName }

// sendInfo sends the NBD_REP_INFO replies of NBD_OPT_INFO/GO: always NBD_INFO_EXPORT and
// NBD_INFO_BLOCK_SIZE (the server MAY send it unasked, and our constraints are not the defaults),
// NAME and DESCRIPTION when asked for.
func (s *Server) sendInfo(bw *bufio.Writer, opt uint32, e export, req goRequest) error {
	var p [14]byte
	binary.BigEndian.PutUint16(p[0:2], infoExport)
	binary.BigEndian.PutUint64(p[2:10], e.size)
	binary.BigEndian.PutUint16(p[10:12], e.tflags)
	if err := optReply(bw, opt, repInfo, p[:12]); err != nil {
		return err
	}
	min, pref, maxb := s.blockSizes()
	binary.BigEndian.PutUint16(p[0:2], infoBlockSize)
	binary.BigEndian.PutUint32(p[2:6], min)
	binary.BigEndian.PutUint32(p[6:10], pref)
	binary.BigEndian.PutUint32(p[10:14], maxb)
	if err := optReply(bw, opt, repInfo, p[:14]); err != nil {
		return err
	}
	for _, t := range req.infos {
		var text string
		switch t {
		case infoName:
			text = s.opts.ExportName
		case infoDescription:
			if s.opts.Description == "" {
				continue
			}
			text = s.opts.Description
		default:
			continue
		}
		q := make([]byte, 2+len(text))
		binary.BigEndian.PutUint16(q, t)
		copy(q[2:], text)
		if err := optReply(bw, opt, repInfo, q); err != nil {
			return err
		}
	}
	return nil
}

// blockSizes returns the NBD_INFO_BLOCK_SIZE triple: minimum = logical block size; preferred =
// the physical block size, at least 4096 (a power of two >= max(minimum, 512) as the spec asks);
// maximum = MaxPayload (larger device requests are split into segments by the server).
func (s *Server) blockSizes() (min, pref, max uint32) {
	lim := s.dev.Limits()
	min = uint32(s.dev.BlockSize())
	pref = max32(4096, min)
	if p := lim.PhysicalBlockSize; p > pref && p&(p-1) == 0 && p <= 1<<20 {
		pref = p
	}
	max = MaxPayload
	if sz := s.dev.Size(); sz < int64(max) {
		max = uint32(sz - sz%int64(min))
		if max < min {
			max = min
		}
	}
	return min, pref, max
}

func max32(a, b uint32) uint32 {
	if a > b {
		return a
	}
	return b
}
