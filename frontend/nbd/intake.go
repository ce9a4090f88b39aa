package nbd

// Intake: a connection's reader can be paused at a request boundary, with nothing of the next
// request read from the socket, and resumed. A planned restart pauses every connection of a
// kernel device, waits for the requests already read to be answered, and passes the sockets to
// the next image of the process (Attachment.ExecSockets): whatever the kernel sent meanwhile is
// still in the socket, whole requests only, for the next image to read. Before this the old
// image closed its sockets, and the requests the kernel had sent on them waited for the kernel's
// request timer (30 s by default) to be requeued (drivers/block/nbd.c, nbd_xmit_timeout).
//
// How the reader stops at a boundary without reading ahead: while pausing, every read from the
// socket asks for exactly the bytes the current request still needs (exactReader), never
// bufio's whole buffer, so once the buffered bytes are served the reader is between requests
// with nothing read. A reader blocked waiting for a header is woken by a read deadline; a
// deadline that lands in the middle of a request (the reader moved on from the header wait as
// the deadline was set) is cleared and the read goes on.

import (
	"errors"
	"io"
	"os"
	"sync"
	"sync/atomic"
	"time"
)

// intake is a connection's pause state. pausing and waiting are a Dekker pair: the pauser stores
// pausing and then loads waiting, the reader stores waiting and then loads pausing, so at least
// one of them sees the other (Go's atomics are sequentially consistent) and a reader blocked on a
// header is always woken.
type intake struct {
	pausing atomic.Bool
	waiting atomic.Bool // the reader waits for a header with nothing buffered

	mu     sync.Mutex    // guards parked and resume
	parked chan struct{} // closed by the reader once it stopped at a boundary
	resume chan struct{} // closed by resumeIntake (or a shutdown) to let it go on
}

// errPaused is readHeader's report that the reader stopped at a boundary for a pause.
var errPaused = errors.New("nbd: intake paused")

// pauseIntake asks the reader to stop at the next request boundary; the returned channel closes
// once it has and every request it read has been answered. Only for a kernel device's
// connections: while pausing the reader reads the socket itself, which a TLS stream must not.
func (c *conn) pauseIntake() <-chan struct{} {
	in := &c.intake
	in.mu.Lock()
	if in.parked == nil {
		in.parked, in.resume = make(chan struct{}), make(chan struct{})
	}
	parked := in.parked
	in.pausing.Store(true) // under mu: a resume in between would leave it set with no one parked
	in.mu.Unlock()
	if in.waiting.Load() {
		_ = c.nc.SetReadDeadline(time.Now())
	}
	return parked
}

// resumeIntake lets a paused reader go on (a no-op when none was paused). A shutdown calls it
// too, so that a parked reader sees the shutdown.
func (c *conn) resumeIntake() {
	in := &c.intake
	in.mu.Lock()
	defer in.mu.Unlock()
	if in.parked == nil {
		return
	}
	in.pausing.Store(false)
	c.clearPauseDeadline() // one the pause set that no read took
	close(in.resume)
	in.parked, in.resume = nil, nil
}

// park stops the reader at a boundary until resumeIntake. It sends what it deferred and waits
// for every request it read to be answered before it reports parked: the reader is the only one
// to add to inflight, so its own Wait cannot race an Add.
func (c *conn) park() {
	c.idle()
	c.inflight.Wait()
	in := &c.intake
	in.mu.Lock()
	parked, resume := in.parked, in.resume
	in.mu.Unlock()
	if parked == nil {
		return // resumed meanwhile
	}
	close(parked)
	<-resume
}

// paused reports whether the reader should stop here: pausing, and nothing of the next request
// buffered.
func (c *conn) paused() bool {
	return c.intake.pausing.Load() && c.br.Buffered() == 0 && !c.shutting.Load()
}

// readHeaderBytes reads a request header into raw. With nothing buffered it announces the wait
// (intake.waiting) so that a pause can wake it; a pause that woke it before any byte arrived is
// errPaused. A pause's deadline that landed after the first byte is cleared and the header read on.
func (c *conn) readHeaderBytes(raw []byte) error {
	if c.br.Buffered() > 0 {
		return c.readFull(raw)
	}
	in := &c.intake
	in.waiting.Store(true)
	if in.pausing.Load() && !c.shutting.Load() {
		in.waiting.Store(false)
		return errPaused
	}
	n, err := io.ReadFull(c.source(), raw)
	in.waiting.Store(false)
	if err == nil || !c.deadlineWoke(err) {
		return err
	}
	if n == 0 {
		if in.pausing.Load() {
			return errPaused
		}
		return c.readHeaderBytes(raw) // a pause that was resumed before its deadline was seen
	}
	if err := c.readFull(raw[n:]); err != nil {
		if errors.Is(err, io.EOF) {
			return io.ErrUnexpectedEOF // not between requests: part of a header was read
		}
		return err
	}
	return nil
}

// readFull reads all of p from the connection, riding out a pause's deadline: a pause never
// cuts a request in half.
func (c *conn) readFull(p []byte) error {
	_, err := io.ReadFull(requestReader{c}, p)
	return err
}

// requestReader reads the bytes of the request being read (a header's rest, a payload): from
// the connection's source, riding out a pause's deadline.
type requestReader struct{ c *conn }

func (r requestReader) Read(p []byte) (int, error) {
	for {
		n, err := r.c.source().Read(p)
		if err == nil || !r.c.deadlineWoke(err) {
			return n, err
		}
		if n > 0 {
			return n, nil
		}
	}
}

// deadlineWoke reports whether err is a read deadline that was not a shutdown's, clearing it so
// that the read can go on. In the transmission phase only a pause and a shutdown set read
// deadlines, and a pause's may be seen after the pause was resumed: it is cleared all the same,
// never taken for the end of the connection.
func (c *conn) deadlineWoke(err error) bool {
	if !errors.Is(err, os.ErrDeadlineExceeded) || c.shutting.Load() {
		return false
	}
	return c.clearPauseDeadline()
}

// clearPauseDeadline clears the read deadline unless a shutdown set it, and reports whether it
// did. A shutdown that begins meanwhile gets its deadline back: it stores shutting before it
// sets the deadline, so either its deadline comes after the clear or shutting is seen after it.
func (c *conn) clearPauseDeadline() bool {
	if c.shutting.Load() {
		return false
	}
	_ = c.nc.SetReadDeadline(time.Time{})
	if c.shutting.Load() {
		_ = c.nc.SetReadDeadline(time.Now())
		return false
	}
	return true
}

// source is what request bytes are read from: the buffered reader, or while pausing
// exactReader, which never reads past what the caller asks for.
func (c *conn) source() io.Reader {
	if c.intake.pausing.Load() {
		return exactReader{c}
	}
	return c.br
}

// exactReader reads what is buffered first and then the socket, asking it for no more than p.
type exactReader struct{ c *conn }

func (e exactReader) Read(p []byte) (int, error) {
	if n := e.c.br.Buffered(); n > 0 {
		return e.c.br.Read(p[:min(len(p), n)])
	}
	return e.c.raw.Read(p)
}
