package control

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"sync"
	"time"

	"go.uber.org/zap"
	"golang.org/x/sys/unix"

	"github.com/iser-blk/iser-blk/internal/lifecycle"
	"github.com/iser-blk/iser-blk/internal/status"
)

// Handler is what the gateway registers: the package calls it and speaks the protocol.
type Handler interface {
	// Status returns a snapshot (status.Registry.Snapshot).
	Status() status.Status
	// Detach stops the gateway's I/O, writes back dirty data, removes the device and returns
	// once the gateway may exit. It drives the lifecycle (draining → flushing → stopped) and
	// reports write-back progress through it; the server streams both to the client. A busy
	// device without req.Force is refused with Refused(...); a failed write-back returns the
	// error and leaves the gateway running (lifecycle back to ready).
	Detach(ctx context.Context, req Request) (DetachResult, error)
}

// Restarter is a Handler that also implements OpRestart (issue 17). Restart prepares a planned
// restart — stop taking requests, finish those in flight, write back every dirty byte, record a
// clean state — and returns the step that replaces the process image (re-exec, same PID), which
// the server runs once the client has its answer; that step returns only if it failed. An error
// from Restart leaves the gateway serving.
type Restarter interface {
	Restart(ctx context.Context, req Request) (reexec func() error, err error)
}

// Options configure a Server.
type Options struct {
	Log *zap.Logger
	// Lifecycle, when set, is streamed to a detach's client as progress lines.
	Lifecycle *lifecycle.Machine
	// AllowUID decides which peers may talk; nil allows uid 0 only. Tests set it.
	AllowUID func(uid uint32) bool
}

const (
	maxConns      = 16               // concurrent control connections; more get "busy"
	readTimeout   = 30 * time.Second // a client must send its request within this
	writeTimeout  = 10 * time.Second // per reply line; a stuck client loses its connection
	progressQueue = 64
	// answerWait bounds how long Close waits for a running detach's final reply: the handler
	// returns once the gateway's shutdown has its outcome, and one reply line takes at most
	// writeTimeout.
	answerWait = writeTimeout + 5*time.Second
)

// Server serves a claimed name's control socket.
type Server struct {
	claim    *Claim
	handler  Handler
	opts     Options
	listener *net.UnixListener
	slots    chan struct{}
	detachMu sync.Mutex // one detach at a time
	detached chan struct{}
	detachOK sync.Once
	// answering counts detaches from their start to their final reply (written, or failed
	// because the client hung up): Close waits for them, so a detach's client reads its answer
	// before the socket goes, and nobody waits for a client that is gone.
	answering sync.WaitGroup

	mu     sync.Mutex
	conns  map[net.Conn]struct{}
	closed bool
	wg     sync.WaitGroup
}

// Listen binds the claim's control socket (mode 0600) for h. Call Serve to answer requests.
func Listen(c *Claim, h Handler, opts Options) (*Server, error) {
	if opts.Log == nil {
		opts.Log = zap.NewNop()
	}
	if opts.AllowUID == nil {
		opts.AllowUID = func(uid uint32) bool { return uid == 0 }
	}
	path := c.SocketPath()
	l, err := net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
	if err != nil {
		return nil, fmt.Errorf("control socket: %w", err)
	}
	l.SetUnlinkOnClose(false) // Claim.Release removes it, under the lock
	// The directory is 0700, so nobody can connect between bind and chmod.
	if err := os.Chmod(path, 0o600); err != nil {
		l.Close()
		return nil, fmt.Errorf("control socket: %w", err)
	}
	return &Server{claim: c, handler: h, opts: opts, listener: l,
		slots: make(chan struct{}, maxConns), conns: map[net.Conn]struct{}{},
		detached: make(chan struct{})}, nil
}

// Serve accepts connections until Close; it returns nil after Close.
func (s *Server) Serve() error {
	for {
		conn, err := s.listener.AcceptUnix()
		if err != nil {
			s.mu.Lock()
			closed := s.closed
			s.mu.Unlock()
			if closed {
				return nil
			}
			if ne, ok := err.(net.Error); ok && ne.Timeout() {
				continue
			}
			return fmt.Errorf("control socket: %w", err)
		}
		if !s.track(conn) {
			conn.Close()
			return nil
		}
		s.wg.Add(1)
		go func() {
			defer s.wg.Done()
			defer s.untrack(conn)
			s.serveConn(conn)
		}()
	}
}

// Detached is closed once a detach has succeeded and its "done" reply was written (or could
// not be, the client having hung up). A gateway whose detach stops it need not wait for it:
// Close lets a running detach answer first.
func (s *Server) Detached() <-chan struct{} { return s.detached }

// Close stops accepting, lets a running detach write its final reply (at most answerWait),
// closes open connections and waits for their handlers.
func (s *Server) Close() error {
	s.mu.Lock()
	s.closed = true
	s.mu.Unlock()
	err := s.listener.Close()
	answered := make(chan struct{})
	go func() { s.answering.Wait(); close(answered) }()
	select {
	case <-answered:
	case <-time.After(answerWait):
		s.opts.Log.Warn("control: closing with a detach still unanswered", zap.Duration("waited", answerWait))
	}
	s.mu.Lock()
	for c := range s.conns {
		c.Close()
	}
	s.mu.Unlock()
	s.wg.Wait()
	return err
}

func (s *Server) track(c net.Conn) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return false
	}
	s.conns[c] = struct{}{}
	return true
}

func (s *Server) untrack(c net.Conn) {
	s.mu.Lock()
	delete(s.conns, c)
	s.mu.Unlock()
	c.Close()
}

// serveConn answers requests on one connection until it closes or sends something that leaves
// the stream unreadable (an oversized line).
func (s *Server) serveConn(conn *net.UnixConn) {
	w := &replyWriter{conn: conn}
	select {
	case s.slots <- struct{}{}:
		defer func() { <-s.slots }()
	default:
		w.error(&Error{Code: CodeBusy, Message: fmt.Sprintf("more than %d control connections", maxConns)})
		return
	}
	if uid, err := peerUID(conn); err != nil || !s.opts.AllowUID(uid) {
		s.opts.Log.Warn("control: peer refused", zap.Uint32("uid", uid), zap.Error(err))
		w.error(&Error{Code: CodeForbidden, Message: "only root may use the control socket"})
		return
	}
	sc := bufio.NewScanner(conn)
	sc.Buffer(make([]byte, 4096), MaxRequestBytes)
	for {
		_ = conn.SetReadDeadline(time.Now().Add(readTimeout))
		if !sc.Scan() {
			if errors.Is(sc.Err(), bufio.ErrTooLong) {
				w.error(&Error{Code: CodeTooLarge, Message: fmt.Sprintf("request longer than %d bytes", MaxRequestBytes)})
			}
			return
		}
		req, err := DecodeRequest(sc.Bytes())
		if err != nil {
			s.opts.Log.Info("control: bad request", zap.Error(err))
			w.error(err)
			continue
		}
		if !s.dispatch(w, req) {
			return
		}
	}
}

// dispatch answers one request; false ends the connection (a reply could not be written).
func (s *Server) dispatch(w *replyWriter, req Request) bool {
	switch req.Op {
	case OpStatus:
		st := s.handler.Status()
		return w.write(Reply{Type: ReplyStatus, Status: &st})
	case OpDetach:
		return s.detach(w, req)
	case OpRestart:
		return s.restart(w, req)
	case OpStop:
		return s.stop(w, req)
	}
	return w.error(&Error{Code: CodeUnknownOp, Message: req.Op}) // DecodeRequest lets none through
}

func peerUID(conn *net.UnixConn) (uint32, error) {
	raw, err := conn.SyscallConn()
	if err != nil {
		return 0, err
	}
	var cred *unix.Ucred
	var credErr error
	if err := raw.Control(func(fd uintptr) {
		cred, credErr = unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED)
	}); err != nil {
		return 0, err
	}
	if credErr != nil {
		return 0, fmt.Errorf("SO_PEERCRED: %w", credErr)
	}
	return cred.Uid, nil
}

// replyWriter writes reply lines with a deadline each. Safe for the detach's progress goroutine
// and the request goroutine together.
type replyWriter struct {
	mu     sync.Mutex
	conn   net.Conn
	failed bool
}

func (w *replyWriter) write(r Reply) bool {
	r.Version = ProtocolVersion
	line, err := encodeLine(r)
	if err != nil {
		line, _ = encodeLine(Reply{Version: ProtocolVersion, Type: ReplyError,
			Error: &Error{Code: CodeFailed, Message: "encode reply: " + err.Error()}})
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.failed {
		return false
	}
	_ = w.conn.SetWriteDeadline(time.Now().Add(writeTimeout))
	if _, err := w.conn.Write(line); err != nil {
		w.failed = true
		return false
	}
	return true
}

// error writes err as an error reply: an *Error as it is, anything else as "failed".
func (w *replyWriter) error(err error) bool {
	var ce *Error
	if !errors.As(err, &ce) {
		ce = &Error{Code: CodeFailed, Message: err.Error()}
	}
	return w.write(Reply{Type: ReplyError, Error: ce})
}
